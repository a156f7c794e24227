"""What the named libraries alone cost per call, on a real control plane: the floor under the
CSI sidecar's CPU per volume.

Per volume, the CSI provisioner sidecar (``python -m pyprovlib.csi.provisioner``) makes one
CreateVolume call (grpclib, to the Go ``hostpathplugin``), one PV POST and two Event POSTs
(kubernetes-asyncio's ``ApiClient.request`` over its aiohttp session: TLS, keep-alive) and
decodes the watch events of its claim and its PV. This script makes each of those calls with
nothing of pyprovlib around them — the libraries' public API, as a minimal caller would use
it (the aiohttp session set up once as pyprovlib sets it up: ``trust_env`` off) —
``--concurrency`` at a time (default 100, the sidecar's ``--worker-threads``), and reports
the event loop thread's CPU (user + system) per call and the wall time per call, medians of
``--repeat``
rounds of ``--calls`` calls each. The PV and Event bodies are the ones the sidecar sends
(a CSI PV bound to a claim; a ``Provisioning`` Event); the watch line is a bound claim as the
API server sends it.

The sum for one volume (1 CreateVolume + 3 POSTs + the watch lines) is what the sidecar
cannot go below while it uses these libraries, to compare with what the Go
external-provisioner needs per volume in ``csi_real.py``.

Usage::

    python bench/library_floor.py --calls 2000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import csi_real  # noqa: E402 - bench/csi_real.py: the driver, the cluster's CSI objects

NAMESPACE = "floor"


def _cpu() -> float:
    # The event loop's thread alone: the control plane's child reaper runs in this process
    # too, in a thread of its own, and would otherwise be counted.
    return time.thread_time()


async def _measure(
    calls: int, concurrency: int, call: Callable[[int], Awaitable[None]]
) -> tuple[float, float]:
    """CPU µs and wall µs per call for ``calls`` calls, ``concurrency`` in flight."""
    counter = iter(range(calls))

    async def worker() -> None:
        for i in counter:
            await call(i)

    cpu0, wall0 = _cpu(), time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(worker())
    return (_cpu() - cpu0) / calls * 1e6, (time.perf_counter() - wall0) / calls * 1e6


def _pv(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": csi_real.DRIVER},
        },
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": csi_real.STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "claimRef": {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": NAMESPACE,
                "name": name,
                "uid": "6f1c2e8a-0000-4000-8000-000000000001",
                "resourceVersion": "12345",
            },
            "csi": {
                "driver": csi_real.DRIVER,
                "volumeHandle": "0f8b2a3c-a1b2-11ee-9f3b-0242ac120002",
                "fsType": "ext4",
                "volumeAttributes": {
                    "storage.kubernetes.io/csiProvisionerIdentity": "1732680000000-1234-"
                    + csi_real.DRIVER
                },
            },
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": csi_real.TOPOLOGY_KEY,
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def _event(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"claim-{i}.{i:016x}", "namespace": NAMESPACE},
        "involvedObject": {
            "kind": "PersistentVolumeClaim",
            "apiVersion": "v1",
            "namespace": NAMESPACE,
            "name": f"claim-{i}",
            "uid": "6f1c2e8a-0000-4000-8000-000000000001",
            "resourceVersion": "12345",
        },
        "reason": "Provisioning",
        "message": f'External provisioner is provisioning volume for claim "{NAMESPACE}/claim-{i}"',
        "type": "Normal",
        "source": {"component": f"{csi_real.DRIVER}_node-1"},
        "reportingComponent": f"{csi_real.DRIVER}_node-1",
        "reportingInstance": "",
        "count": 1,
        "firstTimestamp": "2026-11-27T03:00:00Z",
        "lastTimestamp": "2026-11-27T03:00:00Z",
    }


async def _api_calls(args: argparse.Namespace, kubeconfig: Path, node: str) -> dict[str, Any]:
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import ApiClient, Configuration

    from pyprovlib.kube._config import use_resolved_proxy

    configuration = Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    results: dict[str, Any] = {}
    async with ApiClient(configuration) as api:
        # The session set up as pyprovlib sets it up (aiohttp's trust_env off: otherwise two
        # thread-pool round trips a request, ~0.5-1 CPU ms each on this machine); nothing per
        # call.
        use_resolved_proxy(api)

        async def request(method: str, path: str, body: Any = None) -> Any:
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            query: list[tuple[str, str]] = []
            await api.update_params_for_auth(headers, query, ["BearerToken"])
            response = await api.request(
                method,
                configuration.host + path,
                query_params=query,
                headers=headers,
                body=body,
                _preload_content=False,
            )
            try:
                data = await response.read()
                if response.status >= 400:
                    raise RuntimeError(f"{method} {path}: {response.status} {data[:200]!r}")
                return json.loads(data)
            finally:
                response.release()

        await request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        rounds: dict[str, list[tuple[float, float]]] = {"pv_post": [], "event_post": []}
        for r in range(args.repeat):
            prefix = f"floor-{r}-"

            async def post_pv(i: int, prefix: str = prefix) -> None:
                await request("POST", "/api/v1/persistentvolumes", _pv(f"{prefix}{i}", node))

            async def post_event(i: int, r: int = r) -> None:
                await request(
                    "POST", f"/api/v1/namespaces/{NAMESPACE}/events", _event(r * args.calls + i)
                )

            rounds["pv_post"].append(await _measure(args.calls, args.concurrency, post_pv))
            rounds["event_post"].append(await _measure(args.calls, args.concurrency, post_event))

            async def delete_pv(i: int, prefix: str = prefix) -> None:
                await request("DELETE", f"/api/v1/persistentvolumes/{prefix}{i}")

            await _measure(args.calls, args.concurrency, delete_pv)
        for name, values in rounds.items():
            results[name] = _summary(values)

        # A watch line of a bound claim, as the API server sends it, decoded as the informer
        # does (one json.loads per line).
        claim = await request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims",
            csi_real._claim("sample", NAMESPACE),
        )
        line = json.dumps({"type": "MODIFIED", "object": claim}).encode()
        decode_rounds = []
        for _ in range(args.repeat):
            cpu0 = _cpu()
            for _ in range(args.calls * 5):
                json.loads(line)
            decode_rounds.append(((_cpu() - cpu0) / (args.calls * 5) * 1e6, 0.0))
        results["watch_line_decode"] = _summary(decode_rounds)
        results["watch_line_bytes"] = len(line)
    return results


async def _grpc_calls(args: argparse.Namespace, node: str) -> dict[str, Any]:
    from grpclib.client import Channel, UnaryUnaryMethod

    from pyprovlib.csi._proto.csi import v1  # the generated messages only

    directory = Path(tempfile.mkdtemp(prefix="library-floor-", dir=args.workdir))
    driver, socket = await csi_real._start_driver(args.assets, directory, node)
    channel = Channel(path=str(socket))
    # grpclib's callable for one unary method, made once (as the sidecar does).
    create_volume = UnaryUnaryMethod(
        channel, "/csi.v1.Controller/CreateVolume", v1.CreateVolumeRequest, v1.CreateVolumeResponse
    )
    capability = v1.VolumeCapability(
        mount=v1.VolumeCapabilityMountVolume(fs_type="ext4"),
        access_mode=v1.VolumeCapabilityAccessMode(
            mode=v1.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER
        ),
    )
    rounds: list[tuple[float, float]] = []
    try:
        for r in range(args.repeat):

            async def create(i: int, r: int = r) -> None:
                await create_volume(
                    v1.CreateVolumeRequest(
                        name=f"pvc-floor-{r}-{i}",
                        capacity_range=v1.CapacityRange(required_bytes=1 << 20),
                        volume_capabilities=[capability],
                        parameters={},
                    ),
                    timeout=60,
                )

            rounds.append(await _measure(args.calls, args.concurrency, create))
    finally:
        channel.close()
        await csi_real._stop(driver)
    return {"create_volume": _summary(rounds)}


def _summary(rounds: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "cpu_us": round(statistics.median(c for c, _ in rounds), 1),
        "wall_us": round(statistics.median(w for _, w in rounds), 1),
        "cpu_us_rounds": [round(c, 1) for c, _ in rounds],
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from pyprovlib.testing._controlplane import ControlPlane

    async with ControlPlane.start(
        args.assets, controller_manager=False, scheduler=False, nodes=1, snapshot_crds=False
    ) as plane:
        node = plane.node_names[0]
        grpc = await _grpc_calls(args, node)
        api = await _api_calls(args, plane.kubeconfig_path, node)
    results = {**grpc, **api}
    floor = (
        results["create_volume"]["cpu_us"]
        + results["pv_post"]["cpu_us"]
        + 2 * results["event_post"]["cpu_us"]
        + args.watch_lines * results["watch_line_decode"]["cpu_us"]
    )
    return {
        "bench": "library_floor",
        "calls": args.calls,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "results": results,
        "per_volume_floor_cpu_ms": round(floor / 1000, 3),
        "per_volume": (
            f"1 CreateVolume + 1 PV POST + 2 Event POSTs + {args.watch_lines} watch lines"
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--assets",
        type=Path,
        default=Path(os.environ.get("PYPROVLIB_KUBE_ASSETS") or "/opt/kube-assets"),
    )
    p.add_argument("--calls", type=int, default=2000, help="calls per round")
    p.add_argument("--repeat", type=int, default=3, help="rounds (medians are reported)")
    p.add_argument("--concurrency", type=int, default=100, help="calls in flight")
    p.add_argument(
        "--watch-lines",
        type=int,
        default=6,
        help="watch events decoded per volume (the claim's and the PV's ADDED and MODIFIED)",
    )
    p.add_argument("--workdir", help="where the driver's directory goes")
    args = p.parse_args()
    result = asyncio.run(bench(args))
    for call, figures in result["results"].items():
        if isinstance(figures, dict):
            print(
                f"{call}: {figures['cpu_us']:.0f} CPU µs per call "
                f"(rounds {figures['cpu_us_rounds']}), {figures['wall_us']:.0f} wall µs per call"
            )
    print(f"per volume ({result['per_volume']}): {result['per_volume_floor_cpu_ms']:.2f} CPU ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
