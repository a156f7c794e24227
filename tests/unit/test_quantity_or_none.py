"""``kube.quantity.quantity_or_none``: the parse-or-None the resize controller and the PV
binder share for a claim's or volume's ``storage`` entry."""

from __future__ import annotations

import pytest

from pyprovlib.kube._quantity import parse_quantity, quantity_or_none


@pytest.mark.parametrize("value", ["10Gi", "1500M", "0", "1e3", "500m"])
def test_strings_parse_like_parse_quantity(value: str) -> None:
    assert quantity_or_none(value) == parse_quantity(value)


@pytest.mark.parametrize(("value", "text"), [(1024, "1024"), (2.5, "2.5")])
def test_json_numbers_are_quantities(value: float, text: str) -> None:
    assert quantity_or_none(value) == parse_quantity(text)


@pytest.mark.parametrize("value", [None, True, False, "", "ten gigs", "10Gb", [], {}])
def test_anything_else_is_none(value: object) -> None:
    assert quantity_or_none(value) is None
