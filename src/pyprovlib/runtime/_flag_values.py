"""The value syntax of Go's ``flag`` package and the Kubernetes CSI sidecars, for pyprovlib's
flags and environment variables: booleans as ``strconv.ParseBool`` reads them, durations as
``time.ParseDuration`` does (``15s``, ``1m30s``, ``500ms``), ``host:port`` listen addresses
(``:8080``, ``[::1]:9090``), decimal integers, optionally bounded below, and rates.

Errors raise :class:`argparse.ArgumentTypeError`, so argparse reports them against the flag.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

__all__ = [
    "HttpAddress",
    "format_duration",
    "parse_bool",
    "parse_duration",
    "parse_http_address",
    "parse_int",
    "parse_non_negative_int",
    "parse_positive_int",
    "parse_qps",
]

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """Parse a boolean the way Go's ``strconv.ParseBool`` (and so Go's ``flag``) does.

    Accepts ``1 t T TRUE true True`` and ``0 f F FALSE false False``; anything else raises
    :class:`argparse.ArgumentTypeError`.
    """
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}: use true or false")


def parse_int(text: str) -> int:
    """Parse a decimal integer; anything else raises :class:`argparse.ArgumentTypeError`."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def parse_positive_int(text: str) -> int:
    """Parse an integer of at least 1 (a worker count, say)."""
    value = parse_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_non_negative_int(text: str) -> int:
    """Parse an integer of at least 0 (a burst, a page size where 0 means no limit)."""
    value = parse_int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def parse_qps(text: str) -> float:
    """Parse a rate in queries per second (Go's ``float64`` flag: ``5``, ``0.5``, ``inf``);
    NaN is refused, as no limiter can use it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError("must be a number, got NaN")
    return value


_DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # Go accepts both micro signs
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# Longer units first so "ms" is not read as "m" followed by garbage.
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration string (``300ms``, ``15s``, ``1m30s``, ``1.5h``) into seconds.

    The grammar is Go's ``time.ParseDuration``: one or more decimal numbers each followed by a
    unit (``ns``, ``us``, ``ms``, ``s``, ``m``, ``h``); a bare ``0`` is allowed. Negative
    durations are rejected because no flag here can use one. Errors raise
    :class:`argparse.ArgumentTypeError` so argparse reports them against the flag.
    """
    s = text.strip()
    if s.startswith("+"):
        s = s[1:]
    if s.startswith("-"):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must not be negative")
    if s == "0":
        return 0.0
    if not s:
        raise argparse.ArgumentTypeError("invalid duration '': expected e.g. 15s, 1m30s, 500ms")
    total = 0.0
    pos = 0
    while pos < len(s):
        match = _DURATION_PART.match(s, pos)
        if match is None:
            hint = " (missing unit)" if re.fullmatch(r"[\d.]+", s) else ""
            raise argparse.ArgumentTypeError(
                f"invalid duration {text!r}{hint}: expected e.g. 15s, 1m30s, 500ms, 1h"
            )
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return total


def format_duration(seconds: float) -> str:
    """Render seconds the way Go's ``time.Duration.String`` does: ``15s``, ``1m30s``, ``500ms``,
    ``1h0m0s``."""
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
            if seconds >= scale:
                return f"{sign}{_trim(seconds / scale)}{unit}"
        return f"{sign}{_trim(seconds / 1e-9)}ns"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{int(hours)}h{int(minutes)}m{_trim(secs)}s"
    if minutes:
        return f"{sign}{int(minutes)}m{_trim(secs)}s"
    return f"{sign}{_trim(secs)}s"


def _trim(value: float) -> str:
    return f"{round(value, 9):.9f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class HttpAddress:
    """A parsed ``host:port`` listen address. ``host`` is ``None`` for all interfaces
    (``:8080``)."""

    host: str | None
    port: int

    def __str__(self) -> str:
        if self.host is None:
            return f":{self.port}"
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def parse_http_address(text: str) -> HttpAddress:
    """Parse a Go-style TCP listen address: ``:8080``, ``0.0.0.0:8080``, ``127.0.0.1:0``,
    ``[::1]:9090``, ``localhost:8080``. Port 0 picks a free port."""
    s = text.strip()
    host: str
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or s[end + 1 : end + 2] != ":":
            raise argparse.ArgumentTypeError(f"invalid address {text!r}: expected [host]:port")
        host, port_text = s[1:end], s[end + 2 :]
    else:
        host, sep, port_text = s.rpartition(":")
        if not sep:
            raise argparse.ArgumentTypeError(
                f"invalid address {text!r}: expected host:port or :port (e.g. :8080)"
            )
        if ":" in host:
            raise argparse.ArgumentTypeError(
                f"invalid address {text!r}: IPv6 hosts need brackets, e.g. [::1]:8080"
            )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: port must be 0-65535")
    return HttpAddress(host=host or None, port=int(port_text))
