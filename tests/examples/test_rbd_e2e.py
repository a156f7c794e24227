"""End to end: the RBD example under the real ProvisionController, the Kubernetes side on the
``kube_cluster`` (in-memory API server through the real kubernetes-asyncio client), the Ceph
side a real single-node cluster (``ceph`` fixture) checked independently with ``rbd``.

Covered: claim → Bound PV → image as specified → expand → delete; delete refused with an event
while the image is watched, then done; bad parameters and injection attempts, missing Secrets
and an unreachable cluster each end in a ProvisioningFailed event with the controller still
running; the cephx key never shows in logs, events, exceptions or any process's argv."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import example_support
import pytest
import structlog
from example_support import claim_model, create_claim, create_class
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    V1ObjectMeta,
    V1Secret,
)
from prometheus_client import CollectorRegistry

from pyprovlib.controller._provision import ProvisionController
from pyprovlib.controller._resize import ResizeController
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.examples.rbd import RBDProvisioner, RBDResizer
from pyprovlib.examples.rbd._provisioner import image_name_for
from pyprovlib.examples.rbd._rbd_cli import MIB, RbdRunner
from pyprovlib.kube._quantity import parse_storage_size
from pyprovlib.testing._cluster import TestCluster

pytestmark = [pytest.mark.e2e, pytest.mark.ceph]


def running(
    client: ApiClient, name: str, provisioner: RBDProvisioner
) -> contextlib.AbstractAsyncContextManager[ProvisionController]:
    return example_support.running(client, name, provisioner, stop_timeout=30)


async def wait_bound(c: TestCluster, claim: str) -> Any:
    return await example_support.wait_bound(c, claim, timeout=60)


async def wait_pv_gone(c: TestCluster, pv: str) -> None:
    await example_support.wait_pv_gone(c, pv, timeout=60)


async def make_secret(c: TestCluster, name: str, key: str, type_: str = "kubernetes.io/rbd") -> str:
    await CoreV1Api(c.api_client).create_namespaced_secret(
        c.namespace,
        V1Secret(
            metadata=V1ObjectMeta(name=name),
            type=type_,
            data={"key": base64.b64encode(key.encode()).decode()},
        ),
    )
    return name


def class_params(c: TestCluster, ceph: Any, **extra: str) -> dict[str, str]:
    params = {
        "monitors": ceph.monitors,
        "adminId": "admin",
        "adminSecretName": "ceph-admin",
        "adminSecretNamespace": c.namespace,
        "userSecretName": "ceph-user",
        "fsType": "ext4",
    }
    params.update(extra)
    return {k: v for k, v in params.items() if v != "<unset>"}


async def make_class(
    c: TestCluster, provisioner: str, params: dict[str, str], *, expandable: bool = False
) -> str:
    return await create_class(
        c, "rbd", provisioner, parameters=params, allow_volume_expansion=expandable or None
    )


async def make_claim(
    c: TestCluster, sc: str, size: str = "1500Ki", mode: str = "Filesystem"
) -> str:
    return await create_claim(c, claim_model(c.unique_name("data"), sc, size, volume_mode=mode))


async def wait_event(c: TestCluster, name: str, reason: str, fragment: str) -> str:
    core = CoreV1Api(c.api_client)

    async def found() -> str | None:
        for ev in (await core.list_event_for_all_namespaces()).items:
            if (
                ev.involved_object.name == name
                and ev.reason == reason
                and fragment in (ev.message or "")
            ):
                return str(ev.message)
        return None

    return await c.wait_for(found, timeout=60, message=f"{reason} on {name} with {fragment!r}")


async def all_events(c: TestCluster) -> str:
    items = (await CoreV1Api(c.api_client).list_event_for_all_namespaces()).items
    return json.dumps([c.api_client.sanitize_for_serialization(e) for e in items])


def images(ceph: Any) -> list[str]:
    return list(ceph.rbd("ls", "--pool", "rbd").split())


@pytest.fixture
async def secrets(kube_cluster: TestCluster, ceph: Any) -> TestCluster:
    await make_secret(kube_cluster, "ceph-admin", ceph.admin_key)
    await make_secret(kube_cluster, "ceph-user", ceph.admin_key)
    return kube_cluster


async def test_provision_expand_delete(secrets: TestCluster, ceph: Any) -> None:
    c = secrets
    name = c.unique_name("pyprovlib.io/rbd-e2e")
    sc = await make_class(c, name, class_params(c, ceph, imageFeatures="layering,exclusive-lock"))
    claim = await make_claim(c, sc, "1500Ki")
    prov = RBDProvisioner(c.api_client, RbdRunner(timeout=10))
    async with running(c.api_client, name, prov):
        pv = await wait_bound(c, claim)
        image = pv.spec.rbd.image
        assert image == image_name_for(pv.metadata.name)
        assert image.startswith("kubernetes-dynamic-pvc-")
        assert pv.spec.rbd.monitors == [ceph.monitors]
        assert pv.spec.rbd.pool == "rbd"
        assert pv.spec.rbd.user == "admin"
        assert pv.spec.rbd.fs_type == "ext4"
        assert pv.spec.rbd.secret_ref.name == "ceph-user"
        assert pv.spec.rbd.secret_ref.namespace == c.namespace
        # 1500Ki rounds up to 2 MiB.
        assert pv.spec.capacity == {"storage": "2Mi"}
        assert pv.spec.access_modes == ["ReadWriteOnce"]
        assert pv.spec.persistent_volume_reclaim_policy == "Delete"
        assert pv.metadata.annotations["pv.kubernetes.io/provisioned-by"] == name
        assert pv.metadata.annotations["kubernetes.io/createdby"] == "rbd-dynamic-provisioner"

        info = ceph.rbd_json("info", "--pool", "rbd", "--image", image)
        assert info["size"] == 2 * MIB
        assert info["format"] == 2
        assert sorted(info["features"]) == ["exclusive-lock", "layering"]

        assert await prov.expand(pv, 10 * MIB + 1) == 11 * MIB
        assert ceph.rbd_json("info", "--pool", "rbd", "--image", image)["size"] == 11 * MIB
        # Never shrinks; no resize when already large enough.
        assert await prov.expand(pv, 3 * MIB) == 11 * MIB
        assert ceph.rbd_json("info", "--pool", "rbd", "--image", image)["size"] == 11 * MIB

        await CoreV1Api(c.api_client).delete_namespaced_persistent_volume_claim(claim, c.namespace)
        await wait_pv_gone(c, pv.metadata.name)
    assert image not in images(ceph)


async def test_resize_controller_grows_the_image(secrets: TestCluster, ceph: Any) -> None:
    c = secrets
    name = c.unique_name("pyprovlib.io/rbd-e2e")
    sc = await make_class(c, name, class_params(c, ceph), expandable=True)
    claim = await make_claim(c, sc, "2Mi")
    prov = RBDProvisioner(c.api_client, RbdRunner(timeout=10))
    resizer = ResizeController(
        c.api_client,
        RBDResizer(prov, name),
        ResizeControllerOptions(
            retry_interval_start=0.05, retry_interval_max=1.0, registry=CollectorRegistry()
        ),
    )
    core = CoreV1Api(c.api_client)
    async with running(c.api_client, name, prov):
        pv = await wait_bound(c, claim)
        image = pv.spec.rbd.image
        resize_task = asyncio.create_task(resizer.run())
        try:
            await core.patch_namespaced_persistent_volume_claim(
                claim,
                c.namespace,
                {"spec": {"resources": {"requests": {"storage": "20Mi"}}}},
            )

            async def grown() -> Any:
                volume = await core.read_persistent_volume(pv.metadata.name)
                return volume if volume.spec.capacity["storage"] != "2Mi" else None

            volume = await c.wait_for(grown, message="PV capacity updated")
            assert parse_storage_size(volume.spec.capacity["storage"]) == 20 * MIB
            assert ceph.rbd_json("info", "--pool", "rbd", "--image", image)["size"] == 20 * MIB

            # The resizer writes the PV's capacity before the claim's condition; kubelet grows
            # the file system on the node next.
            async def pending_on_node() -> Any:
                pvc = await core.read_namespaced_persistent_volume_claim(claim, c.namespace)
                kinds = [cond.type for cond in pvc.status.conditions or []]
                return pvc if "FileSystemResizePending" in kinds else None

            await c.wait_for(pending_on_node, message="claim FileSystemResizePending")
        finally:
            resizer.stop()
            await asyncio.wait_for(resize_task, 30)
        await core.delete_namespaced_persistent_volume_claim(claim, c.namespace)
        await wait_pv_gone(c, pv.metadata.name)
    assert image not in images(ceph)


async def test_block_claim_and_retry_finds_existing_image(secrets: TestCluster, ceph: Any) -> None:
    c = secrets
    name = c.unique_name("pyprovlib.io/rbd-e2e")
    sc = await make_class(c, name, class_params(c, ceph))
    claim = await make_claim(c, sc, "3Mi", mode="Block")
    pvc = await CoreV1Api(c.api_client).read_namespaced_persistent_volume_claim(claim, c.namespace)
    # An earlier attempt created the image, then lost the answer (crash, timeout): the retry
    # must adopt it, not leak it and create another.
    image = image_name_for(f"pvc-{pvc.metadata.uid}")
    ceph.rbd("create", "--pool", "rbd", "--size", "4", image)
    before = set(images(ceph))
    prov = RBDProvisioner(c.api_client, RbdRunner(timeout=10))
    async with running(c.api_client, name, prov):
        pv = await wait_bound(c, claim)
        assert pv.spec.rbd.image == image
        assert pv.spec.volume_mode == "Block"
        assert pv.spec.rbd.fs_type is None
        assert pv.spec.capacity == {"storage": "4Mi"}
        assert set(images(ceph)) == before
        await CoreV1Api(c.api_client).delete_namespaced_persistent_volume_claim(claim, c.namespace)
        await wait_pv_gone(c, pv.metadata.name)
    assert image not in images(ceph)


async def test_delete_refused_while_watched(secrets: TestCluster, ceph: Any) -> None:
    c = secrets
    name = c.unique_name("pyprovlib.io/rbd-e2e")
    sc = await make_class(c, name, class_params(c, ceph))
    claim = await make_claim(c, sc)
    prov = RBDProvisioner(c.api_client, RbdRunner(timeout=10))
    async with running(c.api_client, name, prov):
        pv = await wait_bound(c, claim)
        image = pv.spec.rbd.image
        async with ceph.watching(image):

            async def watched() -> bool:
                return bool(ceph.rbd_json("status", "--pool", "rbd", "--image", image)["watchers"])

            await c.wait_for(watched, message="watcher registered")
            await CoreV1Api(c.api_client).delete_namespaced_persistent_volume_claim(
                claim, c.namespace
            )
            message = await wait_event(
                c, pv.metadata.name, "VolumeFailedDelete", "still being used"
            )
            assert f"rbd/{image}" in message
            assert "127.0.0.1:" in message
            assert image in images(ceph)
            await CoreV1Api(c.api_client).read_persistent_volume(pv.metadata.name)
        await wait_pv_gone(c, pv.metadata.name)
    assert image not in images(ceph)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"foo": "bar", "Keyring": "/etc/ceph/keyring"}, "unknown parameter(s) Keyring, foo"),
        ({"monitors": "<unset>"}, "parameter monitors is required"),
        ({"pool": "-rf"}, "pool '-rf' is invalid"),
        ({"pool": "rbd --id evil"}, "pool 'rbd --id evil' is invalid"),
        ({"pool": "rbd/ns"}, "is invalid"),
        ({"adminId": "--keyring=/x"}, "adminId '--keyring=/x' is invalid"),
        ({"monitors": "--keyring=/tmp/k"}, "monitor '--keyring=/tmp/k' is invalid"),
        ({"monitors": "127.0.0.1:1 -c /etc/passwd"}, "is invalid"),
        ({"imageFormat": "3"}, "invalid imageFormat '3', expecting 1 or 2"),
        ({"imageFormat": "1", "imageFeatures": "layering"}, "only be set with imageFormat 2"),
        ({"imageFeatures": "layering,journaling"}, "invalid image feature 'journaling'"),
        ({"imageFeatures": "object-map"}, "image feature object-map requires exclusive-lock"),
        ({"adminSecretName": "<unset>"}, "parameter adminSecretName is required"),
        ({"userSecretName": "<unset>"}, "parameter userSecretName is required"),
        ({"fsType": "ext4 -o x"}, "invalid fsType"),
        # Valid for Kubernetes, refused by this Ceph release: rbd's own stderr in the event.
        ({"imageFormat": "1"}, "Format 1 image creation unsupported"),
        ({"pool": "no-such-pool"}, "error opening pool 'no-such-pool'"),
    ],
)
async def test_bad_parameters_get_an_event(
    secrets: TestCluster, ceph: Any, extra: dict[str, str], fragment: str
) -> None:
    c = secrets
    name = c.unique_name("pyprovlib.io/rbd-e2e")
    sc = await make_class(c, name, class_params(c, ceph, **extra))
    claim = await make_claim(c, sc)
    before = images(ceph)
    async with running(c.api_client, name, RBDProvisioner(c.api_client, RbdRunner(timeout=5))):
        message = await wait_event(c, claim, "ProvisioningFailed", fragment)
    assert ceph.admin_key not in message
    pvc = await CoreV1Api(c.api_client).read_namespaced_persistent_volume_claim(claim, c.namespace)
    assert pvc.status.phase == "Pending"
    assert images(ceph) == before


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [
        ("missing", "Secret {ns}/ceph-admin not found"),
        ("wrong-type", "has type 'Opaque'; the RBD provisioner needs type kubernetes.io/rbd"),
        ("not-a-key", "is not a cephx key"),
    ],
)
async def test_admin_secret_problems_get_an_event(
    kube_cluster: TestCluster, ceph: Any, setup: str, fragment: str
) -> None:
    c = kube_cluster
    if setup == "wrong-type":
        await make_secret(c, "ceph-admin", ceph.admin_key, type_="Opaque")
    elif setup == "not-a-key":
        await make_secret(c, "ceph-admin", "line1\nline2")
    name = c.unique_name("pyprovlib.io/rbd-e2e")
    sc = await make_class(c, name, class_params(c, ceph))
    claim = await make_claim(c, sc)
    before = images(ceph)
    async with running(c.api_client, name, RBDProvisioner(c.api_client, RbdRunner(timeout=5))):
        message = await wait_event(c, claim, "ProvisioningFailed", fragment.format(ns=c.namespace))
    assert "cannot read the Ceph admin key" in message
    assert images(ceph) == before


def _argv_of_rbd_processes() -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv and argv[0].endswith(b"rbd"):
                    found.append(b" ".join(argv).decode(errors="replace"))
    return found


async def test_unreachable_cluster_and_the_key_stays_secret(
    secrets: TestCluster,
    ceph: Any,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = secrets
    name = c.unique_name("pyprovlib.io/rbd-e2e")
    # Nothing listens on port 1 of loopback: the mons are unreachable.
    sc = await make_class(c, name, class_params(c, ceph, monitors="127.0.0.1:1"))
    claim = await make_claim(c, sc)
    prov = RBDProvisioner(c.api_client, RbdRunner(timeout=2))
    seen_argv: list[str] = []
    with structlog.testing.capture_logs() as logs:
        async with running(c.api_client, name, prov) as controller:
            scan = asyncio.create_task(_scan(seen_argv))
            try:
                first = await wait_event(c, claim, "ProvisioningFailed", "couldn't connect")
                # Retried with backoff, not given up and not crashed.
                core = CoreV1Api(c.api_client)

                async def retried() -> bool:
                    for ev in (await core.list_namespaced_event(c.namespace)).items:
                        if ev.involved_object.name == claim and (ev.count or 1) >= 2:
                            return True
                    return False

                await c.wait_for(retried, timeout=60, message="a second attempt")
                assert controller.healthy()
            finally:
                scan.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await scan
    assert "127.0.0.1:1" in first
    assert "no answer within 2s" in first
    key = ceph.admin_key
    assert seen_argv, "no rbd process was observed"
    assert all("--keyfile" in argv and key not in argv for argv in seen_argv)
    assert key not in await all_events(c)
    assert key not in repr(logs)
    out, err = capfd.readouterr()
    assert key not in out + err + caplog.text
    encoded = base64.b64encode(key.encode()).decode()
    assert encoded not in out + err + caplog.text + repr(logs)


async def _scan(seen: list[str]) -> None:
    while True:
        seen.extend(a for a in _argv_of_rbd_processes() if "127.0.0.1:1" in a)
        await asyncio.sleep(0.05)
