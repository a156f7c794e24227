"""VolumeAttributesClasses end to end on two real drivers — the Go ``hostpathplugin``
(``--enable-controller-modify-volume``) and the example driver (``python -m
pyprovlib.examples.csi_hostpath``) — each driven by ``python -m pyprovlib.csi`` (provisioner and
resizer, whose modify controller runs beside it) as processes against ``kube_cluster``: in
memory, or the real control plane of ``PYPROVLIB_KUBE_ASSETS`` (kube-apiserver with
VolumeAttributesClass GA, kube-controller-manager's PV controller binding and copying the
class into the claim's status).

One claim's classes: created with one, its parameters reach CreateVolume as mutable parameters
and the PV has the class; changed to another, the driver gets exactly one
ControllerModifyVolume with that class's parameters and upstream's ``--extra-modify-metadata``
keys, and the claim and PV say so; changed to a class the driver refuses, the claim is
Infeasible with an event and the volume unchanged; changed back, the current class is applied
once more (upstream's rollback) and the claim is clean again. Each figure is read from the
driver's own record (the Go driver's gRPC log, the example driver's log and state file) and the
sidecar's CSI metrics.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from claim_support import class_body
from csi_e2e import go_hostpath, register_hostpath_node
from sidecar_support import kubeconfig_of, wait_for

from pyprovlib import testing
from pyprovlib.controller._modify import PV_NAME_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CSINODES,
    EVENTS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
    VOLUME_ATTRIBUTES_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

DRIVERS = ("go", "example")
TIMEOUT = 60.0
MODIFY = "/csi.v1.Controller/ControllerModifyVolume"
# What the drivers accept: a volume's performance, and the keys --extra-modify-metadata adds.
ACCEPTED = ("iops", "throughput", PVC_NAME_KEY, PVC_NAMESPACE_KEY, PV_NAME_KEY)


@dataclass
class Driver:
    """A running driver: its kind (``go`` or ``example``), name, socket and record."""

    kind: str
    name: str
    socket: pathlib.Path
    directory: pathlib.Path
    process: testing.ChildProcess | None = None  # the example driver's log
    _go_log: pathlib.Path | None = field(default=None, repr=False)

    def go_requests(self, method: str) -> list[dict[str, Any]]:
        """The Go driver's requests of ``method``, from its gRPC log (``--v=5``: each call's
        method, then its request as JSON)."""
        assert self._go_log is not None
        requests: list[dict[str, Any]] = []
        pending = False
        for line in self._go_log.read_text(errors="replace").splitlines():
            if "GRPC call: " in line:
                pending = line.rstrip().endswith(method)
            elif pending and "GRPC request: " in line:
                requests.append(json.loads(line.split("GRPC request: ", 1)[1]))
                pending = False
        return requests

    def created_mutable_parameters(self) -> list[dict[str, str]]:
        """The mutable parameters of every CreateVolume the driver served."""
        if self.kind == "go":
            requests = self.go_requests("/csi.v1.Controller/CreateVolume")
            return [dict(r.get("mutable_parameters") or {}) for r in requests]
        return [dict(v["mutable_parameters"]) for v in self._state()["volumes"]]

    def modified(self) -> list[dict[str, str]]:
        """The parameters of every ControllerModifyVolume the driver applied (the Go driver:
        every one it received, its log records no outcome)."""
        if self.kind == "go":
            return [dict(r.get("mutable_parameters") or {}) for r in self.go_requests(MODIFY)]
        assert self.process is not None
        return [
            dict.fromkeys(line.get("parameters") or (), "")
            for line in self.process.lines
            if line.get("event") == "volume modified"
        ]

    def volume_parameters(self, handle: str) -> dict[str, str] | None:
        """The example driver's mutable parameters of a volume, from its state file."""
        for volume in self._state()["volumes"]:
            if volume["volume_id"] == handle:
                return dict(volume["mutable_parameters"])
        return None

    def _state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.directory / "state" / "state.json").read_text())
        return data


@contextlib.asynccontextmanager
async def start_driver(
    kind: str, request: pytest.FixtureRequest, cluster: TestCluster, directory: pathlib.Path
) -> AsyncIterator[Driver]:
    """The driver, modifying volumes and accepting :data:`ACCEPTED`, registered on a Node and
    its CSINode with the topology key both drivers report."""
    name = f"{cluster.unique_name('vac')}.csi.pyprovlib.io"
    node = cluster.unique_name("node")
    modify_flags = (
        "--enable-controller-modify-volume=true",
        f"--accepted-mutable-parameter-names={','.join(ACCEPTED)}",
    )
    async with contextlib.AsyncExitStack() as stack:
        if kind == "go":
            binary: pathlib.Path = request.getfixturevalue("hostpathplugin_binary")
            go = await stack.enter_async_context(
                # --v=5: each request logged (as JSON, secrets stripped) after its method.
                go_hostpath(
                    binary, directory, name, node_id=node, extra_args=(*modify_flags, "--v=5")
                )
            )
            driver = Driver(kind, name, go.socket, directory)
            driver._go_log = directory / "hostpathplugin.log"
        else:
            socket = directory / "csi.sock"
            process = await stack.enter_async_context(
                testing.child_process(
                    "-m",
                    "pyprovlib.examples.csi_hostpath",
                    f"--endpoint=unix://{socket}",
                    f"--nodeid={node}",
                    f"--drivername={name}",
                    f"--statedir={directory / 'state'}",
                    "--log-format=json",
                    *modify_flags,
                    terminate_timeout=10,
                )
            )
            await process.wait_for("hostpath CSI driver serving")
            driver = Driver(kind, name, socket, directory, process)
        cluster.track(NODES, node)
        cluster.track(CSINODES, node)
        await register_hostpath_node(cluster.api_client, name, node)
        yield driver


async def modify_calls(port: int, driver: str) -> dict[str, float]:
    """The sidecar's ControllerModifyVolume calls by gRPC status, from its /metrics."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        text = await resp.text()
    calls: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("csi_sidecar_operations_seconds_count{") and MODIFY in line:
            labels, value = line.rsplit(" ", 1)
            if f'driver_name="{driver}"' in labels:
                code = labels.split('grpc_status_code="', 1)[1].split('"', 1)[0]
                calls[code] = calls.get(code, 0.0) + float(value)
    return calls


def _status(obj: Obj) -> dict[str, Any]:
    value: dict[str, Any] = obj.get("status") or {}
    return value


@pytest.mark.parametrize("kind", DRIVERS)
async def test_a_claims_classes_reach_the_driver_once_each(
    kind: str,
    request: pytest.FixtureRequest,
    kube_cluster: TestCluster,
    sock_dir: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    cluster = kube_cluster
    api = cluster.api_client
    ns = cluster.namespace
    claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
    volumes = ResourceClient(api, PERSISTENT_VOLUMES)
    vacs = ResourceClient(api, VOLUME_ATTRIBUTES_CLASSES)

    async with start_driver(kind, request, cluster, sock_dir) as driver:
        classes: dict[str, str] = {}
        for label, parameters in (
            ("gold", {"iops": "3000"}),
            ("silver", {"iops": "6000", "throughput": "100"}),
            ("bad", {"colour": "blue"}),  # a key no driver here accepts
        ):
            classes[label] = name = cluster.unique_name(label)
            cluster.track(VOLUME_ATTRIBUTES_CLASSES, name)
            await vacs.create(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "VolumeAttributesClass",
                    "metadata": {"name": name},
                    "driverName": driver.name,
                    "parameters": parameters,
                }
            )
        gold, silver, bad = classes["gold"], classes["silver"], classes["bad"]
        storage_class = cluster.unique_name("sc")
        cluster.track(STORAGE_CLASSES, storage_class)
        await ResourceClient(api, STORAGE_CLASSES).create(
            class_body(
                storage_class, driver.name, reclaimPolicy="Delete", volumeBindingMode="Immediate"
            )
        )

        async with testing.child_process(
            "-m",
            "pyprovlib.csi",
            "--kubeconfig",
            str(kubeconfig_of(cluster, tmp_path)),
            "--log-format=json",
            f"--csi-address=unix://{driver.socket}",
            "--controllers=provisioner,resizer",
            "--extra-modify-metadata",
            "--retry-interval-start=100ms",
            "--retry-interval-max=1s",
            "--http-endpoint=127.0.0.1:0",
            terminate_timeout=30,
        ) as sidecar:
            port = int((await sidecar.wait_for("HTTP server listening", timeout=TIMEOUT))["port"])
            claim = cluster.unique_name("claim")
            await claims.create(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": ns},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": storage_class,
                        "volumeAttributesClassName": gold,
                        "resources": {"requests": {"storage": "1Mi"}},
                    },
                }
            )

            async def state(current: str, target: tuple[str, str] | None = None) -> Obj | None:
                obj = await claims.get(claim, ns)
                st = _status(obj)
                mvs = st.get("modifyVolumeStatus")
                wanted = (
                    None
                    if target is None
                    else {"status": target[0], "targetVolumeAttributesClassName": target[1]}
                )
                done = (
                    st.get("phase") == "Bound"
                    and st.get("currentVolumeAttributesClassName") == current
                    and mvs == wanted
                )
                return obj if done else None

            async def wait_state(current: str, target: tuple[str, str] | None = None) -> Obj:
                return await wait_for(
                    lambda: state(current, target),
                    TIMEOUT,
                    f"claim {claim}: current class {current}, modify status {target}\n"
                    f"{sidecar.tail()}",
                )

            # Created with gold: the class's parameters as CreateVolume's mutable parameters.
            bound = await wait_state(gold)
            pv_name = bound["spec"]["volumeName"]
            pv = await volumes.get(pv_name)
            assert pv["spec"]["volumeAttributesClassName"] == gold
            handle = pv["spec"]["csi"]["volumeHandle"]
            assert driver.created_mutable_parameters() == [{"iops": "3000"}]
            if kind == "example":
                assert driver.volume_parameters(handle) == {"iops": "3000"}

            # Changed to silver: one ControllerModifyVolume with silver's parameters and the
            # extra metadata; the claim's status and the PV's class follow.
            await claims.patch(claim, {"spec": {"volumeAttributesClassName": silver}}, namespace=ns)
            await wait_state(silver)
            assert (await volumes.get(pv_name))["spec"]["volumeAttributesClassName"] == silver
            expected = {
                "iops": "6000",
                "throughput": "100",
                PVC_NAME_KEY: claim,
                PVC_NAMESPACE_KEY: ns,
                PV_NAME_KEY: pv_name,
            }
            if kind == "go":
                assert driver.modified() == [expected]
            else:
                assert driver.modified() == [dict.fromkeys(expected, "")]
                assert driver.volume_parameters(handle) == expected
            assert await modify_calls(port, driver.name) == {"OK": 1.0}

            # Changed to a class the driver refuses: Infeasible, with an event; the volume
            # keeps silver.
            await claims.patch(claim, {"spec": {"volumeAttributesClassName": bad}}, namespace=ns)
            await wait_state(silver, ("Infeasible", bad))
            events = ResourceClient(api, EVENTS)

            async def refused() -> Obj | None:
                listed = await events.list(
                    namespace=ns, field_selector=f"involvedObject.name={claim}"
                )
                return next(
                    (
                        e
                        for e in listed.get("items") or []
                        if e.get("reason") == "VolumeModifyFailed"
                    ),
                    None,
                )

            event = await wait_for(refused, TIMEOUT, "a VolumeModifyFailed event")
            assert event["type"] == "Warning"
            assert "InvalidArgument" in event["message"]
            assert "colour" in event["message"]
            calls = await modify_calls(port, driver.name)
            assert calls["OK"] == 1.0
            assert calls.get("InvalidArgument", 0.0) >= 1.0
            if kind == "example":
                assert driver.volume_parameters(handle) == expected

            # Taken back to the current class: the claim is clean again. As upstream
            # (external-resizer#513), the current class is applied once more, since the driver
            # may have applied part of the refused one; and nothing after that.
            await claims.patch(claim, {"spec": {"volumeAttributesClassName": silver}}, namespace=ns)
            clean = await wait_state(silver)
            kinds = {c.get("type") for c in _status(clean).get("conditions") or []}
            assert not kinds & {"ModifyVolumeError", "ModifyingVolume"}, kinds
            assert (await volumes.get(pv_name))["spec"]["volumeAttributesClassName"] == silver
            assert (await modify_calls(port, driver.name)).get("OK") == 2.0
            if kind == "example":
                assert len(driver.modified()) == 2
                assert driver.volume_parameters(handle) == expected
            else:
                good = [p for p in driver.modified() if "colour" not in p]
                assert good == [expected, expected]

            # Deleted: the provisioner deletes the volume, leaving nothing behind.
            await claims.delete(claim, ns)

            async def gone() -> bool:
                listed = await volumes.list()
                return all(
                    (item.get("metadata") or {}).get("name") != pv_name
                    for item in listed.get("items") or []
                )

            await wait_for(gone, TIMEOUT, f"PV {pv_name} deleted")
            sidecar.proc.send_signal(signal.SIGTERM)
            assert await sidecar.exit_code(30) == 0, sidecar.tail()
