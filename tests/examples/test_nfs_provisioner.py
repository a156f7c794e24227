"""Unit tests of the NFS example provisioner's provision path against real temporary
directories (the "export" is a tmp dir standing for the mounted NFS share)."""

from __future__ import annotations

import asyncio
import stat
import tempfile
from pathlib import Path

import pytest
from example_support import tree, umask
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import (
    V1LabelSelector,
    V1ObjectMeta,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1StorageClass,
    V1VolumeResourceRequirements,
)

from pyprovlib._provisioner import ProvisioningError, ProvisionOptions
from pyprovlib.examples.nfs import NFSProvisioner
from pyprovlib.examples.nfs._provisioner import expand_path_pattern, parse_parameters


def claim(
    name: str = "data",
    namespace: str = "team-a",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    selector: V1LabelSelector | None = None,
) -> V1PersistentVolumeClaim:
    return V1PersistentVolumeClaim(
        metadata=V1ObjectMeta(
            name=name, namespace=namespace, labels=labels, annotations=annotations
        ),
        spec=V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"],
            resources=V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            selector=selector,
        ),
    )


def storage_class(
    params: dict[str, str] | None = None, mount_options: list[str] | None = None
) -> V1StorageClass:
    return V1StorageClass(
        metadata=V1ObjectMeta(name="nfs"),
        provisioner="pyprovlib.io/nfs",
        parameters=params,
        mount_options=mount_options,
    )


def options(
    pvc: V1PersistentVolumeClaim, sc: V1StorageClass, pv: str = "pvc-1234"
) -> ProvisionOptions:
    return ProvisionOptions(storage_class=sc, pv_name=pv, pvc=pvc)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    export = tmp_path / "export"
    outside = tmp_path / "outside"
    export.mkdir()
    outside.mkdir()
    return export, outside


def provisioner(export: Path) -> NFSProvisioner:
    return NFSProvisioner(None, "nfs.example.com", "/srv/share", str(export))


async def test_default_directory_and_pv(layout: tuple[Path, Path]) -> None:
    export, _ = layout
    with umask(0o022):
        pv = await provisioner(export).provision(
            options(claim(), storage_class(mount_options=["nfsvers=4.1"]))
        )
    d = export / "team-a-data-pvc-1234"
    assert d.is_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o777
    assert pv.metadata.name == "pvc-1234"
    assert pv.spec.nfs.server == "nfs.example.com"
    assert pv.spec.nfs.path == "/srv/share/team-a-data-pvc-1234"
    assert pv.spec.capacity == {"storage": "1Gi"}
    assert pv.spec.access_modes == ["ReadWriteMany"]
    assert pv.spec.mount_options == ["nfsvers=4.1"]
    # Idempotent: a retry after a crash finds the directory and returns the same PV.
    again = await provisioner(export).provision(
        options(claim(), storage_class(mount_options=["nfsvers=4.1"]))
    )
    assert again.spec.nfs.path == pv.spec.nfs.path


async def test_path_pattern(layout: tuple[Path, Path]) -> None:
    export, _ = layout
    sc = storage_class(
        {
            "pathPattern": "${.PVC.namespace}/${.PVC.labels.app}/${.PVC.annotations.owner}-"
            "${.PVC.name}"
        }
    )
    pvc = claim(labels={"app": "web"}, annotations={"owner": "alice"})
    pv = await provisioner(export).provision(options(pvc, sc))
    assert (export / "team-a" / "web" / "alice-data").is_dir()
    assert pv.spec.nfs.path == "/srv/share/team-a/web/alice-data"


def test_pattern_values_are_not_reexpanded() -> None:
    pvc = claim(annotations={"a": "${.PVC.name}"})
    assert expand_path_pattern("x-${.PVC.annotations.a}", pvc) == "x-${.PVC.name}"


async def test_empty_expansion_falls_back_to_default(layout: tuple[Path, Path]) -> None:
    export, _ = layout
    sc = storage_class({"pathPattern": "${.PVC.annotations.missing}"})
    pv = await provisioner(export).provision(options(claim(), sc))
    assert pv.spec.nfs.path == "/srv/share/team-a-data-pvc-1234"


@pytest.mark.parametrize(
    ("pattern", "annotations", "fragment"),
    [
        ("../x", {}, "'..'"),
        ("${.PVC.annotations.p}", {"p": "../../etc"}, "'..'"),
        ("${.PVC.annotations.p}/x", {"p": "/etc"}, "absolute"),
        ("${.PVC.annotations.p}", {"p": "a\x00b"}, "NUL"),
        ("${.PVC.annotations.p}", {"p": "n" * 300}, "longer than 255"),
        ("${.PVC.annotations.p}", {"p": "a/" * 2100}, "longer than 4096"),
    ],
)
async def test_escaping_patterns_are_refused(
    layout: tuple[Path, Path], pattern: str, annotations: dict[str, str], fragment: str
) -> None:
    export, outside = layout
    sc = storage_class({"pathPattern": pattern})
    with pytest.raises(ProvisioningError, match=fragment) as info:
        await provisioner(export).provision(options(claim(annotations=annotations), sc))
    message = str(info.value)
    assert "team-a/data" in message
    assert "'nfs'" in message
    assert tree(export) == []
    assert tree(outside) == []
    assert tree(export.parent) == ["export", "outside"]


async def test_symlink_planted_in_export_is_not_followed(layout: tuple[Path, Path]) -> None:
    export, outside = layout
    # A workload with an earlier volume plants a link; a later pattern walks through it.
    (export / "shared").symlink_to(outside)
    sc = storage_class({"pathPattern": "${.PVC.annotations.dir}/${.PVC.name}"})
    with pytest.raises(ProvisioningError, match="symbolic link"):
        await provisioner(export).provision(options(claim(annotations={"dir": "shared"}), sc))
    assert tree(outside) == []


async def test_long_claim_name_in_default_pattern(layout: tuple[Path, Path]) -> None:
    export, _ = layout
    with pytest.raises(ProvisioningError, match="longer than 255"):
        await provisioner(export).provision(options(claim(name="c" * 250), storage_class()))
    assert tree(export) == []


async def test_selector_is_refused(layout: tuple[Path, Path]) -> None:
    export, _ = layout
    pvc = claim(selector=V1LabelSelector(match_labels={"a": "b"}))
    with pytest.raises(ProvisioningError, match="selector"):
        await provisioner(export).provision(options(pvc, storage_class()))


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"archiveOnDelete": "maybe"}, "not a boolean"),
        ({"onDelete": "shred"}, "delete or retain"),
        ({"pathPatern": "x"}, "unknown parameter\\(s\\) pathPatern"),
        ({"pathPattern": "${.PVC.uid}"}, "unknown field"),
    ],
)
def test_bad_parameters(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(ProvisioningError, match=fragment) as info:
        parse_parameters(storage_class(params))
    assert "'nfs'" in str(info.value)


@pytest.mark.parametrize(
    ("params", "action"),
    [
        ({}, "archive"),
        ({"archiveOnDelete": "false"}, "delete"),
        ({"archiveOnDelete": "true"}, "archive"),
        ({"onDelete": "delete", "archiveOnDelete": "true"}, "delete"),
        ({"onDelete": "retain"}, "retain"),
    ],
)
def test_delete_action(params: dict[str, str], action: str) -> None:
    assert parse_parameters(storage_class(params)).action() == action


def test_constructor_validates_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="server"):
        NFSProvisioner(None, "", "/srv", str(tmp_path))
    with pytest.raises(ValueError, match="absolute"):
        NFSProvisioner(None, "s", "srv", str(tmp_path))
    with pytest.raises(ValueError, match=r"'\.\.'"):
        NFSProvisioner(None, "s", "/srv", "/a/../b")
    assert NFSProvisioner(None, "s", "/", str(tmp_path)).export_path == "/"


@settings(max_examples=60, deadline=None)
@given(
    value=st.lists(
        st.sampled_from(["a", "/", ".", "..", "\x00", "é", "$", "b" * 130]), max_size=12
    ).map("".join),
    pattern=st.sampled_from(
        [
            "${.PVC.annotations.p}",
            "${.PVC.annotations.p}/${.PVC.name}",
            "x/${.PVC.annotations.p}/y",
            "${.PVC.namespace}${.PVC.annotations.p}",
        ]
    ),
)
def test_nothing_is_ever_created_outside_the_export(value: str, pattern: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        export = root / "deep" / "export"
        export.mkdir(parents=True)
        sc = storage_class({"pathPattern": pattern})
        pvc = claim(annotations={"p": value})
        try:
            pv = asyncio.run(provisioner(export).provision(options(pvc, sc)))
        except ProvisioningError:
            assert tree(export) == []
        else:
            relative = pv.spec.nfs.path.removeprefix("/srv/share/")
            assert (export / relative).is_dir()
            assert (export / relative).resolve().is_relative_to(export.resolve())
        outside = [p for p in tree(root) if not p.startswith("deep/export")]
        assert outside == ["deep"]
