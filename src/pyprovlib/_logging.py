"""pyprovlib's loggers: structlog loggers whose records always end in stdlib ``logging``.

A library must not decide where its records go. Every pyprovlib logger wraps the stdlib
logger of the same name, so with nothing configured Python's defaults apply (warnings and
errors to stderr, nothing at debug, nothing to stdout), and an application routes, filters
and formats pyprovlib's records with ``logging`` like any other library's. Importing this
module configures nothing.

The stdlib logger's level is checked first, so a disabled debug call costs no rendering. The
processors are then structlog's configured ones when the application (or
:func:`pyprovlib.runtime.configure_logging`) configured structlog; otherwise a small
chain that hands stdlib one ``event key=value`` line. ``structlog.testing.capture_logs`` sees
every event, whatever the level, as it does for structlog's own loggers.
A failure while processing a record costs that record's details, never the caller: the
code that logs is often on the path of an answer.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

import structlog
import structlog.testing
from structlog.typing import EventDict

from pyprovlib._redaction import redact

__all__ = ["get_logger"]

_LEVEL_OF = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}

_render = structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True)


def _default_chain(logger: logging.Logger, method: str, event_dict: EventDict) -> Any:
    """The records of an application that did not configure structlog: one plain line for
    stdlib, secrets masked, exceptions passed on as ``exc_info``."""
    event_dict = structlog.contextvars.merge_contextvars(logger, method, event_dict)
    exc_info = event_dict.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    event_dict = redact(logger, method, event_dict)
    kwargs: dict[str, Any] = {"exc_info": exc_info} if exc_info else {}
    return (_render(logger, method, event_dict),), kwargs


def _dispatch(logger: logging.Logger, method: str, event_dict: EventDict) -> Any:
    try:
        if structlog.is_configured():
            processors = structlog.get_config()["processors"]
            # structlog.testing.capture_logs sees every event, as with structlog's own loggers;
            # otherwise stdlib's level decides before any processing.
            capturing = any(isinstance(p, structlog.testing.LogCapture) for p in processors)
            if not capturing and not logger.isEnabledFor(_LEVEL_OF.get(method, logging.INFO)):
                raise structlog.DropEvent
            result: Any = event_dict
            for processor in processors:
                result = processor(logger, method, result)
            return result
        if not logger.isEnabledFor(_LEVEL_OF.get(method, logging.INFO)):
            raise structlog.DropEvent
        return _default_chain(logger, method, event_dict)
    except Exception as exc:  # structlog.DropEvent is not an Exception: it passes
        event = event_dict.get("event", "") if isinstance(event_dict, dict) else ""
        return f"{event} (log record not renderable: {type(exc).__name__})"


def _capturing() -> bool:
    """Whether ``structlog.testing.capture_logs`` is active (it sees every level)."""
    return structlog.is_configured() and any(
        isinstance(p, structlog.testing.LogCapture) for p in structlog.get_config()["processors"]
    )


class _LevelCheckingLogger(structlog.stdlib.BoundLogger):
    """A stdlib-backed BoundLogger whose ``debug`` and ``info`` return before building the
    event when stdlib's level drops them: a dropped line then costs a level check, not a
    structlog record (issue 19 measured ~10-20 µs each, three per CSI call)."""

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if not self.isEnabledFor(logging.DEBUG) and not _capturing():
            return None
        return super().debug(event, *args, **kw)

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if not self.isEnabledFor(logging.INFO) and not _capturing():
            return None
        return super().info(event, *args, **kw)


def get_logger(name: str | None = None, **initial: Any) -> Any:
    """A structlog logger on the stdlib logger ``name`` (the root logger when None), with
    ``initial`` context bound. Its methods are those of ``structlog.stdlib.BoundLogger``
    (typed ``Any``: call sites annotate it with the structlog protocol they use)."""
    logger: Any = structlog.wrap_logger(
        logging.getLogger(name),
        processors=[_dispatch],
        wrapper_class=_LevelCheckingLogger,
        **initial,
    )
    return logger


def log_quietly(logger: Any, level: str, event: str, /, **kw: Any) -> None:
    """``logger.<level>(event, **kw)`` that cannot raise: for log lines on the path of an
    answer (a CSI call and its response), where a failing log line must not change or lose
    the answer. A failure is reported once on the stdlib logger ``pyprovlib.logging``."""
    try:
        getattr(logger, level)(event, **kw)
    except Exception as exc:
        with contextlib.suppress(Exception):  # nothing is left to report it with
            logging.getLogger("pyprovlib.logging").warning(
                "log line %r not written: %s", event, type(exc).__name__
            )
