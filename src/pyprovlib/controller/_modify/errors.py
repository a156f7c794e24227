"""The modify controller's errors: options out of range, a claim whose volume the cache does
not show yet, and how a failure is told in a claim's status, its events and the logs (scrubbed
of secrets). The retry-later error is the controllers' one
:class:`~pyprovlib.controller._errors.DelayRetryError`."""

from __future__ import annotations

from pyprovlib._errors import InvalidOptionsError, PyprovlibError
from pyprovlib._modifier import ModifyError
from pyprovlib._redaction import scrub_text
from pyprovlib.controller._errors import describe_user_error, is_user_bug
from pyprovlib.kube._errors import ApiException, api_error_text

__all__ = ["InvalidModifyOptionsError", "VolumeNotCachedError", "error_text"]


class InvalidModifyOptionsError(InvalidOptionsError):
    """A :class:`~pyprovlib.ModifyControllerOptions` field is out of range."""


class VolumeNotCachedError(PyprovlibError):
    """The claim's volume is not in the cache (yet): retried with backoff, as upstream."""


def error_text(err: BaseException) -> str:
    """The one line a failure gets in a claim's status, an event or a log."""
    if isinstance(err, ModifyError):
        return scrub_text(err.message)
    if isinstance(err, ApiException):
        return api_error_text(err)
    if is_user_bug(err):
        return scrub_text(describe_user_error(err))
    return scrub_text(str(err) or type(err).__name__)
