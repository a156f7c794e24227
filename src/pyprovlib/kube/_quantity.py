"""Kubernetes ``resource.Quantity``: parse, compare and format quantities such as ``10Gi``,
``1500m`` or ``1e3`` with exact integer arithmetic (no floats), the way apimachinery does.

A quantity is held as a whole number of nano-units, since apimachinery rounds anything finer
than ``1n`` up (away from zero) when parsing. :meth:`Quantity.value` rounds up to a whole unit
like Go's ``Quantity.Value()``; :func:`parse_storage_size` adds the checks a volume size needs
(not negative, fits in an int64) so hostile claims fail with a message instead of a crash.

Deliberate limits beyond apimachinery: the number may have at most :data:`MAX_DIGITS` digits
and a decimal exponent at most :data:`MAX_EXPONENT` in magnitude, so a crafted string cannot
make the controller build a gigantic integer. Real quantities are nowhere near either bound.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Final

__all__ = [
    "INT64_MAX",
    "MAX_DIGITS",
    "MAX_EXPONENT",
    "Format",
    "Quantity",
    "parse_quantity",
    "parse_storage_size",
    "quantity_or_none",
]

INT64_MAX: Final = 2**63 - 1
"""The largest value Go's ``Quantity.Value()`` can return; larger sizes cannot be represented
by Kubernetes components that read them as int64."""

MAX_DIGITS: Final = 60
"""Most digits (integer and fraction together) accepted in the number part."""

MAX_EXPONENT: Final = 60
"""Largest magnitude accepted for a decimal exponent (``1e60``, ``1e-60``)."""

_NANO: Final = 10**9

_BINARY: Final[dict[str, int]] = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
}
_DECIMAL: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_BY_EXP: Final[dict[int, str]] = {e: s for s, e in _DECIMAL.items()}


class Format(enum.Enum):
    """How a quantity is written back: the family of the suffix it was parsed with."""

    DECIMAL_SI = "DecimalSI"
    """``k``, ``M``, ``G`` ... and ``m``, ``u``, ``n``."""
    BINARY_SI = "BinarySI"
    """``Ki``, ``Mi``, ``Gi`` ... (powers of 1024)."""
    DECIMAL_EXPONENT = "DecimalExponent"
    """``1e3``, ``5E-3``."""


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact quantity: ``nanos`` nano-units, written back in ``format``.

    Equality and ordering compare amounts only (``1Ki == 1024``), as ``Quantity.Cmp`` does.
    """

    nanos: int
    format: Format = Format.DECIMAL_SI

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse ``text``; raises ``ValueError`` naming it when it is not a valid quantity."""
        return parse_quantity(text)

    @classmethod
    def from_int(cls, value: int, fmt: Format = Format.BINARY_SI) -> Quantity:
        """A quantity of ``value`` whole units (bytes, for storage)."""
        return cls(value * _NANO, fmt)

    def value(self) -> int:
        """Whole units, rounded up away from zero (Go's ``Value()``)."""
        q, r = divmod(abs(self.nanos), _NANO)
        magnitude = q + (1 if r else 0)
        return -magnitude if self.nanos < 0 else magnitude

    def milli_value(self) -> int:
        """Thousandths of a unit, rounded up away from zero (Go's ``MilliValue()``)."""
        q, r = divmod(abs(self.nanos), 10**6)
        magnitude = q + (1 if r else 0)
        return -magnitude if self.nanos < 0 else magnitude

    def is_zero(self) -> bool:
        """True for a zero amount."""
        return self.nanos == 0

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.nanos > 0) - (self.nanos < 0)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.nanos + other.nanos, self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.nanos - other.nanos, self.format)

    def __neg__(self) -> Quantity:
        return Quantity(-self.nanos, self.format)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.nanos == other.nanos

    def __lt__(self, other: Quantity) -> bool:
        return self.nanos < other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __str__(self) -> str:
        return self.canonical()

    def canonical(self) -> str:
        """The canonical string apimachinery would serialise: no fraction, no lost precision,
        the largest suffix possible (``1.5Gi`` → ``1536Mi``, ``0.5`` → ``500m``)."""
        if self.nanos == 0:
            return "0"
        fmt = self.format
        if fmt is Format.BINARY_SI:
            # apimachinery falls back to decimal for small or fractional binary amounts.
            if abs(self.nanos) < 1024 * _NANO or self.nanos % _NANO:
                fmt = Format.DECIMAL_SI
            else:
                units = self.nanos // _NANO
                suffix = ""
                for name in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
                    if units % _BINARY[name] == 0:
                        units //= _BINARY[name]
                        suffix = name
                        break
                return f"{units}{suffix}"
        mantissa, exponent = self.nanos, -9
        while mantissa % 1000 == 0:
            mantissa //= 1000
            exponent += 3
        if fmt is Format.DECIMAL_EXPONENT:
            return f"{mantissa}" if exponent == 0 else f"{mantissa}e{exponent}"
        if exponent > 18:
            mantissa *= 10 ** (exponent - 18)
            exponent = 18
        return f"{mantissa}{_DECIMAL_BY_EXP[exponent]}"

    def __repr__(self) -> str:
        return f"Quantity({self.canonical()!r})"


def _invalid(text: str, why: str) -> ValueError:
    return ValueError(f"invalid quantity {text!r}: {why}")


def parse_quantity(text: str) -> Quantity:
    """Parse a Kubernetes quantity (``<sign><digits>[.<digits>]<suffix>``).

    Suffixes: binary ``Ki Mi Gi Ti Pi Ei``, decimal ``n u m k M G T P E`` or none, and decimal
    exponents ``e<int>`` / ``E<int>``. Amounts finer than ``1n`` round up away from zero.
    Raises ``ValueError`` naming ``text`` for anything else.
    """
    if not isinstance(text, str):
        raise ValueError(f"invalid quantity {text!r}: expected a string")
    if not text:
        raise _invalid(text, "empty string")
    pos, end = 0, len(text)
    negative = False
    if text[0] in "+-":
        negative = text[0] == "-"
        pos = 1
    start = pos
    while pos < end and text[pos].isascii() and text[pos].isdigit():
        pos += 1
    whole = text[start:pos]
    frac = ""
    if pos < end and text[pos] == ".":
        pos += 1
        fstart = pos
        while pos < end and text[pos].isascii() and text[pos].isdigit():
            pos += 1
        frac = text[fstart:pos]
    if not whole and not frac:
        raise _invalid(text, "a quantity starts with a number, like 10Gi or 500m")
    if len(whole.lstrip("0")) + len(frac) > MAX_DIGITS:
        raise _invalid(text, f"more than {MAX_DIGITS} digits")
    suffix = text[pos:]
    fmt, numerator, denominator = _interpret_suffix(text, suffix)
    # amount = (whole.frac) * numerator / denominator, in nanos, rounded up away from zero.
    digits = int(whole or "0") * 10 ** len(frac) + int(frac or "0")
    num = digits * numerator * _NANO
    den = denominator * 10 ** len(frac)
    nanos, rem = divmod(num, den)
    if rem:
        nanos += 1
    if negative:
        nanos = -nanos
    return Quantity(nanos, fmt)


def quantity_or_none(value: object) -> Quantity | None:
    """``value`` parsed as a quantity, or None when it is absent or not one: a string, or a
    JSON number (which the API server accepts where a quantity goes); never a bool."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return None
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def _interpret_suffix(text: str, suffix: str) -> tuple[Format, int, int]:
    """(format, numerator, denominator) by which the number is multiplied."""
    if suffix in _BINARY:
        return Format.BINARY_SI, _BINARY[suffix], 1
    if suffix in _DECIMAL:
        exp = _DECIMAL[suffix]
        return (Format.DECIMAL_SI, 10**exp, 1) if exp >= 0 else (Format.DECIMAL_SI, 1, 10**-exp)
    if len(suffix) > 1 and suffix[0] in "eE":
        body = suffix[1:]
        digits = body[1:] if body[0] in "+-" else body
        if digits and digits.isascii() and digits.isdigit():
            if len(digits) > 4 or int(digits) > MAX_EXPONENT:
                raise _invalid(text, f"exponent larger than {MAX_EXPONENT} in magnitude")
            exp = int(body)
            if exp >= 0:
                return Format.DECIMAL_EXPONENT, 10**exp, 1
            return Format.DECIMAL_EXPONENT, 1, 10**-exp
    raise _invalid(
        text,
        f"unknown suffix {suffix!r}; use one of Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or e<N>",
    )


def parse_storage_size(text: object, *, what: str = "storage size") -> int:
    """Bytes for a storage request or capacity: a valid quantity that is not negative and fits
    in an int64 (what Kubernetes components can represent). Fractions of a byte round up.

    Raises ``ValueError`` naming ``what`` and the value otherwise.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} {text!r} is not a quantity string such as '10Gi'")
    try:
        q = parse_quantity(text)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
    if q.sign() < 0:
        raise ValueError(f"{what} {text!r} is negative")
    size = q.value()
    if size > INT64_MAX:
        raise ValueError(f"{what} {text!r} is larger than the maximum of {INT64_MAX} bytes")
    return size
