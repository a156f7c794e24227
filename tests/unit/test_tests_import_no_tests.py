"""No module under ``tests/`` imports a test module (issue 29): shared helpers live in helper
modules (``tests/*_support.py``, ``tests/<dir>/*_support.py``, ``conftest.py`` for fixtures,
or :mod:`pyprovlib.testing`), so a test module can be moved, renamed or run alone without
breaking another one, and pytest never collects a test twice under two names.

The imports are read with :mod:`ast`: at module level, inside functions and inside ``try``
blocks alike, ``import test_x`` and ``from test_x import y`` and dotted forms such as
``from tests.integration.test_x import y``.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

TESTS = pathlib.Path(__file__).resolve().parents[1]


def imports_of_test_modules(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a ``test_*`` module in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.ImportFrom):
            # `from . import test_x` / `from .test_x import y`
            modules = [node.module or alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            if any(part.startswith("test_") for part in module.split(".")):
                yield node.lineno, module


def test_no_module_under_tests_imports_a_test_module() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, module in imports_of_test_modules(path.read_text())
    ]
    assert found == [], (
        "move what is shared into a helper module (tests/*_support.py, or conftest.py for a "
        "fixture):\n" + "\n".join(found)
    )


def test_the_check_sees_every_form_of_import() -> None:
    source = "\n".join(
        [
            "import test_a",
            "import os, test_b as b",
            "from test_c import helper",
            "from tests.integration.test_d import helper",
            "from . import test_e",
            "def f():",
            "    from test_f import helper",
            "try:",
            "    from test_g import fixture",
            "except ImportError:",
            "    pass",
            "import claim_support",
            "from provision_support import fast_options",
            "from pyprovlib.testing import wait_idle",
        ]
    )
    assert [module for _line, module in imports_of_test_modules(source)] == [
        "test_a",
        "test_b",
        "test_c",
        "tests.integration.test_d",
        "test_e",
        "test_f",
        "test_g",
    ]
