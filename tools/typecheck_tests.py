"""Type-check ``tests/`` with mypy (``tests/mypy.ini``), the way pytest imports it.

A developer tool and CI step (``nox -s typecheck``, ``.ci/run``):
``python tools/typecheck_tests.py``. Extra arguments go to every mypy run.

The tests' support modules are imported by bare name (``from process_support import ...``)
because pytest (rootdir conftest, prepend import mode) puts the directory of each test module
and of the root ``conftest.py`` on ``sys.path``; several directories have a ``conftest.py``.
So each directory of ``tests/`` is checked on its own, with the search path pytest gives it
when that directory runs alone: the directory itself, then ``tests/``, then ``src/`` (this
checkout's sources, before any installed copy). A test that imports a support module of
another directory fails here, as it would when its directory runs alone (but for the modules
a directory loads by path, :data:`LOADS_FROM`).

One cache (``.mypy_cache/tests``, apart from the strict run's) serves every directory; a fresh
clone starts without one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# Directories whose tests load support modules of other directories by path
# (rel_support.load_support, so they work when the directory runs alone) and import the same
# modules under TYPE_CHECKING, so that what they use of them is checked too.
LOADS_FROM = {"reliability": ("attach", "resize")}


def directories() -> list[Path]:
    """Every directory of ``tests/`` that holds Python files."""
    return sorted({p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts})


def check(directory: Path, extra: list[str]) -> int:
    search = [directory, TESTS] if directory != TESTS else [TESTS]
    search += [TESTS / d for d in LOADS_FROM.get(directory.name, ())]
    env = dict(os.environ, MYPYPATH=os.pathsep.join(str(p) for p in [*search, ROOT / "src"]))
    files = sorted(str(p.relative_to(ROOT)) for p in directory.glob("*.py"))
    command = [sys.executable, "-m", "mypy", "--config-file", str(TESTS / "mypy.ini")]
    command += ["--cache-dir", str(ROOT / ".mypy_cache" / "tests"), *extra, *files]
    print(f"== mypy {directory.relative_to(ROOT)}/", flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode  # noqa: S603 - our argv


def main(argv: list[str]) -> int:
    started = time.monotonic()
    failed = [d for d in directories() if check(d, argv) != 0]
    took = time.monotonic() - started
    if failed:
        names = ", ".join(f"{d.relative_to(ROOT)}/" for d in failed)
        print(f"mypy failed in {names} ({took:.0f}s)", file=sys.stderr)
        return 1
    print(f"mypy: tests/ clean ({took:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
