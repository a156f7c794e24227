"""pyprovlib._lazy_kubernetes: the kubernetes-asyncio client packages load their modules on use.

Each import check runs in a fresh interpreter, since this one imported the client long ago.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pyprovlib import _lazy_kubernetes


def _run(code: str, *, eager: bool = False) -> Any:
    """Run ``code`` in a fresh interpreter; it prints one JSON value, returned here."""
    env = {k: v for k, v in os.environ.items() if k != _lazy_kubernetes.EAGER_ENV}
    if eager:
        env[_lazy_kubernetes.EAGER_ENV] = "1"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


_COUNT_MODULES = """
    import json, sys
    import pyprovlib
    from pyprovlib import _lazy_kubernetes
    from kubernetes_asyncio.client import V1PersistentVolumeClaim
    loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.")]
    print(json.dumps({"installed": _lazy_kubernetes.installed(), "loaded": len(loaded)}))
"""


def test_importing_pyprovlib_loads_a_fraction_of_the_generated_modules() -> None:
    lazy = _run(_COUNT_MODULES)
    eager = _run(_COUNT_MODULES, eager=True)
    assert lazy["installed"] is True
    assert eager["installed"] is False
    # The eager client imports every API and model module (~830); pyprovlib needs a few dozen.
    assert eager["loaded"] > 800
    assert lazy["loaded"] < 150


def test_every_exported_name_resolves_to_the_same_object_as_an_eager_import() -> None:
    code = """
        import json
        import pyprovlib
        import kubernetes_asyncio.client as c
        import kubernetes_asyncio.client.api as a
        import kubernetes_asyncio.client.models as m
        out = {}
        for pkg in (c, a, m):
            for name in pkg.__all__:
                obj = getattr(pkg, name)
                out[pkg.__name__ + ":" + name] = obj.__module__ + "." + obj.__qualname__
        out["version"] = c.__version__
        print(json.dumps(out))
    """
    lazy, eager = _run(code), _run(code, eager=True)
    assert len(lazy) > 1600
    assert lazy == eager


def test_lazy_names_are_the_submodules_classes_and_are_cached() -> None:
    import kubernetes_asyncio.client as client
    import kubernetes_asyncio.client.models as models
    from kubernetes_asyncio.client.models.v1_volume_attachment import V1VolumeAttachment

    assert client.V1VolumeAttachment is V1VolumeAttachment
    assert models.V1VolumeAttachment is V1VolumeAttachment
    assert "V1VolumeAttachment" in vars(models)  # resolved once, then a plain attribute
    assert "V1CSIDriver" in dir(models)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchModel'"):
        _ = models.NoSuchModel


def test_star_import_and_api_client_deserialisation_work() -> None:
    code = """
        import asyncio, json
        import pyprovlib
        from kubernetes_asyncio.client import *  # noqa: F403
        from kubernetes_asyncio.client import ApiClient

        class Response:
            data = json.dumps({
                "metadata": {"name": "c1", "namespace": "ns"},
                "spec": {"resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Pending"},
            })

        async def main():
            async with ApiClient() as api:
                return api.deserialize(Response(), "V1PersistentVolumeClaim")

        pvc = asyncio.run(main())
        print(json.dumps({
            "type": type(pvc).__name__,
            "spec": type(pvc.spec).__name__,
            "name": pvc.metadata.name,
            "star": "V1StorageClass" in globals() and "CoreV1Api" in globals(),
        }))
    """
    assert _run(code) == {
        "type": "V1PersistentVolumeClaim",
        "spec": "V1PersistentVolumeClaimSpec",
        "name": "c1",
        "star": True,
    }


def _load_with_lazy_loader(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py", submodule_search_locations=[str(path)]
    )
    assert spec is not None
    assert spec.loader is not None
    spec.loader = _lazy_kubernetes._LazyPackageLoader(spec.loader, str(path / "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_a_reexport_list_is_loaded_lazily(tmp_path: Path) -> None:
    pkg = tmp_path / "lazy_pkg_a"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '"""doc"""\nfrom __future__ import annotations\n__version__ = "1"\n'
        "from lazy_pkg_a.thing import Thing\nfrom lazy_pkg_a.thing import Thing as Alias\n"
    )
    (pkg / "thing.py").write_text("LOADED = True\nclass Thing:\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = _load_with_lazy_loader(pkg, "lazy_pkg_a")
        assert module.__version__ == "1"
        assert module.__doc__ == "doc"
        assert "lazy_pkg_a.thing" not in sys.modules
        assert module.Alias is module.Thing
        assert sys.modules["lazy_pkg_a.thing"].LOADED is True
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("lazy_pkg_a", "lazy_pkg_a.thing"):
            sys.modules.pop(name, None)


def test_an_init_with_other_statements_runs_as_usual(tmp_path: Path) -> None:
    pkg = tmp_path / "lazy_pkg_b"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from lazy_pkg_b.thing import Thing\nif True:\n    EXTRA = Thing.__name__\n"
    )
    (pkg / "thing.py").write_text("class Thing:\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = _load_with_lazy_loader(pkg, "lazy_pkg_b")
        # The `if` is not a re-export: the file ran eagerly, so its import happened.
        assert "lazy_pkg_b.thing" in sys.modules
        assert module.EXTRA == "Thing"
        assert "__getattr__" not in vars(module)
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("lazy_pkg_b", "lazy_pkg_b.thing"):
            sys.modules.pop(name, None)


def test_install_is_idempotent_and_reversible() -> None:
    assert _lazy_kubernetes.installed()
    assert _lazy_kubernetes.install() is True
    assert sys.meta_path.count(_lazy_kubernetes._FINDER) == 1
    _lazy_kubernetes.uninstall()
    try:
        assert not _lazy_kubernetes.installed()
        # The client is imported in this process by now: installing again is a no-op.
        assert _lazy_kubernetes.install() is False
    finally:
        sys.meta_path.insert(0, _lazy_kubernetes._FINDER)
