"""Python files that are not on ``sys.path`` (the tutorial's program, docs hooks, bench scripts,
tools, another suite's support module) loaded as modules for the tests that check them. Here at
the root of ``tests/``, which pytest puts on ``sys.path``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(name: str, path: Path, *, register: bool = False) -> ModuleType:
    """The file ``path`` run as the module ``name``. With ``register`` it is put in
    ``sys.modules`` under that name (what dataclasses and pickling look a module up by) and
    loaded once: a second call returns the module already there."""
    if register and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
