"""The module paths that the guides showed users before the public API moved into the package
``__init__`` files (issue 29) still import: each name comes from where it lives now, with a
DeprecationWarning that names the public package to import it from."""

from __future__ import annotations

import importlib
import pathlib
import warnings

import pytest

from pyprovlib._moved import MOVED

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize(
    ("old", "name", "public"),
    [
        ("pyprovlib.provisioner", "Provisioner", "pyprovlib"),
        ("pyprovlib.attacher", "Attacher", "pyprovlib"),
        ("pyprovlib.resizer", "Resizer", "pyprovlib"),
        ("pyprovlib.controller.attach_options", "AttachControllerOptions", "pyprovlib"),
        ("pyprovlib.controller.resize_options", "ResizeControllerOptions", "pyprovlib"),
        ("pyprovlib.csi.server", "CSIServer", "pyprovlib.csi"),
        ("pyprovlib.csi.validate", "require", "pyprovlib.csi"),
        ("pyprovlib.testing.node", "KubeletNode", "pyprovlib.testing"),
    ],
)
def test_an_old_path_warns_and_gives_the_same_object(old: str, name: str, public: str) -> None:
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: {name} moved "):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(public), name)
    with pytest.warns(DeprecationWarning, match=f"import it from {public}"):
        exec(f"from {old} import {name}", {})


def test_an_internal_name_through_an_old_path_says_it_is_internal() -> None:
    module = importlib.import_module("pyprovlib.testing.node")
    with pytest.warns(DeprecationWarning, match="it is internal and may change"):
        module.KUBELET_ROOT  # noqa: B018 - the access is the test


def test_importing_an_old_path_alone_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("pyprovlib.csi.server")


def test_a_missing_name_is_an_attribute_error() -> None:
    module = importlib.import_module("pyprovlib.testing.node")
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018 - the access is the test


def test_every_old_path_is_a_shim_file_and_every_shim_is_listed() -> None:
    """The table and the files agree: an old path without a file would fail to import, and a
    file outside the table would be a public module that nobody listed."""
    for old, (internal, public) in MOVED.items():
        path = SRC / (old.replace(".", "/") + ".py")
        assert path.is_file(), f"{old} is in MOVED but {path} does not exist"
        assert "forwarder(__name__)" in path.read_text(), f"{path} should only forward"
        importlib.import_module(internal)
        assert getattr(importlib.import_module(public), "__all__", None), public
