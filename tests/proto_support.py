"""The CSI bindings generator, ``tools/generate_proto.py`` (a developer tool outside the
package), loaded as a module for the tests that check it."""

from __future__ import annotations

import pathlib

from module_support import load_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "tools" / "generate_proto.py"
PROTO_DIR = ROOT / "proto"
COMMITTED = ROOT / "src" / "pyprovlib" / "csi" / "_proto"


generate_proto = load_file("generate_proto", GENERATOR, register=True)
