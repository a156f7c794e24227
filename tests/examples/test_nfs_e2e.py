"""End to end: the NFS example under the real ProvisionController, against the ``kube_cluster``
(in memory, or a real cluster with PYPROVLIB_E2E_KUBECONFIG). A temporary directory stands for
the export mounted into the provisioner; the PVs name a fake server, which is fine since no pod
mounts them (the classes bind immediately)."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_support import (
    claim_model,
    create_claim,
    create_class,
    running,
    tree,
    wait_bound,
    wait_pv_gone,
)
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api

from pyprovlib.examples.nfs import NFSProvisioner
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

SERVER = "nfs.example.test"
EXPORT = "/exports/k8s"


@pytest.fixture
def export(tmp_path: Path) -> Path:
    path = tmp_path / "export"
    path.mkdir()
    return path


async def make_class(
    c: TestCluster, provisioner: str, params: dict[str, str], mount_options: list[str] | None = None
) -> str:
    return await create_class(
        c, "nfs", provisioner, parameters=params or None, mount_options=mount_options
    )


async def make_claim(
    c: TestCluster,
    sc: str,
    name: str = "data",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> str:
    claim = claim_model(name, sc, "5Gi", ["ReadWriteMany"], annotations=annotations, labels=labels)
    return await create_claim(c, claim)


@pytest.mark.parametrize(
    ("params", "outcome"),
    [
        ({}, "archived"),
        ({"archiveOnDelete": "true"}, "archived"),
        ({"archiveOnDelete": "false"}, "removed"),
        ({"onDelete": "delete", "archiveOnDelete": "true"}, "removed"),
        ({"onDelete": "retain"}, "kept"),
    ],
)
async def test_create_bind_write_delete(
    kube_cluster: TestCluster, export: Path, params: dict[str, str], outcome: str
) -> None:
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/nfs-e2e")
    sc = await make_class(c, name, params, mount_options=["nfsvers=4.1", "hard"])
    claim = await make_claim(c, sc)
    prov = NFSProvisioner(c.api_client, SERVER, EXPORT, str(export))
    async with running(c.api_client, name, prov):
        pv = await wait_bound(c, claim)
        subdir = f"{c.namespace}-{claim}-{pv.metadata.name}"
        assert pv.spec.nfs.server == SERVER
        assert pv.spec.nfs.path == f"{EXPORT}/{subdir}"
        assert pv.spec.mount_options == ["nfsvers=4.1", "hard"]
        assert pv.spec.capacity["storage"] == "5Gi"
        assert pv.spec.access_modes == ["ReadWriteMany"]
        (export / subdir / "f.txt").write_text("data")

        await CoreV1Api(c.api_client).delete_namespaced_persistent_volume_claim(claim, c.namespace)
        await wait_pv_gone(c, pv.metadata.name)
    expected = {
        "archived": [f"archived-{subdir}", f"archived-{subdir}/f.txt"],
        "removed": [],
        "kept": [subdir, f"{subdir}/f.txt"],
    }[outcome]
    assert tree(export) == expected


async def test_path_pattern(kube_cluster: TestCluster, export: Path) -> None:
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/nfs-e2e")
    sc = await make_class(
        c,
        name,
        {
            "pathPattern": "${.PVC.namespace}/${.PVC.labels.team}/${.PVC.annotations.app}",
            "archiveOnDelete": "false",
        },
    )
    claim = await make_claim(c, sc, labels={"team": "blue"}, annotations={"app": "web"})
    prov = NFSProvisioner(c.api_client, SERVER, EXPORT, str(export))
    async with running(c.api_client, name, prov):
        pv = await wait_bound(c, claim)
        assert pv.spec.nfs.path == f"{EXPORT}/{c.namespace}/blue/web"
        assert (export / c.namespace / "blue" / "web").is_dir()
        await CoreV1Api(c.api_client).delete_namespaced_persistent_volume_claim(claim, c.namespace)
        await wait_pv_gone(c, pv.metadata.name)
    # Only the leaf is the volume; the parents made for it stay, as upstream.
    assert tree(export) == [c.namespace, f"{c.namespace}/blue"]


@pytest.mark.parametrize(
    ("pattern", "annotations", "fragment"),
    [
        ("../x", {}, "must not contain '..'"),
        ("${.PVC.annotations.p}", {"p": "../../etc"}, "must not contain '..'"),
        ("${.PVC.annotations.p}/x", {"p": "/etc"}, "must be relative"),
        ("${.PVC.annotations.p}", {"p": "n" * 300}, "longer than 255 bytes"),
        ("${.PVC.annotations.p}", {"p": "a\x00b"}, "contains a NUL byte"),
    ],
)
async def test_escaping_paths_get_an_event(
    kube_cluster: TestCluster,
    tmp_path: Path,
    export: Path,
    pattern: str,
    annotations: dict[str, str],
    fragment: str,
) -> None:
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/nfs-e2e")
    sc = await make_class(c, name, {"pathPattern": pattern})
    claim = await make_claim(c, sc, annotations=annotations)
    prov = NFSProvisioner(c.api_client, SERVER, EXPORT, str(export))
    core = CoreV1Api(c.api_client)
    async with running(c.api_client, name, prov):

        async def failed() -> str | None:
            for ev in (await core.list_namespaced_event(c.namespace)).items:
                if (
                    ev.involved_object.name == claim
                    and ev.reason == "ProvisioningFailed"
                    and fragment in (ev.message or "")
                ):
                    return str(ev.message)
            return None

        message = await c.wait_for(failed, message=f"ProvisioningFailed with {fragment!r}")
    assert f"claim {c.namespace}/{claim}" in message
    assert "stay inside the NFS export" in message
    pvc = await core.read_namespaced_persistent_volume_claim(claim, c.namespace)
    assert pvc.status.phase == "Pending"
    assert tree(tmp_path) == ["export"]


@pytest.mark.parametrize(
    ("params", "prepare"),
    [
        ({"onDelete": "delete"}, "nothing"),
        ({"archiveOnDelete": "true"}, "directory gone"),
        ({"archiveOnDelete": "true"}, "archive name taken"),
    ],
)
async def test_delete_reads_the_class_from_the_controllers_cache(
    kube_cluster: TestCluster, export: Path, params: dict[str, str], prepare: str
) -> None:
    """With ``read_classes_from`` (as ``python -m pyprovlib.examples.nfs`` wires it) the class of
    a deleted volume comes from the controller's StorageClass cache: this provisioner has no
    API client to GET it with, and still applies the class's onDelete. With the class at hand
    the directory is found and removed or archived in one step: a directory already gone is
    still success, and an archive name already taken still leads to an archive of its own."""
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/nfs-e2e")
    sc = await make_class(c, name, params)
    claim = await make_claim(c, sc)
    prov = NFSProvisioner(None, SERVER, EXPORT, str(export))
    async with running(c.api_client, name, prov) as controller:
        prov.read_classes_from(controller.class_informer)
        pv = await wait_bound(c, claim)
        pv_name = pv.metadata.name
        subdir = f"{c.namespace}-{claim}-{pv_name}"
        assert tree(export) == [subdir]
        (export / subdir / "f.txt").write_text("data")
        if prepare == "directory gone":
            (export / subdir / "f.txt").unlink()
            (export / subdir).rmdir()
        elif prepare == "archive name taken":
            (export / f"archived-{subdir}").mkdir()
        await CoreV1Api(c.api_client).delete_namespaced_persistent_volume_claim(claim, c.namespace)
        await wait_pv_gone(c, pv_name)
    expected = {
        "nothing": [],
        "directory gone": [],
        "archive name taken": [
            f"archived-{subdir}",
            f"archived-{subdir}-{pv_name}",
            f"archived-{subdir}-{pv_name}/f.txt",
        ],
    }[prepare]
    assert tree(export) == expected


async def test_delete_without_the_class_needs_no_class_when_the_directory_is_gone(
    kube_cluster: TestCluster, export: Path
) -> None:
    """A volume whose class was deleted (so neither the cache nor a GET has it): a directory
    already gone is success, as in nfs-subdir, which looks at the directory first; a directory
    still there is kept, and the PV with it, until the class tells what to do with it."""
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/nfs-e2e")
    sc = await make_class(c, name, {"onDelete": "delete"})
    first = await make_claim(c, sc, name="gone")
    second = await make_claim(c, sc, name="kept")
    prov = NFSProvisioner(None, SERVER, EXPORT, str(export))
    core = CoreV1Api(c.api_client)
    async with running(c.api_client, name, prov) as controller:
        prov.read_classes_from(controller.class_informer)
        gone = (await wait_bound(c, first)).metadata.name
        kept = (await wait_bound(c, second)).metadata.name
        await StorageV1Api(c.api_client).delete_storage_class(sc)

        async def uncached() -> bool:
            return controller.class_informer.store.get_by_key(sc) is None

        await c.wait_for(uncached, message=f"StorageClass {sc} gone from the cache")
        (export / f"{c.namespace}-{first}-{gone}").rmdir()
        await core.delete_namespaced_persistent_volume_claim(first, c.namespace)
        await core.delete_namespaced_persistent_volume_claim(second, c.namespace)
        await wait_pv_gone(c, gone)

        async def failed() -> str | None:
            for ev in (await core.list_event_for_all_namespaces()).items:
                if ev.involved_object.name == kept and ev.reason == "VolumeFailedDelete":
                    return str(ev.message)
            return None

        message = await c.wait_for(failed, message=f"VolumeFailedDelete on {kept}")
    assert "needs an API client" in message
    assert (await core.read_persistent_volume(kept)).metadata.name == kept
    assert tree(export) == [f"{c.namespace}-{second}-{kept}"]
