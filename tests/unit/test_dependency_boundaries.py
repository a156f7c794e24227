"""pyprovlib uses aiohttp, grpclib and betterproto2 through their public API only (DESIGN.md,
issue 19).

An AST scan over every module in src/pyprovlib (the generated csi/_proto excepted) fails on:
an import of a private module or name of either library (a ``_``-prefixed part, or a module
outside the documented public ones, such as ``aiohttp.client_reqrep``'s ``ConnectionKey``); an
attribute chain from one of their modules through a private name (``aiohttp.helpers._x``); and a
private attribute of their main classes reached by name (``session._trust_env``,
``getattr(server, "_protocol_factory")``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import aiohttp.web
import betterproto2
import grpclib.client
import grpclib.server
import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pyprovlib"

DEPENDENCIES = ("aiohttp", "grpclib", "betterproto2")

# The modules each library documents as its API (aiohttp's reference, grpclib's API docs).
PUBLIC_MODULES = frozenset(
    {
        "aiohttp",
        "aiohttp.web",
        "aiohttp.abc",
        "aiohttp.hdrs",
        "aiohttp.typedefs",
        "aiohttp.test_utils",
        "aiohttp.pytest_plugin",
        "aiohttp.tracing",
        "grpclib",
        "grpclib.client",
        "grpclib.server",
        "grpclib.const",
        "grpclib.exceptions",
        "grpclib.metadata",
        "grpclib.events",
        "grpclib.config",
        "grpclib.utils",
        "grpclib.testing",
        "grpclib.health.check",
        "grpclib.health.service",
        "grpclib.reflection.service",
        "grpclib.encoding.base",
        "grpclib.encoding.proto",
        "betterproto2",
        "betterproto2.casing",  # the name casing its generated code and users share
    }
)


def _private_attributes() -> frozenset[str]:
    """``_``-prefixed (not dunder) attribute names of the classes pyprovlib holds instances of."""
    classes: list[type] = [
        aiohttp.ClientSession,
        aiohttp.ClientResponse,
        aiohttp.TCPConnector,
        aiohttp.UnixConnector,
        aiohttp.StreamReader,
        aiohttp.web.Application,
        aiohttp.web.AppRunner,
        aiohttp.web.Request,
        grpclib.client.Channel,
        grpclib.server.Server,
        grpclib.server.Stream,
        betterproto2.Message,
    ]
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            if klass.__module__.split(".")[0] not in DEPENDENCIES:
                continue
            names.update(vars(klass))
            names.update(getattr(klass, "__slots__", ()) or ())
            names.update(getattr(klass, "ATTRS", ()) or ())
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


PRIVATE_ATTRIBUTES = _private_attributes()


def _modules() -> Iterator[Path]:
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith("csi/_proto/"):
            continue
        yield path


def _is_dependency(module: str) -> bool:
    return module.split(".", maxsplit=1)[0] in DEPENDENCIES


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _violations(source: str, name: str) -> Iterator[str]:
    tree = ast.parse(source, name)
    own_attributes = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("self", "cls")
    }
    # Names bound to a dependency module (import aiohttp / import grpclib.server as s).
    module_names: set[str] = set()
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_dependency(alias.name):
                    continue
                module_names.add(alias.asname or alias.name.split(".")[0])
                if any(map(_private, alias.name.split("."))) or alias.name not in PUBLIC_MODULES:
                    yield f"{where}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module and _is_dependency(node.module):
            if any(map(_private, node.module.split("."))) or node.module not in PUBLIC_MODULES:
                yield f"{where}: from {node.module} import ..."
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _private(alias.name):
                    yield f"{where}: from {node.module} import {alias.name}"
                elif full in PUBLIC_MODULES:
                    module_names.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute):
            chain = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in module_names:
                if any(map(_private, chain)):
                    yield f"{where}: {value.id}.{'.'.join(reversed(chain))}"
            elif node.attr in PRIVATE_ATTRIBUTES and node.attr not in own_attributes:
                yield f"{where}: .{node.attr} (a private attribute of aiohttp or grpclib)"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in PRIVATE_ATTRIBUTES
        ):
            yield f"{where}: {node.func.id}(..., {node.args[1].value!r})"


def test_the_scan_sees_the_modules_and_the_classes() -> None:
    scanned = [p.relative_to(SRC).as_posix() for p in _modules()]
    assert "kube/_config.py" in scanned
    assert "csi/_connection.py" in scanned
    assert not any(p.startswith("csi/_proto/") for p in scanned)
    assert "_trust_env" in PRIVATE_ATTRIBUTES


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from aiohttp.client_reqrep import ConnectionKey\n", "aiohttp.client_reqrep"),
        ("import aiohttp\nx = aiohttp.helpers._x\n", "aiohttp.helpers._x"),
        ("def f(session):\n    session._trust_env = False\n", "._trust_env"),
        ("def f(s):\n    return getattr(s, '_trust_env')\n", "getattr"),
        ("from grpclib.protocol import H2Protocol\n", "grpclib.protocol"),
        ("import aiohttp\nx = aiohttp.ClientTimeout()\n", None),
        ("class A:\n    def f(self):\n        return self._trust_env\n", None),
    ],
)
def test_the_scan_finds_what_it_should(source: str, found: str | None) -> None:
    violations = list(_violations(source, "probe.py"))
    if found is None:
        assert violations == []
    else:
        assert violations, source
        assert found in violations[0]


def test_no_module_uses_a_private_name_of_aiohttp_or_grpclib() -> None:
    violations = [
        v
        for path in _modules()
        for v in _violations(path.read_text(encoding="utf-8"), path.relative_to(SRC).as_posix())
    ]
    assert violations == []
