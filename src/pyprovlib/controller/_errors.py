"""Exceptions user code did not mean to raise: a bug in a Provisioner, Qualifier,
DeletionGuard, Attacher or Resizer (``ZeroDivisionError``, ``KeyError``, ...).

The contract's own errors (``ProvisioningError``, ``IgnoredError``, ``AttachError``,
``ResizeError``), timeouts, I/O errors (``OSError``) and the errors of pyprovlib and the
libraries it drives are expected: they are reported as before, by their message. Anything else
is a bug: it is logged once, at error, with its type and traceback, and the text that reaches
events and statuses names the type (``ZeroDivisionError: division by zero``, ``KeyError:
'storage'``), since the bare message rarely says what went wrong. Secrets are scrubbed from
the traceback like from any log line, and callers that know secret values mask those too.

Which errors are expected is decided by type: the contract's errors, and the exception roots
of pyprovlib (:class:`~pyprovlib.PyprovlibError`) and of the libraries it drives for
the user (kubernetes-asyncio's ``OpenApiException`` and ``ConfigException``, aiohttp's
``ClientError``, grpclib's ``GRPCError``, ``ProtocolError`` and ``StreamTerminatedError``).
:func:`describe_error` is the one description of a failure for events, statuses and logs.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import aiohttp
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from kubernetes_asyncio.client.exceptions import OpenApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from pyprovlib._attacher import AttachError
from pyprovlib._errors import PyprovlibError
from pyprovlib._provisioner import IgnoredError, ProvisioningError
from pyprovlib._redaction import scrub_text
from pyprovlib._resizer import ResizeError
from pyprovlib.kube._errors import ApiException, api_error_text

__all__ = [
    "DelayRetryError",
    "describe_error",
    "describe_user_error",
    "is_user_bug",
    "log_user_bug",
]


class DelayRetryError(PyprovlibError):
    """A sync that must be retried after ``delay`` seconds, not with the usual backoff
    (upstream's ``DelayRetryError``): a claim waiting out an infeasible provisioning error,
    an infeasible expansion or modification. The one retry-later error of the controllers."""

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
# The roots of the errors pyprovlib itself and the libraries it calls for the user raise (API
# calls, kubeconfig, HTTP, gRPC; betterproto2 raises only built-in errors).
_LIBRARIES: tuple[type[BaseException], ...] = (
    PyprovlibError,
    OpenApiException,
    ConfigException,
    aiohttp.ClientError,
    GRPCError,
    ProtocolError,
    StreamTerminatedError,
)


def is_user_bug(err: BaseException) -> bool:
    """Whether ``err`` is not one of the errors user code raises on purpose (see the module
    documentation)."""
    return not isinstance(err, _EXPECTED + _LIBRARIES)


def describe_error(err: BaseException) -> str:
    """One line for an event, a status or a log: an API error's ``Status`` message, a user
    bug's ``Type: message`` (the bare message rarely says what went wrong; scrubbed of
    recognisable secrets, since user code may quote anything), any other error's text (its
    type when the text is empty)."""
    if isinstance(err, ApiException):
        return api_error_text(err)
    if is_user_bug(err):
        return scrub_text(describe_user_error(err))
    return str(err) or type(err).__name__


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
