"""Tests for pyprovlib.kube._quantity: apimachinery's parsing, rounding and canonical form, and
the storage-size checks that reject hostile claims."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyprovlib.kube._quantity import (
    INT64_MAX,
    Format,
    Quantity,
    parse_quantity,
    parse_storage_size,
)


@pytest.mark.parametrize(
    ("text", "value", "canonical"),
    [
        ("0", 0, "0"),
        ("1", 1, "1"),
        ("1Ki", 1024, "1Ki"),
        ("1Mi", 1024**2, "1Mi"),
        ("10Gi", 10 * 1024**3, "10Gi"),
        ("1.5Gi", 1536 * 1024**2, "1536Mi"),
        ("1Ei", 1024**6, "1Ei"),
        ("1k", 1000, "1k"),
        ("1M", 10**6, "1M"),
        ("1G", 10**9, "1G"),
        ("1E", 10**18, "1E"),
        ("1e3", 1000, "1e3"),
        ("1E3", 1000, "1e3"),
        ("15e-1", 2, "1500e-3"),
        ("1500m", 2, "1500m"),
        ("0.5", 1, "500m"),
        ("+5", 5, "5"),
        ("100", 100, "100"),
        ("1000", 1000, "1k"),
        ("512Ki", 512 * 1024, "512Ki"),
        ("0.5Ki", 512, "512"),
        ("1.1Ki", 1127, "1126400m"),
        ("000Gi", 0, "0"),
        ("1.", 1, "1"),
        (".5Gi", 512 * 1024**2, "512Mi"),
        ("1n", 1, "1n"),
        ("1000E", 10**21, "1000E"),
    ],
)
def test_parse_value_and_canonical_form(text: str, value: int, canonical: str) -> None:
    q = parse_quantity(text)
    assert q.value() == value
    assert q.canonical() == canonical
    assert str(q) == canonical


def test_finer_than_nano_rounds_up_away_from_zero() -> None:
    assert parse_quantity("0.1n").nanos == 1
    assert parse_quantity("-0.1n").nanos == -1
    assert parse_quantity("1.0000000001").nanos == 1_000_000_001


def test_negative_quantities_parse_but_round_away_from_zero() -> None:
    q = parse_quantity("-1Gi")
    assert q.value() == -(1024**3)
    assert q.canonical() == "-1Gi"
    assert parse_quantity("-1500m").value() == -2
    assert parse_quantity("-1500m").milli_value() == -1500


def test_comparison_is_by_amount() -> None:
    assert parse_quantity("1Ki") == parse_quantity("1024")
    assert parse_quantity("1Gi") > parse_quantity("1G")
    assert parse_quantity("999Mi") < parse_quantity("1Gi")
    assert hash(parse_quantity("1k")) == hash(parse_quantity("1000"))
    assert (parse_quantity("1Gi") + parse_quantity("1Gi")).canonical() == "2Gi"
    assert (parse_quantity("1Gi") - parse_quantity("512Mi")).canonical() == "512Mi"
    assert Quantity.from_int(2048).canonical() == "2Ki"
    assert Quantity.from_int(1500, Format.DECIMAL_SI).canonical() == "1500"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Gi",
        "1Zi",
        "1K",
        "1KiB",
        "1 Gi",
        " 1Gi",
        "1Gi ",
        "1.5.5",
        "--1",
        "1e",
        "1e+",
        "1ee3",
        "0x10",
        "1e3Gi",
        "\u0661",  # Arabic-Indic digit one: str.isdigit() is true, Kubernetes says no
        "1e999999999",
        "1" * 200,
        "NaN",
        "inf",
    ],
)
def test_invalid_strings_raise_value_error_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity") as info:
        parse_quantity(text)
    assert repr(text) in str(info.value)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="expected a string"):
        parse_quantity(10)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "size"),
    [("1Gi", 1024**3), ("1e3", 1000), ("1500m", 2), ("0", 0), ("8Ei", None)],
)
def test_storage_size(text: str, size: int | None) -> None:
    if size is None:
        with pytest.raises(ValueError, match="larger than the maximum"):
            parse_storage_size(text)
    else:
        assert parse_storage_size(text) == size


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1Gi", "is negative"),
        ("999999999999Ei", "larger than the maximum"),
        ("1Zi", "unknown suffix"),
        (5, "not a quantity string"),
        (None, "not a quantity string"),
    ],
)
def test_storage_size_rejects_hostile_input(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_storage_size(value, what="claim ns/c storage request")
    assert "claim ns/c storage request" in str(info.value)


def test_storage_size_at_int64_boundary() -> None:
    assert parse_storage_size(str(INT64_MAX)) == INT64_MAX
    with pytest.raises(ValueError, match="larger than the maximum"):
        parse_storage_size(str(INT64_MAX + 1))


@given(
    st.integers(min_value=-(10**24), max_value=10**24),
    st.sampled_from(list(Format)),
)
def test_canonical_form_round_trips(nanos: int, fmt: Format) -> None:
    q = Quantity(nanos, fmt)
    again = parse_quantity(q.canonical())
    assert again == q
    # From the first parse on, the canonical form is a fixed point.
    assert parse_quantity(again.canonical()).canonical() == again.canonical()
    if fmt is not Format.BINARY_SI or q.canonical().endswith("i"):
        assert again.canonical() == q.canonical()


def test_binary_si_without_a_binary_suffix_parses_back_as_decimal() -> None:
    """A BinarySI value that is no whole multiple of 1024 prints without a suffix, and a number
    without a suffix parses as DecimalSI (upstream's ParseQuantity), which then prints with a
    decimal suffix: the same value, another format (hypothesis found 15,625,000)."""
    q = Quantity(15_625_000 * 10**9, Format.BINARY_SI)
    assert q.canonical() == "15625000"
    again = parse_quantity(q.canonical())
    assert again == q
    assert again.canonical() == "15625k"


@given(st.integers(min_value=0, max_value=INT64_MAX), st.sampled_from(["", "Ki", "Mi", "k", "M"]))
def test_whole_numbers_scale_exactly(n: int, suffix: str) -> None:
    factor = {"": 1, "Ki": 1024, "Mi": 1024**2, "k": 1000, "M": 10**6}[suffix]
    assert parse_quantity(f"{n}{suffix}").value() == n * factor
