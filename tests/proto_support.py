"""The CSI bindings generator, ``tools/generate_proto.py`` (a developer tool outside the
package), loaded as a module for the tests that check it."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "tools" / "generate_proto.py"
PROTO_DIR = ROOT / "proto"
COMMITTED = ROOT / "src" / "pyprovlib" / "csi" / "_proto"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_proto", GENERATOR)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {GENERATOR}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate_proto = sys.modules.get("generate_proto") or _load()
