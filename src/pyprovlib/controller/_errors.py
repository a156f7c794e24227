"""Exceptions user code did not mean to raise: a bug in a Provisioner, Qualifier,
DeletionGuard, Attacher or Resizer (``ZeroDivisionError``, ``KeyError``, ...).

The contract's own errors (``ProvisioningError``, ``IgnoredError``, ``AttachError``,
``ResizeError``), timeouts, I/O errors (``OSError``) and the errors of pyprovlib and the
libraries it drives are expected: they are reported as before, by their message. Anything else
is a bug: it is logged once, at error, with its type and traceback, and the text that reaches
events and statuses names the type (``ZeroDivisionError: division by zero``, ``KeyError:
'storage'``), since the bare message rarely says what went wrong. Secrets are scrubbed from
the traceback like from any log line, and callers that know secret values mask those too.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from pyprovlib.attacher import AttachError
from pyprovlib.errors import PyprovlibError
from pyprovlib.provisioner import IgnoredError, ProvisioningError
from pyprovlib.redaction import scrub_text
from pyprovlib.resizer import ResizeError

__all__ = ["DelayRetryError", "describe_user_error", "is_user_bug", "log_user_bug"]


class DelayRetryError(PyprovlibError):
    """A sync that must be retried after ``delay`` seconds, not with the usual backoff
    (upstream's ``DelayRetryError``, for infeasible expansions and modifications)."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


_EXPECTED: tuple[type[BaseException], ...] = (
    ProvisioningError,
    IgnoredError,
    AttachError,
    ResizeError,
    TimeoutError,
    OSError,
)
# Errors raised by pyprovlib itself or the libraries it calls for the user (API calls, gRPC).
_LIBRARIES = ("pyprovlib.", "kubernetes_asyncio.", "grpclib.", "aiohttp.", "betterproto2.")


def is_user_bug(err: BaseException) -> bool:
    """Whether ``err`` is not one of the errors user code raises on purpose (see the module
    documentation)."""
    if isinstance(err, _EXPECTED):
        return False
    return not f"{type(err).__module__}.".startswith(_LIBRARIES)


def describe_user_error(err: BaseException) -> str:
    """``Type: message`` (just ``Type`` when the message is empty)."""
    text = str(err)
    name = type(err).__name__
    return f"{name}: {text}" if text else name


def log_user_bug(
    logger: Any,
    event: str,
    err: BaseException,
    *,
    mask: Callable[[str], str] = scrub_text,
    **context: Any,
) -> None:
    """Log ``err`` at error with its type and its traceback (masked with ``mask``), as
    structlog renders an ``exception``: one record per failure."""
    kind = type(err)
    qualified = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else (f"{kind.__module__}.{kind.__qualname__}")
    )
    logger.error(
        event,
        error=mask(describe_user_error(err)),
        error_type=qualified,
        exception=mask("".join(traceback.format_exception(err)).rstrip("\n")),
        **context,
    )
