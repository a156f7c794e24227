"""Every name a module lists in ``__all__`` can be imported from it.

Package facades build ``__all__`` from their submodules' (``__all__ += decisions.__all__``,
CPython's asyncio idiom), which neither mypy nor ruff checks against what the module defines:
this does, at runtime, for every module of the package.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import pyprovlib


def _modules() -> list[str]:
    names = ["pyprovlib"]
    for info in pkgutil.walk_packages(pyprovlib.__path__, "pyprovlib."):
        if info.name.endswith("__main__") or "._proto" in info.name:
            continue
        names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_every_exported_name_is_defined(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        pytest.skip(f"{name} has no __all__")
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names it does not define: {missing}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ lists a name twice"


def test_facades_export_their_submodules_names() -> None:
    from pyprovlib.controller import _provision as provision
    from pyprovlib.controller import _resize as resize
    from pyprovlib.controller._provision import decisions
    from pyprovlib.controller._resize import claims as resize_claims

    assert set(decisions.__all__) <= set(provision.__all__)
    assert set(resize_claims.__all__) <= set(resize.__all__)
