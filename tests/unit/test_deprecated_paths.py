"""The module paths that the docs showed users before the attach and resize controllers became
packages (issue 29) still import, warn once with the new path, and give the same objects."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        (
            "pyprovlib.controller.attach_options",
            "pyprovlib.controller.attach",
            "AttachControllerOptions",
        ),
        (
            "pyprovlib.controller.resize_options",
            "pyprovlib.controller.resize",
            "ResizeControllerOptions",
        ),
    ],
)
def test_an_old_options_path_warns_and_reexports(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str, name: str
) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: import from {new}\b"):
        module = importlib.import_module(old)
    current = importlib.import_module(new + ".options")
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    assert set(module.__all__) == set(current.__all__)
    assert all(getattr(module, n) is getattr(current, n) for n in current.__all__)
