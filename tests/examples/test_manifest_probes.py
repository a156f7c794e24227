"""Every example workload (examples/*/ Deployments and DaemonSets running pyprovlib) is probed
as the runtime serves it and can finish a rollout: liveness on /healthz/leader-election or
/healthz, readiness on /readyz, both on the port --http-endpoint opens; a Deployment whose
pods can overlap (several replicas, or a surge) runs leader election, and its rolling update
settings let a rollout progress (the standby is Ready: tests/integration/
test_health_leader_election.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LIVENESS = {"/healthz/leader-election", "/healthz"}


def workloads() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(ROOT.glob("examples/*/**/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
                out.append((f"{path.relative_to(ROOT)}:{doc['metadata']['name']}", doc))
    return out


WORKLOADS = workloads()


# CSI drivers serve gRPC, not the runtime's HTTP endpoints: upstream probes them through a
# livenessprobe sidecar calling Probe, not with httpGet.
CSI_DRIVERS = {"pyprovlib.examples.csi_hostpath"}
# Programs of one's own on pyprovlib.runtime: the tutorial's.
OWN_PROGRAMS = [["my-provisioner"]]


def pyprovlib_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c
        for c in doc["spec"]["template"]["spec"]["containers"]
        if (
            c.get("command", [])[:2] == ["python", "-m"]
            and c["command"][2].startswith("pyprovlib")
            and c["command"][2] not in CSI_DRIVERS
        )
        or c.get("command") in OWN_PROGRAMS
    ]


def flag(container: dict[str, Any], name: str) -> str | None:
    for arg in container.get("args", []):
        if arg == name:
            return "true"
        if arg.startswith(name + "="):
            return str(arg.split("=", 1)[1])
    return None


def resolve(value: int | str, replicas: int, *, round_up: bool) -> int:
    # Kubernetes' intstr.GetScaledValueFromIntOrPercent: surge rounds up, unavailable down.
    if isinstance(value, int):
        return value
    scaled = int(value.rstrip("%")) * replicas / 100
    return math.ceil(scaled) if round_up else math.floor(scaled)


def test_every_example_has_a_workload() -> None:
    dirs = {name.split("/")[1] for name, _ in WORKLOADS}
    assert {"hostpath", "nfs", "rbd", "tutorial"} <= dirs
    assert all(pyprovlib_containers(doc) for _, doc in WORKLOADS)


@pytest.mark.parametrize(("name", "doc"), WORKLOADS, ids=[n for n, _ in WORKLOADS])
def test_probes_match_the_runtime_endpoints(name: str, doc: dict[str, Any]) -> None:
    for container in pyprovlib_containers(doc):
        endpoint = flag(container, "--http-endpoint")
        assert endpoint is not None, f"{name}: no --http-endpoint, so no probes can pass"
        port = int(endpoint.rsplit(":", 1)[1])
        ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
        for probe, paths in (("livenessProbe", LIVENESS), ("readinessProbe", {"/readyz"})):
            get = container[probe]["httpGet"]
            assert get["path"] in paths, f"{name}: {probe} on {get['path']}"
            target = get["port"]
            assert (ports[target] if isinstance(target, str) else target) == port, name


@pytest.mark.parametrize(("name", "doc"), WORKLOADS, ids=[n for n, _ in WORKLOADS])
def test_overlapping_pods_elect_a_leader_and_rollouts_can_progress(
    name: str, doc: dict[str, Any]
) -> None:
    if doc["kind"] != "Deployment":
        # A DaemonSet's pods each serve their own node (no leader election to share).
        for container in pyprovlib_containers(doc):
            assert flag(container, "--leader-election") in (None, "false"), name
        return
    spec = doc["spec"]
    replicas = spec.get("replicas", 1)
    strategy = spec.get("strategy", {"type": "RollingUpdate"})
    surge = unavailable = 0
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.get("rollingUpdate", {})
        surge = resolve(rolling.get("maxSurge", "25%"), replicas, round_up=True)
        unavailable = resolve(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
        # The API server rejects both 0; with surge 0 a rollout must be able to take pods down.
        assert surge > 0 or unavailable > 0, f"{name}: maxSurge and maxUnavailable both 0"
        # Pods that must stay Ready while the new ones start: the new ones must become Ready
        # while an old replica leads, which only a standby-ready /readyz allows.
        assert unavailable < replicas or surge > 0, name
    else:
        assert strategy["type"] == "Recreate", name
    if replicas > 1 or surge > 0:
        for container in pyprovlib_containers(doc):
            assert flag(container, "--leader-election") == "true", (
                f"{name}: {replicas} replicas (surge {surge}) without --leader-election"
            )
