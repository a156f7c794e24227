"""The manifests in examples/csi-hostpath/: they parse, every container's arguments parse with
its entry point's own parser, the probes are upstream's (liveness on
``/healthz/leader-election``, readiness on ``/readyz``) on the port ``--http-endpoint`` names,
and the driver's socket is shared through an emptyDir. Whether ``rbac.yaml`` grants exactly what
the code asks for is checked where the code runs: tests/csi/test_combined.py."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest
from manifest_support import Manifests

from pyprovlib.csi._combined import build_parser as combined_parser
from pyprovlib.csi.attacher import _options as attacher
from pyprovlib.csi.provisioner import _options as provisioner
from pyprovlib.csi.resizer import _options as resizer
from pyprovlib.examples.csi_hostpath._cli import build_parser as driver_parser
from pyprovlib.runtime._flag_values import parse_http_address
from pyprovlib.runtime._flags import parse_common

CSI_HOSTPATH = Manifests("csi-hostpath")
DRIVER = "hostpath.csi.pyprovlib.io"
SOCKET_DIR = "/csi"

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "pyprovlib.csi.provisioner": provisioner.build_parser,
    "pyprovlib.csi.attacher": attacher.parser,
    "pyprovlib.csi.resizer": resizer.parser,
    "pyprovlib.csi": combined_parser,
}


def deployment(name: str) -> dict[str, Any]:
    (doc,) = CSI_HOSTPATH.docs(name)
    assert doc["kind"] == "Deployment"
    return doc


def containers(name: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment(name)["spec"]["template"]["spec"]["containers"]}


def module_of(container: dict[str, Any]) -> str:
    command = container["command"]
    assert command[:2] == ["python", "-m"], command
    return str(command[2])


@pytest.mark.parametrize(
    ("name", "modules"),
    [
        (
            "deployment.yaml",
            [
                "pyprovlib.examples.csi_hostpath",
                "pyprovlib.csi.provisioner",
                "pyprovlib.csi.attacher",
                "pyprovlib.csi.resizer",
            ],
        ),
        ("deployment-single-process.yaml", ["pyprovlib.examples.csi_hostpath", "pyprovlib.csi"]),
    ],
)
def test_controller_args_parse_with_their_entry_points_parser(
    name: str, modules: list[str]
) -> None:
    found = containers(name)
    assert [module_of(c) for c in found.values()] == modules
    images = {c["image"] for c in found.values()}
    assert len(images) == 1, "one image serves every entry point"
    for container in found.values():
        module = module_of(container)
        if module not in PARSERS:
            continue
        options, args = parse_common(PARSERS[module](), container["args"])
        assert options.leader_election is True
        assert args.csi_address == f"{SOCKET_DIR}/csi.sock"
        assert options.http_endpoint, f"{container['name']} serves no health endpoints"
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_the_single_process_runs_every_controller() -> None:
    (container,) = [
        c for c in containers("deployment-single-process.yaml").values() if c["name"] != "hostpath"
    ]
    _, args = parse_common(combined_parser(), container["args"])
    assert args.controllers == ("provisioner", "attacher", "resizer")


def test_driver_args() -> None:
    """The driver's flags mirror the Go hostpathplugin's, and the Python driver's own parser
    accepts them."""
    for name in ("deployment.yaml", "deployment-single-process.yaml"):
        driver = containers(name)["hostpath"]
        args = dict(a.removeprefix("--").split("=", 1) for a in driver["args"])
        assert args == {
            "endpoint": f"unix://{SOCKET_DIR}/csi.sock",
            "nodeid": "$(KUBE_NODE_NAME)",
            "drivername": DRIVER,
            "statedir": "/csi-data-dir",
        }
        env = {e["name"]: e for e in driver["env"]}
        assert env["KUBE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    parsed = driver_parser().parse_args(containers("deployment.yaml")["hostpath"]["args"])
    assert parsed.drivername == DRIVER
    assert parsed.nodeid == "$(KUBE_NODE_NAME)"
    assert parsed.endpoint == f"unix://{SOCKET_DIR}/csi.sock"


@pytest.mark.parametrize("name", ["deployment.yaml", "deployment-single-process.yaml"])
def test_probes_are_upstreams_on_the_http_endpoint(name: str) -> None:
    for container in containers(name).values():
        module = module_of(container)
        if module not in PARSERS:
            continue
        options, _ = parse_common(PARSERS[module](), container["args"])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        liveness = container["livenessProbe"]["httpGet"]
        readiness = container["readinessProbe"]["httpGet"]
        assert liveness["path"] == "/healthz/leader-election"
        assert readiness["path"] == "/readyz"
        for probe in (liveness, readiness):
            assert ports[probe["port"]] == parse_http_address(options.http_endpoint).port
    every_port = [p["containerPort"] for c in containers(name).values() for p in c.get("ports", [])]
    assert len(every_port) == len(set(every_port)), "each container its own port"


@pytest.mark.parametrize("name", ["deployment.yaml", "deployment-single-process.yaml"])
def test_socket_is_shared_through_an_emptydir(name: str) -> None:
    pod = deployment(name)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["socket-dir"] == {"name": "socket-dir", "emptyDir": {}}
    for container in pod["containers"]:
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["socket-dir"] == SOCKET_DIR, container["name"]
    assert pod["serviceAccountName"] == "pyprovlib-csi-hostpath"
    spec = deployment(name)["spec"]
    # One replica (the driver's volumes live in the pod), replaced by Recreate.
    assert (spec["replicas"], spec["strategy"]["type"]) == (1, "Recreate")


def test_driver_class_and_claim_agree() -> None:
    (driver,) = CSI_HOSTPATH.by_kind("CSIDriver")
    (sc,) = CSI_HOSTPATH.by_kind("StorageClass")
    assert driver["metadata"]["name"] == sc["provisioner"] == DRIVER
    assert driver["spec"]["attachRequired"] is True  # the attacher has work
    assert sc["allowVolumeExpansion"] is True  # the resizer has work
    claim = CSI_HOSTPATH.claim()
    assert claim["spec"]["storageClassName"] == sc["metadata"]["name"]


def test_rbac_is_bound_to_the_deployments_account() -> None:
    (account,) = CSI_HOSTPATH.by_kind("ServiceAccount")
    name, namespace = account["metadata"]["name"], account["metadata"]["namespace"]
    roles = {r["metadata"]["name"] for r in CSI_HOSTPATH.by_kind("ClusterRole")}
    bound = {
        b["roleRef"]["name"]
        for b in CSI_HOSTPATH.by_kind("ClusterRoleBinding")
        if {"kind": "ServiceAccount", "name": name, "namespace": namespace} in b["subjects"]
    }
    assert (
        bound
        == roles
        == {
            "pyprovlib-csi-provisioner",
            "pyprovlib-csi-attacher",
            "pyprovlib-csi-resizer",
        }
    )
    bindings = CSI_HOSTPATH.by_kind("RoleBinding")
    assert (
        {b["roleRef"]["name"] for b in bindings}
        == {r["metadata"]["name"] for r in CSI_HOSTPATH.by_kind("Role")}
        == {"pyprovlib-csi-leader-election", "pyprovlib-csi-provisioner-capacity"}
    )
    for binding in bindings:
        assert binding["metadata"]["namespace"] == namespace
        assert {"kind": "ServiceAccount", "name": name, "namespace": namespace} in binding[
            "subjects"
        ]
    text = CSI_HOSTPATH.text()
    assert '"*"' not in text
    assert "privileged: true" not in text
