"""Process-wide logging: structlog configured once, JSON lines or console output, stdlib
logging routed through the same pipeline, per-operation bound context and secret redaction.

pyprovlib's own loggers (:func:`get_logger`) always end in stdlib ``logging``: until a program
configures something, nothing is written to stdout and nothing at debug (Python's default:
warnings and errors on stderr). :func:`configure_logging` is what a program — the ``python -m``
entry points — calls once; it sets pyprovlib's level and the level of the noisy third-party
loggers (:data:`NOISY_LOGGERS`) separately.

Every record — from structlog loggers and from stdlib loggers such as ``kubernetes_asyncio``,
``grpclib``, ``aiohttp`` and ``asyncio`` — goes through one handler on the root logger, whose
last processor before rendering is :func:`redact`. Redaction is the last line of defence: code
should still avoid logging secrets, but a secret that slips through does not reach the output.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, ExcInfo, Processor, WrappedLogger

from pyprovlib._logging import get_logger as _library_logger
from pyprovlib._redaction import REDACTED, is_secret_key, redact, redact_value, scrub_text

__all__ = [
    "NOISY_LOGGERS",
    "REDACTED",
    "bind",
    "bound",
    "configure_logging",
    "get_logger",
    "is_secret_key",
    "redact",
    "redact_value",
    "scrub_text",
    "unbind",
]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _redacted_exception_formatter(sio: TextIO, exc_info: ExcInfo) -> None:
    buf = io.StringIO()
    structlog.dev.plain_traceback(buf, exc_info)
    sio.write(scrub_text(buf.getvalue()))


# ---------------------------------------------------------------------------------------------
# Configuration

NOISY_LOGGERS = ("h2", "hpack", "aiohttp")
"""Third-party loggers whose debug output is their protocol internals (thousands of lines a
second); :func:`configure_logging` sets their level apart from pyprovlib's."""

_FIRST_KEYS = ("timestamp", "level", "logger", "event")


def _order_keys(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    # Fixed leading keys make JSON lines easy to scan and to grep.
    ordered: EventDict = {k: event_dict.pop(k) for k in _FIRST_KEYS if k in event_dict}
    ordered.update(event_dict)
    return ordered


def _drop_formatter_attributes(
    _logger: WrappedLogger, _method: str, event_dict: EventDict
) -> EventDict:
    # Other handlers' formatters (pytest's, an embedding app's) store these on the record,
    # where ExtraAdder would mistake them for extras; logging forbids them as real extras.
    event_dict.pop("message", None)
    event_dict.pop("asctime", None)
    return event_dict


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler this module installs, recognisable so a reconfiguration replaces it."""

    def handleError(self, record: logging.LogRecord) -> None:
        # stdlib's version prints the record and the whole exception chain it was logged
        # during (a user's exception text included) unscrubbed: one scrubbed line instead.
        if not logging.raiseExceptions:
            return
        err = sys.exc_info()[1]
        with contextlib.suppress(Exception):
            sys.__stderr__.write(  # type: ignore[union-attr]
                f"--- Logging error --- record of {record.name} not written: "
                f"{type(err).__name__}: {scrub_text(str(err))}\n"
            )


_installed: _Handler | None = None


def _resolve_format(fmt: str, stream: TextIO) -> str:
    fmt = fmt.lower()
    if fmt == "auto":
        isatty = getattr(stream, "isatty", None)
        try:
            return "console" if callable(isatty) and isatty() else "json"
        except ValueError:  # closed stream
            return "json"
    if fmt not in ("json", "console"):
        raise ValueError(f"log format must be auto, json or console, got {fmt!r}")
    return fmt


def configure_logging(
    format: str = "auto",  # mirrors --log-format
    level: str = "info",
    stream: TextIO | None = None,
    *,
    third_party_level: str = "warning",
) -> None:
    """Configure structlog and stdlib logging for the whole process: what a program (the
    ``python -m`` entry points) calls once; a library user who configures ``logging``
    themselves need not call it.

    ``format``: ``json`` (one object per line: ``timestamp`` ISO-8601 UTC, ``level``,
    ``logger``, ``event``, then bound context), ``console`` (structlog's ConsoleRenderer) or
    ``auto`` (console when ``stream`` is a terminal, else json). ``level``: ``debug``,
    ``info``, ``warning`` or ``error``, for pyprovlib's loggers and the program's own.
    ``third_party_level``: the level of :data:`NOISY_LOGGERS` (h2, hpack, aiohttp), whose
    debug output would drown everything else. ``stream`` defaults to ``sys.stderr`` (as
    klog does), looked up at call time. Calling again replaces the previous configuration.
    """
    global _installed  # noqa: PLW0603 - logging configuration is process-wide by nature
    for name, value in (("log level", level), ("third-party log level", third_party_level)):
        if value.lower() not in _LEVELS:
            raise ValueError(f"{name} must be one of {', '.join(_LEVELS)}, got {value!r}")
    out: TextIO = stream if stream is not None else sys.stderr
    fmt = _resolve_format(format, out)

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Processor
    final: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if fmt == "json":
        final += [structlog.processors.format_exc_info, redact, _order_keys]
        renderer = structlog.processors.JSONRenderer()
    else:
        final += [redact]
        isatty = getattr(out, "isatty", None)
        renderer = structlog.dev.ConsoleRenderer(
            colors=bool(callable(isatty) and isatty()),
            exception_formatter=_redacted_exception_formatter,
        )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), _drop_formatter_attributes],
        processors=[*final, renderer],
    )

    handler = _Handler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(_LEVELS[level.lower()])
    logging.getLogger("pyprovlib").setLevel(_LEVELS[level.lower()])
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(_LEVELS[third_party_level.lower()])
    _installed = handler

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            # Before the record exists: any handler, and stdlib's own "Logging error" dump of
            # a record it could not write, only ever sees the masked event.
            redact,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: loggers made at import time must follow a later reconfiguration.
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None, **initial: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger on the stdlib logger ``name``, with ``initial`` context bound.

    What pyprovlib's own modules use: its records always end in stdlib ``logging``, so
    without any configuration nothing is printed at debug or to stdout, and an application
    decides with ``logging`` what it sees."""
    logger: structlog.stdlib.BoundLogger = _library_logger(name, **initial)
    return logger


def bind(**kv: Any) -> Mapping[str, Any]:
    """Bind context to every log line of the current task (and tasks it creates afterwards),
    e.g. ``bind(claim="ns/name")``. Returns tokens; prefer :func:`bound` for a scope."""
    return structlog.contextvars.bind_contextvars(**kv)


def unbind(*keys: str) -> None:
    """Remove keys bound with :func:`bind` from the current context."""
    structlog.contextvars.unbind_contextvars(*keys)


@contextmanager
def bound(**kv: Any) -> Iterator[None]:
    """Bind context for the duration of a ``with`` block, restoring the previous values after
    (``with bound(claim=key, driver=name): ...``)."""
    with structlog.contextvars.bound_contextvars(**kv):
        yield
