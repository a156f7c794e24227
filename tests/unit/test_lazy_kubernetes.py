"""pyprovlib._lazy_kubernetes: on request (``pyprovlib.enable_lazy_kubernetes_imports()``, the
first call of every ``python -m pyprovlib...`` entry point's ``__main__`` and console script),
the kubernetes-asyncio client packages load their modules on use; importing pyprovlib or any of
its entry-point packages alone reads no argv and changes nothing.

Each import check runs in a fresh interpreter, since this one imported the client long ago.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pyprovlib import _lazy_kubernetes

_OPT_IN = "import pyprovlib\npyprovlib.enable_lazy_kubernetes_imports()\n"


def _run(code: str, *, lazy: bool = True, eager_env: bool = False) -> Any:
    """Run ``code`` in a fresh interpreter, after the opt-in call when ``lazy``; it prints
    one JSON value, returned here."""
    env = {k: v for k, v in os.environ.items() if k != _lazy_kubernetes.EAGER_ENV}
    if eager_env:
        env[_lazy_kubernetes.EAGER_ENV] = "1"
    out = subprocess.run(
        [sys.executable, "-c", (_OPT_IN if lazy else "") + textwrap.dedent(code)],
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
    from pyprovlib import ProvisionController, _lazy_kubernetes
    from kubernetes_asyncio.client import V1PersistentVolumeClaim
    loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.")]
    print(json.dumps({"enabled": _lazy_kubernetes.enabled(), "loaded": len(loaded)}))
"""


def test_the_opt_in_loads_a_fraction_of_the_generated_modules() -> None:
    lazy = _run(_COUNT_MODULES)
    eager = _run(_COUNT_MODULES, lazy=False)
    env_off = _run(_COUNT_MODULES, eager_env=True)
    assert lazy["enabled"] is True
    assert eager["enabled"] is False
    assert env_off["enabled"] is False
    # The eager client imports every API and model module (~830); pyprovlib needs a few dozen.
    assert eager["loaded"] > 800
    assert env_off["loaded"] > 800
    assert lazy["loaded"] < 150


SRC = Path(__file__).resolve().parents[2] / "src"


def _entry_points() -> list[str]:
    """Every ``python -m`` entry point: each package with a ``__main__.py``."""
    return sorted(
        ".".join(path.parent.relative_to(SRC).parts)
        for path in (SRC / "pyprovlib").rglob("__main__.py")
    )


def _console_scripts() -> dict[str, str]:
    pyproject = tomllib.loads((SRC.parent / "pyproject.toml").read_text(encoding="utf-8"))
    scripts: dict[str, str] = pyproject["project"].get("scripts", {})
    return scripts


def test_the_entry_points_are_found() -> None:
    # The parametrized tests below must not pass by finding nothing.
    assert {"pyprovlib.csi", "pyprovlib.csi.provisioner", "pyprovlib.testing"} <= set(
        _entry_points()
    )
    assert "pyprovlib-apiserver" in _console_scripts()


def test_importing_pyprovlib_and_its_entry_point_packages_changes_nothing() -> None:
    # Every package Python imports on the way to an entry point's __main__: none may import
    # kubernetes_asyncio (the __main__ could not turn the lazy imports on after that), touch
    # sys.meta_path, or look at the command line (argv and orig_argv are replaced by lists
    # that record any read; sys.argv[0] is "-m" while `python -m` locates the module).
    code = f"""
        import importlib, json, sys

        reads = []

        class Spy(list):
            def __getitem__(self, index):
                reads.append(repr(index))
                return super().__getitem__(index)

            def __iter__(self):
                reads.append("iter")
                return super().__iter__()

            def __len__(self):
                reads.append("len")
                return super().__len__()

        sys.argv = Spy(["-m"])
        sys.orig_argv = Spy([sys.executable, "-m", "pyprovlib.csi"])
        meta_path = list(sys.meta_path)
        for name in {_entry_points()!r}:
            importlib.import_module(name)
        print(json.dumps({{
            "reads": reads,
            "meta_path_unchanged": sys.meta_path == meta_path,
            "kubernetes": sorted(m for m in sys.modules if m.startswith("kubernetes_asyncio")),
        }}))
    """
    assert _run(code, lazy=False) == {"reads": [], "meta_path_unchanged": True, "kubernetes": []}


def test_the_opt_in_leaves_no_finder_behind() -> None:
    code = """
        import json, sys
        ours = [type(f).__module__ for f in sys.meta_path]
        print(json.dumps({
            "ours": [m for m in ours if "pyprovlib" in m],
            "again": pyprovlib.enable_lazy_kubernetes_imports(),
        }))
    """
    assert _run(code) == {"ours": [], "again": True}


def test_too_late_an_opt_in_is_a_no_op() -> None:
    code = """
        import json, sys
        import kubernetes_asyncio.client
        import pyprovlib
        print(json.dumps(pyprovlib.enable_lazy_kubernetes_imports()))
    """
    assert _run(code, lazy=False) is False


def _generated_models_loaded(argv: list[str]) -> int:
    """Run ``argv`` (a Python command line, ``--help`` at its end) under ``-X importtime``,
    which lists every module the process imported; the number of kubernetes-asyncio's
    generated model modules among them."""
    env = {k: v for k, v in os.environ.items() if k != _lazy_kubernetes.EAGER_ENV}
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()]
    # The client was imported: the count below says whether lazily or not.
    assert "kubernetes_asyncio.client" in imported, out.stderr[-2000:]
    return sum(1 for m in imported if m.startswith("kubernetes_asyncio.client.models.v"))


@pytest.mark.parametrize("module", _entry_points())
def test_python_m_entry_points_turn_it_on(module: str) -> None:
    # A lazy client loads none of the ~750 generated models for --help, an eager one all:
    # this fails when a package __init__ on the way imports the client before __main__ runs.
    assert _generated_models_loaded(["-m", module, "--help"]) < 50


@pytest.mark.parametrize(("script", "target"), sorted(_console_scripts().items()))
def test_console_scripts_turn_it_on(script: str, target: str) -> None:
    # What the wrapper pip writes for a console script does: import the target, call it.
    module, function = target.split(":")
    code = (
        f"import sys; sys.argv = [{script!r}, '--help']\n"
        f"from {module} import {function}\nsys.exit({function}())"
    )
    assert _generated_models_loaded(["-c", code]) < 50


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
    lazy, eager = _run(code), _run(code, lazy=False)
    assert len(lazy) > 1600
    assert lazy == eager


def test_lazy_names_are_the_submodules_classes_and_are_cached() -> None:
    code = """
        import json
        import kubernetes_asyncio.client as client
        import kubernetes_asyncio.client.models as models
        from kubernetes_asyncio.client.models.v1_volume_attachment import V1VolumeAttachment
        out = {
            "same": client.V1VolumeAttachment is V1VolumeAttachment
            and models.V1VolumeAttachment is V1VolumeAttachment,
            "cached": "V1VolumeAttachment" in vars(models),
            "dir": "V1CSIDriver" in dir(models),
            "lazy": "V1CSIDriver" not in vars(models),
        }
        try:
            models.NoSuchModel
        except AttributeError as err:
            out["error"] = str(err)
        print(json.dumps(out))
    """
    assert _run(code) == {
        "same": True,
        "cached": True,
        "dir": True,
        "lazy": True,
        "error": "module 'kubernetes_asyncio.client.models' has no attribute 'NoSuchModel'",
    }


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
