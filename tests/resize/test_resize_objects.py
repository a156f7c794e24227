"""The object convention at the Resizer boundary (issue 20): ``can_support``,
``unsupported_reason`` and ``expand`` receive the PersistentVolume as a kubernetes-asyncio
``V1PersistentVolume``, converted once per look at a claim and shared by those calls."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import V1PersistentVolume
from resize_support import GI, MemoryResizer, Scenario, controller
from sidecar_support import running

from pyprovlib._resizer import ExpansionResult
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._support import wait_idle


class RecordingResizer(MemoryResizer):
    """Keeps every object each method received."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.supported: list[object] = []
        self.expanded: list[object] = []
        self.refused: list[object] = []

    def can_support(self, pv: V1PersistentVolume) -> bool:
        self.supported.append(pv)
        return super().can_support(pv)

    def unsupported_reason(self, pv: V1PersistentVolume) -> str:
        self.refused.append(pv)
        return "not one of mine"

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        self.expanded.append(pv)
        return await super().expand(pv, new_size)


@pytest.mark.e2e
async def test_the_resizer_receives_one_model_per_look(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, pv_name, handle = await s.bound_claim()
    resizer = RecordingResizer(s.driver)
    async with running(controller(kube_cluster, resizer)):
        await s.expand(claim, "2Gi")
    assert resizer.calls == [(handle, 2 * GI)]
    (expanded,) = resizer.expanded
    assert isinstance(expanded, V1PersistentVolume)
    assert expanded.metadata.name == pv_name
    assert expanded.spec.csi.volume_handle == handle
    assert expanded.spec.claim_ref.name == claim
    # The expansion used the very object can_support was asked about: one conversion.
    assert any(seen is expanded for seen in resizer.supported)
    assert all(isinstance(seen, V1PersistentVolume) for seen in resizer.supported)


@pytest.mark.e2e
async def test_a_refusal_explains_with_the_same_model(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    # The volume belongs to another driver, the class names this resizer: it must say why.
    claim, _, _ = await s.bound_claim(driver=s.name("other") + ".example.com")
    resizer = RecordingResizer(s.driver)
    async with running(controller(kube_cluster, resizer)):
        await s.request(claim, "2Gi")
        event = await s.wait_event(claim, "VolumeResizeFailed")
    assert "not one of mine" in event["message"]
    assert resizer.expanded == []
    assert resizer.refused
    assert all(isinstance(seen, V1PersistentVolume) for seen in resizer.refused)
    assert any(seen is resizer.refused[0] for seen in resizer.supported)


async def test_a_volume_the_model_refuses_gets_an_event_not_a_retry_loop(
    kube_cluster: TestCluster,
) -> None:
    if kube_cluster.is_real:
        pytest.skip("a real API server refuses such a PersistentVolume (empty node selector)")
    s = Scenario(kube_cluster)
    claim, pv_name, _ = await s.bound_claim()
    # What the model refuses: a required node selector without its required terms.
    pv = await s.get_pv(pv_name)
    pv["spec"]["nodeAffinity"] = {"required": {}}
    await s.pvs.replace(pv)
    resizer = RecordingResizer(s.driver)
    ctrl = controller(kube_cluster, resizer)
    async with running(ctrl):
        await s.request(claim, "2Gi")
        event = await s.wait_event(claim, "VolumeResizeFailed")
        await wait_idle(ctrl, count_delayed=True)
    assert pv_name in event["message"]
    assert "V1PersistentVolume" in event["message"]
    assert resizer.supported == resizer.expanded == []
    # Looked at once, not retried with backoff: the same object fails the same way.
    assert ctrl.claim_queue.num_requeues(f"{s.namespace}/{claim}") == 0
