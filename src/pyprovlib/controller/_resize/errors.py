"""The resize controller's errors: options out of range, and how a failure is told in a
claim's status, its events and the logs (scrubbed of secrets). The retry-later error is the
controllers' one :class:`~pyprovlib.controller._errors.DelayRetryError`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyprovlib._errors import InvalidOptionsError
from pyprovlib._redaction import scrub_text
from pyprovlib.controller._errors import describe_error
from pyprovlib.kube._errors import ApiException, api_error_text

__all__ = ["InvalidResizeOptionsError", "api_error_as_failure", "error_text"]


class InvalidResizeOptionsError(InvalidOptionsError):
    """A :class:`~pyprovlib.ResizeControllerOptions` field is out of range."""


def error_text(err: BaseException) -> str:
    """The one line a failure gets in a claim's status, an event or a log."""
    # the resizer scrubs every message it writes to a claim or an event
    return scrub_text(describe_error(err))


@contextlib.contextmanager
def api_error_as_failure(failure: str) -> Iterator[None]:
    """An API error in the block fails the sync with ``failure`` and why (retried with
    backoff)."""
    try:
        yield
    except ApiException as err:
        raise RuntimeError(f"{failure}: {api_error_text(err)}") from None
