"""Path traversal through everything a claim (or an edited PV) can influence (issue 11).

The NFS provisioner expands its class's ``pathPattern`` with the claim's name, namespace,
labels and annotations; the hostpath provisioner joins ``basePath`` and the PV name; both
delete what a PV names. hypothesis feeds them hostile values — ``..``, absolute paths, slashes,
NUL, unicode, over-long names — with a symlink planted inside the export that points outside.
Whatever happens (a volume, or a refusal), nothing is created, changed or removed outside the
root: a sentinel tree beside the export is compared before and after every example.
"""

# Synchronous filesystem checks of a temporary directory are the point of these tests.
# ruff: noqa: ASYNC240

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

from claim_support import class_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import (
    ApiClient,
    V1LocalVolumeSource,
    V1NFSVolumeSource,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1PersistentVolumeSpec,
    V1StorageClass,
    V1VolumeResourceRequirements,
)

from pyprovlib._provisioner import IgnoredError, ProvisionOptions
from pyprovlib.examples.hostpath._provisioner import HostPathProvisioner, LocalDirectories
from pyprovlib.examples.nfs._provisioner import NFSProvisioner
from pyprovlib.kube._resources import STORAGE_CLASSES
from pyprovlib.kube._rest import ApiException, ResourceClient

_rounds = itertools.count()

HOSTILE = [
    "..",
    "../..",
    "../../outside",
    "/etc",
    "/",
    "a/../../b",
    "link",
    "link/x",
    "./..",
    "...",
    "a\x00b",
    "x" * 300,
    "é/../..",
    "%2e%2e",
    "a//..//..",
    "-rf",
    "$(touch pwned)",
    "`id`",
    "~",
]
fragments = st.sampled_from(HOSTILE) | st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20
)
hostile_paths = st.lists(fragments, min_size=1, max_size=4).map("/".join)
patterns = st.sampled_from(
    [
        "${.PVC.annotations.dir}",
        "${.PVC.labels.dir}/${.PVC.name}",
        "${.PVC.namespace}/${.PVC.annotations.dir}",
        "../${.PVC.name}",
        "/abs/${.PVC.name}",
        "${.PVC.annotations.dir}/../..",
    ]
)


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root`` (not following symlinks) with its type, mode and content."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = p.lstat()
            kind = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
            content = os.readlink(p) if kind == "link" else p.read_text() if kind == "file" else ""
            out[str(p.relative_to(root))] = (kind, st_.st_mode, content)
    return out


def make_world(base: Path) -> tuple[Path, Path]:
    """``base/outside`` (sentinels) and ``base/export`` (the root), with a symlink from inside
    the export to the outside and a sentinel file the pattern might aim at."""
    outside = base / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "data").write_text("precious")
    (outside / "pvc-x").mkdir()
    export = base / "export"
    export.mkdir()
    (export / "link").symlink_to(outside)
    return outside, export


def claim(name: str, namespace: str, labels: dict[str, str], annotations: dict[str, str]) -> Any:
    return V1PersistentVolumeClaim(
        metadata=V1ObjectMeta(
            name=name, namespace=namespace, uid="u-1", labels=labels, annotations=annotations
        ),
        spec=V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"],
            resources=V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
        ),
    )


async def nfs_round(
    client: ApiClient, base: Path, pattern: str, value: str, name: str, namespace: str
) -> None:
    outside, export = make_world(base)
    before_outside = tree(outside)
    class_name = f"nfs-{next(_rounds)}"  # one API server serves every example of a test
    sc_body = class_body(
        class_name, "pyprovlib.io/nfs", parameters={"pathPattern": pattern, "onDelete": "delete"}
    )
    await ResourceClient(client, STORAGE_CLASSES).create(sc_body)
    provisioner = NFSProvisioner(client, "nfs.test", "/export", str(export))
    sc = V1StorageClass(
        metadata=V1ObjectMeta(name=class_name),
        provisioner="pyprovlib.io/nfs",
        parameters={"pathPattern": pattern, "onDelete": "delete"},
    )
    options = ProvisionOptions(
        storage_class=sc,
        pv_name="pvc-x",
        pvc=claim(name, namespace, {"dir": value[:63]}, {"dir": value}),
    )
    pv: V1PersistentVolume | None = None
    with contextlib.suppress(Exception):  # a refusal is fine; escaping is not
        pv = await provisioner.provision(options)
    assert tree(outside) == before_outside, f"provision({pattern!r}, {value!r}) escaped"
    if pv is not None:
        made = Path(export, pv.spec.nfs.path.removeprefix("/export/"))
        assert made.is_dir()
        assert not made.is_symlink()
        assert export in made.resolve().parents
        pv.spec.storage_class_name = class_name
        await provisioner.delete(pv)
        assert not made.exists()
    # A PV edited to point anywhere: deleting it never touches the outside either.
    edited = V1PersistentVolume(
        metadata=V1ObjectMeta(name="pvc-x"),
        spec=V1PersistentVolumeSpec(
            storage_class_name=class_name,
            nfs=V1NFSVolumeSource(server="nfs.test", path="/export/" + value),
        ),
    )
    with contextlib.suppress(Exception):
        await provisioner.delete(edited)
    assert tree(outside) == before_outside, f"delete of path {value!r} escaped"


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pattern=patterns,
    value=hostile_paths,
    name=st.sampled_from(["c", "..", "a.b", "x" * 253]),
    namespace=st.sampled_from(["ns", "..", "kube-system"]),
)
async def test_nfs_path_pattern_and_pv_paths_stay_in_the_export(
    kube_client: ApiClient, pattern: str, value: str, name: str, namespace: str
) -> None:
    with tempfile.TemporaryDirectory() as base:
        await nfs_round(kube_client, Path(base), pattern, value, name, namespace)


async def hostpath_round(
    client: ApiClient, base: Path, base_path_param: str, pv_name: str, local_path: str
) -> None:
    outside, _export = make_world(base)
    before_outside = tree(outside)
    provisioner = HostPathProvisioner(client, LocalDirectories())
    node = await provisioner_node(provisioner)
    # Provision with a hostile basePath / PV name: refused or inside the base.
    sc = V1StorageClass(
        metadata=V1ObjectMeta(name="hp"),
        provisioner="pyprovlib.io/hostpath",
        volume_binding_mode="WaitForFirstConsumer",
        parameters={"basePath": base_path_param},
    )
    options = ProvisionOptions(
        storage_class=sc, pv_name=pv_name, pvc=claim("c", "ns", {}, {}), selected_node_name=node
    )
    with contextlib.suppress(Exception):
        await provisioner.provision(options)
    assert tree(outside) == before_outside
    # Delete a PV edited to point anywhere.
    volume = V1PersistentVolume(
        metadata=V1ObjectMeta(name=pv_name),
        spec=V1PersistentVolumeSpec(
            storage_class_name="hp", local=V1LocalVolumeSource(path=local_path)
        ),
    )
    with contextlib.suppress(IgnoredError, Exception):
        await provisioner.delete(volume)
    assert tree(outside) == before_outside, f"delete of {local_path!r} escaped"


async def provisioner_node(provisioner: HostPathProvisioner) -> str:
    from pyprovlib.kube._resources import NODES

    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}
    try:
        await ResourceClient(provisioner.api_client, NODES).create(body)
    except ApiException as err:  # an earlier example of the same test made it
        if err.status != 409:
            raise
    return "node-1"


# basePath and a PV's spec.local.path are written by the administrator (the class, an
# immutable PV source): a base that is itself a symlink is their choice and is followed, so the
# symlink planted in the export is left out of them. Claims cannot influence either.
admin_paths = hostile_paths.filter(lambda v: "link" not in v.split("/"))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    base_suffix=admin_paths,
    pv_name=st.sampled_from(["pvc-x", "victim", "..", "link", "a/b", "x" * 300, ""]),
    local_suffix=admin_paths,
)
async def test_hostpath_base_path_and_pv_paths_stay_inside(
    kube_client: ApiClient, base_suffix: str, pv_name: str, local_suffix: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        export = base / "export"
        await hostpath_round(
            kube_client, base, f"{export}/{base_suffix}", pv_name, f"{export}/{local_suffix}"
        )
