"""The RBD provisioner called directly: parameter parsing with the in-tree names and defaults,
image naming, Secrets read through the real client from the in-memory API server, and delete /
expand edge cases (foreign PVs, images already gone, missing classes) on the real Ceph."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    StorageV1Api,
    V1CSIPersistentVolumeSource,
    V1HostPathVolumeSource,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1PersistentVolumeSpec,
    V1RBDPersistentVolumeSource,
    V1Secret,
    V1StorageClass,
    V1VolumeResourceRequirements,
)

from pyprovlib._provisioner import (
    IgnoredError,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
)
from pyprovlib._resizer import ResizeError
from pyprovlib.examples.rbd import RBDProvisioner, RBDResizer
from pyprovlib.examples.rbd._provisioner import image_name_for, parse_parameters
from pyprovlib.examples.rbd._rbd_cli import RbdNotFoundError, RbdRunner
from pyprovlib.testing._server import ApiServer

KEY = "AQBd2jxnAAAAABAAtQTe0p6RRhW1ffhc9c3LkA=="


def sc(params: dict[str, str], name: str = "fast") -> V1StorageClass:
    return V1StorageClass(
        metadata=V1ObjectMeta(name=name), provisioner="pyprovlib.io/rbd", parameters=params
    )


BASE = {"monitors": "10.0.0.1:6789", "adminSecretName": "admin", "userSecretName": "user"}


def test_defaults_are_the_in_tree_ones() -> None:
    p = parse_parameters(sc(BASE))
    assert p.monitors == ("10.0.0.1:6789",)
    assert (p.pool, p.admin_id, p.admin_secret_namespace) == ("rbd", "admin", "default")
    assert (p.user_id, p.user_secret_namespace) == (None, None)
    assert (p.image_format, p.image_features, p.fs_type) == (2, ("layering",), None)


def test_names_match_case_insensitively_like_in_tree() -> None:
    p = parse_parameters(
        sc(
            {
                "MONITORS": "a:1,b:2",
                "AdminSecretName": "admin",
                "usersecretname": "user",
                "USERID": "kube",
                "Pool": "",  # empty means the default, as in-tree
                "imagefeatures": "",
                "FSTYPE": "xfs",
            }
        )
    )
    assert p.monitors == ("a:1", "b:2")
    assert (p.user_id, p.pool, p.image_features, p.fs_type) == ("kube", "rbd", (), "xfs")


def test_format_1_has_no_features() -> None:
    assert parse_parameters(sc({**BASE, "imageFormat": "1"})).image_features == ()


def test_delete_does_not_need_the_user_secret() -> None:
    params = {"monitors": "m:1", "adminSecretName": "admin"}
    with pytest.raises(ProvisioningError, match="userSecretName is required"):
        parse_parameters(sc(params))
    assert parse_parameters(sc(params), for_delete=True).user_secret_name is None


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"adminSecretName": "Bad_Name"}, "adminSecretName 'Bad_Name' is not a valid"),
        ({"userSecretNamespace": "-ns"}, "userSecretNamespace '-ns' is not a valid"),
        ({"userId": "-x"}, "userId '-x' is invalid"),
        ({"imageFeatures": "fast-diff,exclusive-lock"}, "fast-diff requires object-map"),
    ],
)
def test_rejections(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(ProvisioningError, match="StorageClass 'fast'") as info:
        parse_parameters(sc({**BASE, **params}))
    assert fragment in str(info.value)
    assert info.value.state is ProvisioningState.FINISHED


def test_image_names_are_stable_per_pv() -> None:
    a = image_name_for("pvc-1")
    assert a == image_name_for("pvc-1")
    assert a != image_name_for("pvc-2")
    assert a.startswith("kubernetes-dynamic-pvc-")
    assert len(a) == len("kubernetes-dynamic-pvc-") + 36


@pytest.fixture
async def client() -> AsyncIterator[ApiClient]:
    async with ApiServer() as server, server.api_client() as c:
        yield c


def claim(modes: list[str], size: str = "1Gi") -> V1PersistentVolumeClaim:
    return V1PersistentVolumeClaim(
        metadata=V1ObjectMeta(name="data", namespace="default", uid="u1"),
        spec=V1PersistentVolumeClaimSpec(
            access_modes=modes,
            resources=V1VolumeResourceRequirements(requests={"storage": size}),
        ),
    )


async def secret(client: ApiClient, name: str, data: dict[str, str], type_: str) -> None:
    await CoreV1Api(client).create_namespaced_secret(
        "default",
        V1Secret(metadata=V1ObjectMeta(name=name), type=type_, data=data or None),
    )


async def test_access_modes_are_checked_first(client: ApiClient) -> None:
    prov = RBDProvisioner(client)
    with pytest.raises(ProvisioningError, match="only AccessModes") as info:
        await prov.provision(ProvisionOptions(sc(BASE), "pvc-u1", claim(["ReadWriteMany"])))
    assert "ReadWriteMany" in str(info.value)


async def test_reading_keys(client: ApiClient) -> None:
    prov = RBDProvisioner(client)
    enc = base64.b64encode(KEY.encode()).decode()
    await secret(
        client,
        "good",
        {"key": base64.b64encode(f" {KEY}\n".encode()).decode()},
        "kubernetes.io/rbd",
    )
    await secret(client, "opaque", {"key": enc}, "Opaque")
    await secret(client, "other", {"password": enc}, "kubernetes.io/rbd")
    assert await prov.read_key("default", "good") == KEY
    with pytest.raises(LookupError, match="type 'Opaque'"):
        await prov.read_key("default", "opaque")
    with pytest.raises(LookupError, match="no data key 'key'"):
        await prov.read_key("default", "other")
    with pytest.raises(LookupError, match="Secret default/absent not found"):
        await prov.read_key("default", "absent")


async def test_missing_admin_secret_is_no_change(client: ApiClient) -> None:
    prov = RBDProvisioner(client)
    with pytest.raises(ProvisioningError) as info:
        await prov.provision(ProvisionOptions(sc(BASE), "pvc-u1", claim(["ReadWriteOnce"])))
    assert info.value.state is ProvisioningState.NO_CHANGE
    assert "Secret default/admin not found" in str(info.value)


def rbd_pv(image: str, monitors: str, class_name: str | None = "fast") -> V1PersistentVolume:
    return V1PersistentVolume(
        metadata=V1ObjectMeta(name="pvc-x"),
        spec=V1PersistentVolumeSpec(
            storage_class_name=class_name,
            rbd=V1RBDPersistentVolumeSource(monitors=[monitors], image=image, pool="rbd"),
        ),
    )


async def test_delete_ignores_foreign_volumes(client: ApiClient) -> None:
    prov = RBDProvisioner(client)
    hostpath = V1PersistentVolume(
        metadata=V1ObjectMeta(name="h"),
        spec=V1PersistentVolumeSpec(host_path=V1HostPathVolumeSource(path="/tmp")),
    )
    with pytest.raises(IgnoredError, match="not an RBD volume"):
        await prov.delete(hostpath)
    with pytest.raises(IgnoredError, match="not created by this provisioner"):
        await prov.delete(rbd_pv("static-image", "m:1"))


async def test_delete_needs_the_class(client: ApiClient) -> None:
    prov = RBDProvisioner(client)
    with pytest.raises(RuntimeError, match="StorageClass 'fast' not found"):
        await prov.delete(rbd_pv(image_name_for("pvc-x"), "m:1"))
    with pytest.raises(RuntimeError, match="has no StorageClass"):
        await prov.delete(rbd_pv(image_name_for("pvc-x"), "m:1", class_name=None))
    with pytest.raises(RuntimeError, match="monitor '-m' is invalid"):
        await prov.delete(rbd_pv(image_name_for("pvc-x"), "-m"))
    with pytest.raises(RuntimeError, match="image 'kubernetes-dynamic-pvc-x --id y' is invalid"):
        await prov.delete(rbd_pv("kubernetes-dynamic-pvc-x --id y", "m:1"))


@pytest.mark.ceph
async def test_delete_and_expand_of_a_missing_image(client: ApiClient, ceph: Any) -> None:
    await secret(
        client,
        "admin",
        {"key": base64.b64encode(ceph.admin_key.encode()).decode()},
        "kubernetes.io/rbd",
    )
    await StorageV1Api(client).create_storage_class(
        sc({**BASE, "monitors": ceph.monitors, "adminSecretNamespace": "default"})
    )
    prov = RBDProvisioner(client, RbdRunner(timeout=10))
    pv = rbd_pv(image_name_for("pvc-never-created"), ceph.monitors)
    await prov.delete(pv)  # already gone = success
    with pytest.raises(RbdNotFoundError, match="does not exist"):
        await prov.expand(pv, 1 << 20)
    # Through the Resizer contract: an infeasible request, not retried quickly.
    resizer = RBDResizer(prov)
    assert resizer.can_support(pv)
    with pytest.raises(ResizeError, match="does not exist") as info:
        await resizer.expand(pv, 1 << 20)
    assert info.value.infeasible
    assert info.value.final


async def test_resizer_supports_only_its_images(client: ApiClient) -> None:
    resizer = RBDResizer(RBDProvisioner(client), "pyprovlib.io/rbd")
    assert resizer.name == "pyprovlib.io/rbd"
    assert resizer.can_support(rbd_pv(image_name_for("pvc-1"), "m:1"))
    assert not resizer.can_support(rbd_pv("static", "m:1"))
    csi = V1CSIPersistentVolumeSource(driver="x", volume_handle="h")
    assert not resizer.can_support(V1PersistentVolume(spec=V1PersistentVolumeSpec(csi=csi)))
    assert not resizer.can_support(V1PersistentVolume())
