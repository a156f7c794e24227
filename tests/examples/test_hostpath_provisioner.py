"""Unit tests of the hostpath example provisioner in node mode: real temporary directories, and
Node/StorageClass objects read from the in-memory API server over HTTP."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from example_support import claim_model, tree, umask
from hostpath_support import create_node, hostpath_class, local_volume, provision_options
from kubernetes_asyncio.client import (
    ApiClient,
    StorageV1Api,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1StorageClass,
)

from pyprovlib._provisioner import (
    IgnoredError,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
)
from pyprovlib.examples.hostpath import HostPathProvisioner, NodeHostPathProvisioner
from pyprovlib.examples.hostpath._provisioner import (
    ANNOTATION_NODE,
    ANNOTATION_ON_DELETE,
    ANNOTATION_SELECTED_NODE,
    LocalDirectories,
    parse_parameters,
)

NODE = "worker-1"
HOSTNAME = "worker-1.example.internal"


async def node(client: ApiClient, name: str = NODE, hostname: str | None = HOSTNAME) -> None:
    await create_node(client, name, hostname)


def storage_class(
    params: dict[str, str] | None = None, binding: str | None = "WaitForFirstConsumer"
) -> V1StorageClass:
    return hostpath_class(params, binding, reclaim_policy="Delete")


def claim(node: str | None = NODE, name: str = "data") -> V1PersistentVolumeClaim:
    selected = {ANNOTATION_SELECTED_NODE: node} if node else None
    return claim_model(
        name, None, "2Gi", volume_mode="Filesystem", namespace="default", annotations=selected
    )


def options(
    sc: V1StorageClass, pvc: V1PersistentVolumeClaim | None = None, pv: str = "pvc-0001"
) -> ProvisionOptions:
    return provision_options(sc, pvc or claim(), pv)


async def test_provision_creates_directory_and_local_pv(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await node(kube_client)
    base = tmp_path / "base"
    base.mkdir()
    prov = NodeHostPathProvisioner(kube_client, NODE)
    with umask(0o077):
        pv = await prov.provision(options(storage_class({"basePath": str(base)})))
    d = base / "pvc-0001"
    assert d.is_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o777
    assert pv.metadata.name == "pvc-0001"
    assert pv.spec.local.path == str(d)
    assert not pv.spec.local.fs_type
    assert pv.spec.capacity == {"storage": "2Gi"}
    assert pv.spec.access_modes == ["ReadWriteOnce"]
    assert pv.spec.volume_mode == "Filesystem"
    (term,) = pv.spec.node_affinity.required.node_selector_terms
    (req,) = term.match_expressions
    # The node's real hostname label, not its name.
    assert (req.key, req.operator, req.values) == ("kubernetes.io/hostname", "In", [HOSTNAME])
    assert pv.metadata.annotations == {ANNOTATION_NODE: NODE, ANNOTATION_ON_DELETE: "delete"}
    # Idempotent on retry.
    again = await prov.provision(options(storage_class({"basePath": str(base)})))
    assert again.spec.local.path == pv.spec.local.path


async def test_hostname_falls_back_to_node_name(kube_client: ApiClient, tmp_path: Path) -> None:
    await node(kube_client, hostname=None)
    prov = NodeHostPathProvisioner(kube_client, NODE, dir_mode=0o750)
    pv = await prov.provision(options(storage_class({"basePath": str(tmp_path)})))
    values = pv.spec.node_affinity.required.node_selector_terms[0].match_expressions[0].values
    assert values == [NODE]
    assert stat.S_IMODE((tmp_path / "pvc-0001").stat().st_mode) == 0o750


async def test_immediate_binding_without_a_selected_node_is_refused(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await node(kube_client)
    prov = HostPathProvisioner(kube_client, LocalDirectories())
    for binding in ("Immediate", None):
        sc = storage_class({"basePath": str(tmp_path)}, binding=binding)
        with pytest.raises(ProvisioningError, match="requires volumeBindingMode") as info:
            await prov.provision(options(sc, claim(node=None)))
        assert "WaitForFirstConsumer" in str(info.value)
        assert "'local'" in str(info.value)
        assert "default/data" in str(info.value)
        assert "--node-deployment-immediate-binding" in str(info.value)
    assert tree(tmp_path) == []


async def test_immediate_binding_with_a_selected_node_is_provisioned(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    # A node deployment's instance selected its own node for the Immediate claim.
    await node(kube_client)
    prov = NodeHostPathProvisioner(kube_client, NODE)
    pv = await prov.provision(options(storage_class({"basePath": str(tmp_path)}, binding=None)))
    assert pv.spec.local.path == str(tmp_path / "pvc-0001")
    assert tree(tmp_path) == ["pvc-0001"]


@pytest.mark.parametrize(
    ("base", "fragment"),
    [
        ("/", "root directory"),
        ("relative/path", "absolute"),
        ("/a/../b", "'..'"),
        ("/tmp/x\x00y", "NUL"),
        ("/" + "n" * 300, "longer than 255"),
        ("/tmp/a/", "not normalized"),
    ],
)
async def test_bad_base_path(kube_client: ApiClient, base: str, fragment: str) -> None:
    with pytest.raises(ProvisioningError, match=fragment) as info:
        parse_parameters(storage_class({"basePath": base}))
    assert "StorageClass 'local'" in str(info.value)
    assert "basePath" in str(info.value)


async def test_bad_base_path_creates_nothing(kube_client: ApiClient, tmp_path: Path) -> None:
    await node(kube_client)
    prov = NodeHostPathProvisioner(kube_client, NODE)
    with pytest.raises(ProvisioningError):
        await prov.provision(options(storage_class({"basePath": f"{tmp_path}/x/../.."}), pv="p"))
    assert tree(tmp_path) == []


async def test_unknown_parameters_are_named(kube_client: ApiClient) -> None:
    with pytest.raises(ProvisioningError, match="unknown parameter\\(s\\) basepath, size"):
        parse_parameters(storage_class({"basepath": "/x", "size": "1"}))
    with pytest.raises(ProvisioningError, match="onDelete='keep'"):
        parse_parameters(storage_class({"onDelete": "keep"}))


async def test_missing_selected_node_reschedules(kube_client: ApiClient, tmp_path: Path) -> None:
    prov = NodeHostPathProvisioner(kube_client, NODE)
    with pytest.raises(ProvisioningError, match="does not exist") as info:
        await prov.provision(options(storage_class({"basePath": str(tmp_path)})))
    assert info.value.state is ProvisioningState.RESCHEDULE


async def test_base_path_must_be_mounted(kube_client: ApiClient, tmp_path: Path) -> None:
    await node(kube_client)
    prov = NodeHostPathProvisioner(kube_client, NODE)
    missing = tmp_path / "not-mounted"
    with pytest.raises(ProvisioningError, match="mount the host directory"):
        await prov.provision(options(storage_class({"basePath": str(missing)})))
    assert not missing.exists()


async def test_symlinked_volume_dir_is_refused(kube_client: ApiClient, tmp_path: Path) -> None:
    await node(kube_client)
    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    outside.chmod(0o700)
    (base / "pvc-0001").symlink_to(outside)
    prov = NodeHostPathProvisioner(kube_client, NODE)
    with pytest.raises(ProvisioningError, match="symbolic link"):
        await prov.provision(options(storage_class({"basePath": str(base)})))
    assert stat.S_IMODE(outside.stat().st_mode) == 0o700


async def test_qualifier_and_other_nodes(kube_client: ApiClient, tmp_path: Path) -> None:
    prov = NodeHostPathProvisioner(kube_client, NODE)
    assert await prov.should_provision(claim(NODE))
    assert not await prov.should_provision(claim("worker-2"))
    assert not await prov.should_provision(claim(None))
    with pytest.raises(IgnoredError):
        await prov.provision(options(storage_class({"basePath": str(tmp_path)}), claim("other")))


def local_pv(
    path: str, name: str = "pvc-0001", node: str | None = NODE, on_delete: str | None = None
) -> V1PersistentVolume:
    annotations = {}
    if node:
        annotations[ANNOTATION_NODE] = node
    if on_delete:
        annotations[ANNOTATION_ON_DELETE] = on_delete
    return local_volume(name, path, annotations)


async def test_delete_removes_archives_and_tolerates_missing(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await node(kube_client)
    prov = NodeHostPathProvisioner(kube_client, NODE)
    (tmp_path / "pvc-0001").mkdir()
    (tmp_path / "pvc-0001" / "file").write_text("x")
    await prov.delete(local_pv(str(tmp_path / "pvc-0001"), on_delete="delete"))
    assert tree(tmp_path) == []
    await prov.delete(local_pv(str(tmp_path / "pvc-0001"), on_delete="delete"))  # gone: fine

    (tmp_path / "pvc-0002").mkdir()
    (tmp_path / "pvc-0002" / "file").write_text("keep")
    await prov.delete(local_pv(str(tmp_path / "pvc-0002"), "pvc-0002", on_delete="retain"))
    assert (tmp_path / "archived-pvc-0002" / "file").read_text() == "keep"
    assert not (tmp_path / "pvc-0002").exists()
    await prov.delete(local_pv(str(tmp_path / "pvc-0002"), "pvc-0002", on_delete="retain"))


async def test_delete_policy_from_class_when_not_recorded(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await node(kube_client)
    await StorageV1Api(kube_client).create_storage_class(
        storage_class({"basePath": str(tmp_path), "onDelete": "retain"})
    )
    (tmp_path / "pvc-0003").mkdir()
    prov = NodeHostPathProvisioner(kube_client, NODE)
    await prov.delete(local_pv(str(tmp_path / "pvc-0003"), "pvc-0003"))
    assert tree(tmp_path) == ["archived-pvc-0003"]


async def test_delete_without_class_or_record_fails_safe(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await node(kube_client)
    (tmp_path / "pvc-0004").mkdir()
    prov = NodeHostPathProvisioner(kube_client, NODE)
    with pytest.raises(RuntimeError, match="recreate the class"):
        await prov.delete(local_pv(str(tmp_path / "pvc-0004"), "pvc-0004"))
    assert tree(tmp_path) == ["pvc-0004"]


async def test_delete_refuses_foreign_paths_and_nodes(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await node(kube_client)
    await node(kube_client, "worker-2", "worker-2")
    victim = tmp_path / "precious"
    victim.mkdir()
    prov = NodeHostPathProvisioner(kube_client, NODE)
    # A PV whose path was edited to point at something that is not <basePath>/<pv name>.
    with pytest.raises(RuntimeError, match="refusing"):
        await prov.delete(local_pv(str(victim), on_delete="delete"))
    with pytest.raises(ValueError, match="root directory"):
        await prov.delete(local_pv("/pvc-0001", on_delete="delete"))
    # Another node's volume is left to that node's provisioner.
    (tmp_path / "pvc-0005").mkdir()
    with pytest.raises(IgnoredError):
        await prov.delete(local_pv(str(tmp_path / "pvc-0005"), "pvc-0005", node="worker-2"))
    assert tree(tmp_path) == ["precious", "pvc-0005"]
    # Recognised by hostname label when the node annotation is missing.
    pv = local_pv(str(tmp_path / "pvc-0005"), "pvc-0005", node=None, on_delete="delete")
    pv.spec.node_affinity = (
        await prov.provision(options(storage_class({"basePath": str(tmp_path)}), pv="pvc-0005"))
    ).spec.node_affinity
    await prov.delete(pv)
    assert tree(tmp_path) == ["precious"]
