"""The ProvisionController's error paths, end to end through the API server (``kube_cluster``:
in memory, or a real cluster with ``PYPROVLIB_E2E_KUBECONFIG``; steps needing the in-memory
server's control are skipped there).

Upstream controller_test.go scenarios covered:

- "don't provision for claim-1 because its class doesn't exist" (+ an event naming the class,
  and provisioning once the class is created)
- "don't provision, provisioner does not support raw block" / TestCanProvision
- "don't provision, because it is ignored" (IgnoredError) and "provision for claim-1 but not
  claim-2, because it is ignored"
- "provisioner fails to provision for claim-1: no pv is created", "ext provisioner: final error
  does not mark claim as in progress", failure threshold (give up after N failures)
- "ext provisioner: provisional error marks claim as in progress", "claimsInProgress is used for
  deleted PVCs" (IN_BACKGROUND, claim deleted mid-provision: finished, then cleaned up)
- "ext provisioner: NoChange error does not mark claim as in progress"
- "remove selectedNode and claim on reschedule", "do not remove selectedNode after final error,
  only the claim", "do not remove selectedNode while in progress"
- TestInfeasibleRetry (infeasible errors wait ``retry_interval_max``; a replaced class resets it)
- "provisioner fails to delete volume-1: pv is not deleted" (VolumeFailedDelete, then retried)
- DeletionGuard keeping a volume; IgnoredError on delete
- claim selector, invalid storage request, mount options on a provisioner that refuses them,
  provision timeout.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from claim_support import create_claim, delete_claim, get_claim, get_volume
from kubernetes_asyncio.client import V1PersistentVolume, V1PersistentVolumeClaim
from provision_support import (
    MemoryProvisioner,
    bound_then_deleted,
    controller_for,
    counter,
    create_class,
    fast_options,
    provisioner_name,
    wait_ready,
)

from pyprovlib._provisioner import (
    BlockProvisioner,
    DeletionGuard,
    IgnoredError,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
    Qualifier,
)
from pyprovlib.controller._provision import (
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    InfeasibleError,
    MountOptionsProvisioner,
    ProvisionController,
)
from pyprovlib.controller._provision.attempt import Outcome
from pyprovlib.kube._objects import Obj, name_of
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, STORAGE_CLASSES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing import events_of, running, wait_bound, wait_deleted, wait_event, wait_idle
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


class ScriptedProvisioner(MemoryProvisioner):
    """Raises the exceptions in ``script`` on successive calls (None: succeed), then succeeds."""

    def __init__(self, script: list[BaseException | None] | None = None) -> None:
        super().__init__()
        self.script = list(script or [])
        self.fail_forever: BaseException | None = None

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        if self.fail_forever is not None:
            self.calls.append(options)
            raise self.fail_forever
        if self.script:
            step = self.script.pop(0)
            if step is not None:
                self.calls.append(options)
                raise step
        return await super().provision(options)


async def wait_released(cluster: TestCluster, pv_name: str) -> Obj:
    """Wait until the PV ``pv_name`` is Released; returns it as read then."""

    async def released() -> Obj | None:
        pv = await get_volume(cluster.api_client, pv_name)
        return (
            pv if pv is not None and (pv.get("status") or {}).get("phase") == "Released" else None
        )

    found: Obj = await cluster.wait_for(released, message=f"PV {pv_name} Released")
    return found


async def settle(
    controller: ProvisionController, *written: Obj, count_delayed: bool = False
) -> None:
    """Wait until the controller has seen ``written`` and done all it would do about it (used
    only to show something does NOT happen; positive outcomes are always polled for)."""
    await wait_idle(controller, *written, count_delayed=count_delayed)
    assert controller.healthy()


async def test_missing_class_gets_an_event_and_is_retried_until_created(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    class_name = kube_cluster.unique_name("sc-later")
    provisioner = MemoryProvisioner()
    options = fast_options()
    controller = ProvisionController(kube_cluster.api_client, name, provisioner, options)
    async with running(controller):
        # Annotated for us (as by the PV controller) although the class does not exist yet.
        claim = await create_claim(
            kube_cluster, class_name, annotations={ANN_STORAGE_PROVISIONER: name}
        )
        claim_name = claim["metadata"]["name"]
        # The controller's event, not the PV controller's ('storageclass.storage.k8s.io "x"
        # not found'), which may come first.
        await wait_event(
            kube_cluster, claim_name, "ProvisioningFailed", f'StorageClass "{class_name}" not found'
        )
        assert provisioner.calls == []
        assert (
            counter(
                options.metrics,
                "persistentvolumeclaim_provision_failed_total",
                **{"class": class_name, "source": ""},
            )
            >= 1
        )
        await create_class(kube_cluster, name, name=class_name)
        await wait_bound(kube_cluster, claim_name)


async def test_claim_with_selector_is_refused_with_an_event(kube_cluster: TestCluster) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        claim = await create_claim(
            kube_cluster, class_name, selector={"matchLabels": {"tier": "gold"}}
        )
        claim_name = claim["metadata"]["name"]
        await wait_event(
            kube_cluster, claim_name, "ProvisioningFailed", "claim Selector is not supported"
        )
        await settle(controller, claim)
        assert provisioner.calls == []
        assert provisioner.assets == {}


async def test_block_claim_on_a_filesystem_only_provisioner(kube_cluster: TestCluster) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name, volumeMode="Block")
        await wait_event(
            kube_cluster,
            claim["metadata"]["name"],
            "ProvisioningFailed",
            f"{controller.provisioner_name} does not support block volume provisioning",
        )
        await settle(controller, claim)
        assert provisioner.calls == []


class BlockMemoryProvisioner(MemoryProvisioner, BlockProvisioner):
    def supports_block(self) -> bool:
        return True


async def test_block_claim_on_a_block_provisioner(kube_cluster: TestCluster) -> None:
    provisioner = BlockMemoryProvisioner()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name, volumeMode="Block")
        await wait_bound(kube_cluster, claim["metadata"]["name"])


class NoMountOptionsProvisioner(MemoryProvisioner, MountOptionsProvisioner):
    def supports_mount_options(self) -> bool:
        return False


async def test_mount_options_on_a_provisioner_that_refuses_them(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    with_options = await create_class(kube_cluster, name, mountOptions=["nfsvers=4.1"])
    without = await create_class(kube_cluster, name)
    provisioner = NoMountOptionsProvisioner()
    controller = ProvisionController(kube_cluster.api_client, name, provisioner, fast_options())
    async with running(controller):
        refused = await create_claim(kube_cluster, with_options)
        accepted = await create_claim(kube_cluster, without)
        await wait_event(
            kube_cluster,
            refused["metadata"]["name"],
            "ProvisioningFailed",
            f'StorageClass "{with_options}" has mount options',
        )
        await wait_bound(kube_cluster, accepted["metadata"]["name"])
        assert [c.pvc.metadata.name for c in provisioner.calls] == [accepted["metadata"]["name"]]


async def test_invalid_storage_request_is_refused(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    # The claim itself belongs to someone else, so the controller leaves the valid original
    # alone and only sees the copies handed to it below.
    class_name = await create_class(kube_cluster, f"{name}-other")
    provisioner = MemoryProvisioner()
    controller = ProvisionController(kube_cluster.api_client, name, provisioner, fast_options())
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        await wait_ready(kube_cluster, controller)
        # An API server validates quantities, so hand the controller the claim as a buggy or
        # hostile server could: the same claim with requests it must not trust.
        for hostile, why in (("-1Gi", "is negative"), ("1Zi", "unknown suffix")):
            bad = {
                **claim,
                "spec": {**claim["spec"], "resources": {"requests": {"storage": hostile}}},
            }
            attempt = await controller.provision_claim_operation(bad)
            assert attempt.outcome is Outcome.STOPPED
            assert attempt.state is ProvisioningState.FINISHED
            await wait_event(kube_cluster, claim["metadata"]["name"], "ProvisioningFailed", why)
        assert provisioner.calls == []


async def test_ignored_claims_are_left_alone(kube_cluster: TestCluster) -> None:

    class Picky(MemoryProvisioner):
        async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
            if options.pvc.metadata.name.startswith("skip-"):
                self.calls.append(options)
                raise IgnoredError("not for me")
            return await super().provision(options)

    provisioner = Picky()
    options = fast_options()
    controller, class_name = await controller_for(kube_cluster, provisioner, options)
    async with running(controller):
        ignored = await create_claim(
            kube_cluster, class_name, name=kube_cluster.unique_name("skip")
        )
        provisioned = await create_claim(kube_cluster, class_name)
        await wait_bound(kube_cluster, provisioned["metadata"]["name"])

        async def asked() -> bool:
            return any(
                c.pvc.metadata.name == ignored["metadata"]["name"] for c in provisioner.calls
            )

        await kube_cluster.wait_for(asked, message="ignored claim offered to the provisioner")
        await settle(controller, ignored)
        claim = await get_claim(kube_cluster, ignored["metadata"]["name"])
        assert claim is not None
        assert claim["status"]["phase"] == "Pending"
        # Ignored: not retried, no failure event.
        assert (
            sum(c.pvc.metadata.name == ignored["metadata"]["name"] for c in provisioner.calls) == 1
        )
        reasons = {e["reason"] for e in await events_of(kube_cluster, ignored["metadata"]["name"])}
        assert "ProvisioningFailed" not in reasons
        labels = {"class": class_name, "source": ""}
        assert counter(options.metrics, "persistentvolumeclaim_provision_total", **labels) == 1
        assert (
            counter(options.metrics, "persistentvolumeclaim_provision_failed_total", **labels) == 1
        )


async def test_final_error_is_retried_up_to_the_threshold(kube_cluster: TestCluster) -> None:
    provisioner = ScriptedProvisioner()
    provisioner.fail_forever = ProvisioningError("backend full", ProvisioningState.FINISHED)
    options = fast_options(failed_provision_threshold=3)
    controller, class_name = await controller_for(kube_cluster, provisioner, options)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        labels = {"class": class_name, "source": ""}

        async def gave_up() -> bool:
            fails = counter(
                options.metrics, "persistentvolumeclaim_provision_failed_total", **labels
            )
            return fails >= 4

        await kube_cluster.wait_for(gave_up, message="4 failed attempts")
        await wait_event(kube_cluster, claim_name, "ProvisioningFailed", "backend full")
        await settle(controller, claim, count_delayed=True)
        # 1 attempt + 3 retries, then the claim is given up (until it changes).
        assert len(provisioner.calls) == 4
        assert claim["metadata"]["uid"] not in controller.claims_in_progress()
        got = await get_claim(kube_cluster, claim_name)
        assert got is not None
        assert got["status"]["phase"] == "Pending"


async def test_no_change_does_not_mark_the_claim_in_progress(kube_cluster: TestCluster) -> None:
    provisioner = ScriptedProvisioner(
        [ProvisioningError("secret missing", ProvisioningState.NO_CHANGE)] * 2
    )
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        uid = claim["metadata"]["uid"]

        async def failed_once() -> bool:
            return len(provisioner.calls) >= 1

        await kube_cluster.wait_for(failed_once, message="first failure")
        assert uid not in controller.claims_in_progress()
        await wait_bound(kube_cluster, claim["metadata"]["name"])
        assert uid not in controller.claims_in_progress()


async def test_in_background_claim_deleted_midway_is_finished_then_cleaned_up(
    kube_cluster: TestCluster,
) -> None:
    provisioner = ScriptedProvisioner()
    provisioner.fail_forever = ProvisioningError("still creating", ProvisioningState.IN_BACKGROUND)
    # A threshold of 1 would give up at once on a FINISHED error; in-progress claims go on.
    options = fast_options(failed_provision_threshold=1)
    controller, class_name = await controller_for(kube_cluster, provisioner, options)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        uid = claim["metadata"]["uid"]

        async def in_progress() -> bool:
            return uid in controller.claims_in_progress() and len(provisioner.calls) >= 2

        await kube_cluster.wait_for(in_progress, message="claim in progress")
        await delete_claim(kube_cluster, claim["metadata"]["name"])

        async def claim_gone() -> bool:
            return await get_claim(kube_cluster, claim["metadata"]["name"]) is None

        await kube_cluster.wait_for(claim_gone, message="claim deleted")
        failures_before = len(provisioner.calls)

        async def retried_after_delete() -> bool:
            return len(provisioner.calls) > failures_before

        await kube_cluster.wait_for(retried_after_delete, message="retry after claim deletion")
        # The backend finishes: the PV is saved for the deleted claim, released, and deleted.
        provisioner.fail_forever = None
        pv_name = f"pvc-{uid}"

        async def cleaned() -> bool:
            return (
                pv_name in provisioner.deleted
                and await get_volume(kube_cluster.api_client, pv_name) is None
            )

        await kube_cluster.wait_for(cleaned, message="volume of the deleted claim cleaned up")
        assert provisioner.assets == {}
        assert uid not in controller.claims_in_progress()


async def test_reschedule_removes_the_selected_node(kube_cluster: TestCluster) -> None:
    # No pod uses the claim, so neither the in-memory harness nor kube-scheduler selects a
    # node on its own: the test plays the scheduler with schedule().
    first_node, second_node = (name_of(n) for n in await kube_cluster.ready_nodes(2))
    provisioner = ScriptedProvisioner(
        [ProvisioningError("node-1 has no capacity", ProvisioningState.RESCHEDULE)]
    )
    controller, class_name = await controller_for(
        kube_cluster, provisioner, volumeBindingMode="WaitForFirstConsumer"
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        await kube_cluster.schedule(claim_name, first_node)
        await wait_event(kube_cluster, claim_name, "ProvisioningFailed", "no capacity")

        async def unscheduled() -> bool:
            got = await get_claim(kube_cluster, claim_name)
            return got is not None and ANN_SELECTED_NODE not in got["metadata"].get(
                "annotations", {}
            )

        await kube_cluster.wait_for(unscheduled, message="selected-node removed")
        assert claim["metadata"]["uid"] not in controller.claims_in_progress()
        # The scheduler picks again; this time it works.
        await kube_cluster.schedule(claim_name, second_node)
        await wait_bound(kube_cluster, claim_name)
        assert provisioner.calls[-1].selected_node_name == second_node


async def test_final_error_and_in_background_keep_the_selected_node(
    kube_cluster: TestCluster,
) -> None:
    provisioner = ScriptedProvisioner(
        [
            ProvisioningError("transient", ProvisioningState.FINISHED),
            ProvisioningError("creating", ProvisioningState.IN_BACKGROUND),
        ]
    )
    controller, class_name = await controller_for(
        kube_cluster, provisioner, volumeBindingMode="WaitForFirstConsumer"
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        # The scheduler (in memory: the harness) selects a node once, for the pod.
        await kube_cluster.create_consumer_pod(claim["metadata"]["name"])
        bound = await wait_bound(kube_cluster, claim["metadata"]["name"])
        node = bound["metadata"]["annotations"][ANN_SELECTED_NODE]
        assert node
        assert [c.selected_node_name for c in provisioner.calls] == [node] * 3


class TimedProvisioner(ScriptedProvisioner):
    """Notes ``time.monotonic()`` as each call comes in."""

    def __init__(self, script: list[BaseException | None] | None = None) -> None:
        super().__init__(script)
        self.started: list[float] = []

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        self.started.append(time.monotonic())
        return await super().provision(options)


async def test_infeasible_error_delays_retries(kube_cluster: TestCluster) -> None:
    provisioner = TimedProvisioner([InfeasibleError("parameter 'iops' must be a number")])
    controller, class_name = await controller_for(
        kube_cluster, provisioner, fast_options(retry_interval_max=1.0)
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        event = await wait_event(kube_cluster, claim_name, "ProvisioningFailed", "infeasible")
        assert "Retries will be delayed" in event["message"]
        assert "'iops' must be a number" in event["message"]
        await settle(controller, claim)  # the slow retry waits out its delay
        await wait_bound(kube_cluster, claim_name)
        # Retries of the fast rate limiter did not reach the provisioner meanwhile: the one
        # retry came no earlier than retry_interval_max after the refused call (a count read at
        # the settle point would depend on how fast the test got there), and made the asset.
        first, retry = provisioner.started
        assert retry - first >= 1.0
        assert len(provisioner.calls) == 2
        assert list(provisioner.assets) == [f"pvc-{claim['metadata']['uid']}"]


async def test_replacing_the_class_ends_the_infeasible_delay(kube_cluster: TestCluster) -> None:
    provisioner = ScriptedProvisioner([InfeasibleError("parameter 'iops' must be a number")])
    controller, class_name = await controller_for(
        kube_cluster,
        provisioner,
        fast_options(retry_interval_max=300.0),
        parameters={"iops": "lots"},
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        await wait_event(kube_cluster, claim_name, "ProvisioningFailed", "infeasible")
        classes = ResourceClient(kube_cluster.api_client, STORAGE_CLASSES)
        await classes.delete(class_name)

        async def class_gone() -> bool:
            return controller.class_informer.store.get_by_key(class_name) is None

        await kube_cluster.wait_for(class_gone, message="old class gone from the cache")
        await create_class(
            kube_cluster, controller.provisioner_name, name=class_name, parameters={"iops": "3000"}
        )
        # The claim is looked at again when it changes (or at resync): touch it.
        await ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS).patch(
            claim_name,
            {"metadata": {"labels": {"retry": "now"}}},
            namespace=kube_cluster.namespace,
        )
        await wait_bound(kube_cluster, claim_name, timeout=10)
        assert provisioner.calls[-1].storage_class.parameters == {"iops": "3000"}


async def test_provision_timeout_keeps_the_claim_in_progress(kube_cluster: TestCluster) -> None:

    class Slow(MemoryProvisioner):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
            if not self.release.is_set():
                self.calls.append(options)
                await asyncio.Event().wait()
            return await super().provision(options)

    provisioner = Slow()
    controller, class_name = await controller_for(
        kube_cluster, provisioner, fast_options(provision_timeout=0.2)
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        await wait_event(
            kube_cluster, claim["metadata"]["name"], "ProvisioningFailed", "did not finish within"
        )

        async def in_progress() -> bool:
            return claim["metadata"]["uid"] in controller.claims_in_progress()

        await kube_cluster.wait_for(in_progress, message="claim in progress after a timeout")
        provisioner.release.set()
        await wait_bound(kube_cluster, claim["metadata"]["name"])


async def test_failed_delete_is_reported_and_retried(kube_cluster: TestCluster) -> None:

    class Stubborn(MemoryProvisioner):
        failures = 2

        async def delete(self, volume: V1PersistentVolume) -> None:
            if self.failures:
                self.failures -= 1
                raise RuntimeError("backend busy, try later")
            await super().delete(volume)

    provisioner = Stubborn()
    options = fast_options()
    controller, class_name = await controller_for(kube_cluster, provisioner, options)
    async with running(controller):
        pv_name = await bound_then_deleted(kube_cluster, class_name)
        assert provisioner.assets == {}
        # PV events are recorded in the default namespace (it is cluster-scoped).
        await wait_event(
            kube_cluster, pv_name, "VolumeFailedDelete", "backend busy", namespace="default"
        )
        # The worker counts the deletion when its DELETE returns, after the PV is gone.
        await settle(controller)
        labels = {"class": class_name}
        assert counter(options.metrics, "persistentvolume_delete_failed_total", **labels) == 2
        assert counter(options.metrics, "persistentvolume_delete_total", **labels) == 1


async def test_deletion_guard_and_ignored_delete_keep_the_volume(kube_cluster: TestCluster) -> None:

    class Guarded(MemoryProvisioner, DeletionGuard):
        async def should_delete(self, volume: V1PersistentVolume) -> bool:
            return volume.spec.claim_ref.name != guarded_claim

        async def delete(self, volume: V1PersistentVolume) -> None:
            if volume.spec.claim_ref.name == ignored_claim:
                raise IgnoredError("kept for forensics")
            await super().delete(volume)

    provisioner = Guarded()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        claims = [await create_claim(kube_cluster, class_name) for _ in range(3)]
        guarded_claim, ignored_claim, _ = (c["metadata"]["name"] for c in claims)
        pv_names = [f"pvc-{c['metadata']['uid']}" for c in claims]
        for pv_name in pv_names[:2]:
            kube_cluster.track(PERSISTENT_VOLUMES, pv_name)
        for c in claims:
            await wait_bound(kube_cluster, c["metadata"]["name"])
            await delete_claim(kube_cluster, c["metadata"]["name"])
        await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, pv_names[2])
        # The PV controller releases each PV in its own time: wait for every Released version,
        # and until the controller has done all it would do about it (what would delete it).
        kept = [await wait_released(kube_cluster, n) for n in pv_names[:2]]
        await settle(controller, *kept)
        for pv_name in pv_names[:2]:
            pv = await get_volume(kube_cluster.api_client, pv_name)
            assert pv is not None
            assert pv["status"]["phase"] == "Released"
            assert pv_name in provisioner.assets
        assert set(provisioner.deleted) == {pv_names[2]}
        reasons = {
            e["reason"]
            for n in pv_names[:2]
            for e in await events_of(kube_cluster, n, namespace="default")
        }
        assert "VolumeFailedDelete" not in reasons


async def test_qualifier_declines_claims(kube_cluster: TestCluster) -> None:

    class Qualified(MemoryProvisioner, Qualifier):
        async def should_provision(self, claim: V1PersistentVolumeClaim) -> bool:
            return not claim.metadata.name.startswith("no-")

    provisioner = Qualified()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        declined = await create_claim(
            kube_cluster, class_name, name=kube_cluster.unique_name("no-thanks")
        )
        accepted = await create_claim(kube_cluster, class_name)
        await wait_bound(kube_cluster, accepted["metadata"]["name"])
        await settle(controller, declined)
        got = await get_claim(kube_cluster, declined["metadata"]["name"])
        assert got is not None
        assert got["status"]["phase"] == "Pending"
        assert [c.pvc.metadata.name for c in provisioner.calls] == [accepted["metadata"]["name"]]


async def test_bound_claims_are_not_provisioned(kube_cluster: TestCluster) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        await wait_ready(kube_cluster, controller)
        claim = await create_claim(
            kube_cluster,
            class_name,
            volumeName="some-static-volume",
            annotations={ANN_STORAGE_PROVISIONER: controller.provisioner_name},
        )
        await settle(controller, claim)
        assert provisioner.calls == []
        assert claim["spec"]["volumeName"] == "some-static-volume"
