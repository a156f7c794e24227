"""Time to a running pod on a real node: ``python -m pyprovlib.csi`` against the Go sidecars.

One run of this script starts a control plane and a real node (containerd + kubelet,
:class:`pyprovlib.testing._node.KubeletNode`) from an assets directory (``--assets``, default
``$PYPROVLIB_KUBE_ASSETS``), then measures, interleaved (go, py, py, go, ...), each stack of
``tests/node/stacks.py`` on the same Go hostpath driver:

- ``go``: the Go external-provisioner, external-attacher and external-resizer;
- ``py``: ``python -m pyprovlib.csi`` (provisioner, attacher and resizer in one process).

Per run: a namespace of its own and a WaitForFirstConsumer StorageClass, then ``--pods``
claims and one pod per claim created at once. A pod's figure is the time from its claim's POST
to the pod's ``Running`` (the scheduler picks the node, the provisioner creates the volume, the
attacher attaches it, the kubelet stages and publishes it and starts the container). The
controller processes' CPU (user + system) is read over that phase and over the deletion phase
(pods and claims deleted, until every PV and VolumeAttachment is gone). Needs root and what
:func:`pyprovlib.testing._node.node_unavailable` asks for.

Usage::

    python bench/node_pod_start.py --pods 50 --runs 2

Prints human-readable lines, then exactly one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "node"))

import stacks  # noqa: E402

from pyprovlib.testing._binder import HttpTransport  # noqa: E402
from pyprovlib.testing._controlplane import ControlPlane  # noqa: E402
from pyprovlib.testing._node import KubeletNode, node_unavailable  # noqa: E402

BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
PEERS = {"go": stacks.GO, "py": stacks.PYPROVLIB}


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _controller_cpu(node: KubeletNode, stack: stacks.Stack) -> float:
    names = stacks.controller_argvs(node, stack, snapshotter=False)
    pids = node.pids()
    return sum(_cpu(pids[name]) for name in names if name in pids)


async def _list(http: HttpTransport, path: str) -> list[dict[str, Any]]:
    return list((await http.json("GET", path)).get("items") or [])


async def run_once(node: KubeletNode, peer: str, pods: int) -> dict[str, Any]:
    stack = PEERS[peer]
    await stacks.start_stack(node, stack, snapshotter=False)
    namespace = f"bench-{secrets.token_hex(3)}"
    class_name = f"bench-{namespace}"
    try:
        async with node.plane.api_client() as api:
            http = HttpTransport(api)
            await http.json("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
            await http.json(
                "POST",
                "/apis/storage.k8s.io/v1/storageclasses",
                body={
                    "metadata": {"name": class_name},
                    "provisioner": stack.driver,
                    "volumeBindingMode": "WaitForFirstConsumer",
                },
            )
            cpu_start = _controller_cpu(node, stack)
            created: dict[str, float] = {}

            async def one(i: int) -> None:
                name = f"c{i}"
                created[name] = time.monotonic()
                await http.json(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
                    body={
                        "metadata": {"name": name},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": class_name,
                            "resources": {"requests": {"storage": "1Mi"}},
                        },
                    },
                )
                await http.json(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/pods",
                    body={
                        "metadata": {"name": name},
                        "spec": {
                            "terminationGracePeriodSeconds": 0,
                            "containers": [
                                {
                                    "name": "main",
                                    "image": BUSYBOX,
                                    "imagePullPolicy": "IfNotPresent",
                                    "command": ["sleep", "3600"],
                                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                                }
                            ],
                            "volumes": [
                                {"name": "v", "persistentVolumeClaim": {"claimName": name}}
                            ],
                        },
                    },
                )

            await asyncio.gather(*(one(i) for i in range(pods)))
            running: dict[str, float] = {}
            while len(running) < pods:
                for pod in await _list(http, f"/api/v1/namespaces/{namespace}/pods"):
                    name = pod["metadata"]["name"]
                    if name not in running and (pod.get("status") or {}).get("phase") == "Running":
                        running[name] = time.monotonic()
                await asyncio.sleep(0.1)
            cpu_running = _controller_cpu(node, stack)
            times = [running[n] - created[n] for n in running]
            delete_start = time.monotonic()
            await http.json("DELETE", f"/api/v1/namespaces/{namespace}")
            while True:
                pvs = [
                    pv
                    for pv in await _list(http, "/api/v1/persistentvolumes")
                    if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace
                ]
                vas = [
                    va
                    for va in await _list(http, "/apis/storage.k8s.io/v1/volumeattachments")
                    if va["spec"]["attacher"] == stack.driver
                ]
                if not pvs and not vas:
                    break
                await asyncio.sleep(0.5)
            deleted_after = time.monotonic() - delete_start
            cpu_deleted = _controller_cpu(node, stack)
            await http.json("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{class_name}")
            selector = f"/api/v1/namespaces?fieldSelector=metadata.name={namespace}"
            while await _list(http, selector):  # noqa: ASYNC110 - polling the API server
                await asyncio.sleep(0.5)
    finally:
        await stacks.stop_stack(node, stack, snapshotter=False)
    return {
        "peer": peer,
        "p50_s": statistics.median(times),
        "p99_s": _percentile(times, 0.99),
        "max_s": max(times),
        "cpu_s_running": cpu_running - cpu_start,
        "cpu_s_deleting": cpu_deleted - cpu_running,
        "deleted_after_s": deleted_after,
    }


def _order(runs: int) -> list[str]:
    order: list[str] = []
    for i in range(runs):
        order += ["go", "py"] if i % 2 == 0 else ["py", "go"]
    return order


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    plane = ControlPlane(args.assets, nodes=0)
    node = KubeletNode(plane)
    await plane.launch()
    try:
        await node.launch()
        try:
            results = []
            for peer in _order(args.runs):
                result = await run_once(node, peer, args.pods)
                print(
                    f"{peer}: claim->pod Running p50 {result['p50_s']:.2f} s, p99 "
                    f"{result['p99_s']:.2f} s, max {result['max_s']:.2f} s; controllers "
                    f"{result['cpu_s_running']:.2f} CPU s to Running, "
                    f"{result['cpu_s_deleting']:.2f} to delete "
                    f"(all gone {result['deleted_after_s']:.1f} s after the namespace)",
                    flush=True,
                )
                results.append(result)
        finally:
            await node.stop()
    finally:
        await plane.stop()
    summary: dict[str, Any] = {"bench": "node_pod_start", "pods": args.pods, "runs": results}
    for peer in PEERS:
        mine = [r for r in results if r["peer"] == peer]
        summary[peer] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("p50_s", "p99_s", "max_s", "cpu_s_running", "cpu_s_deleting")
        }
    summary["ratio_p99_py_go"] = summary["py"]["p99_s"] / summary["go"]["p99_s"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default=os.environ.get("PYPROVLIB_KUBE_ASSETS"))
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--runs", type=int, default=2, help="runs per peer, interleaved")
    args = parser.parse_args()
    why = (
        node_unavailable(args.assets)
        if args.assets
        else "no assets directory: pass --assets or set PYPROVLIB_KUBE_ASSETS"
    )
    if why is not None:
        print(f"skipped: {why}")
        print(json.dumps({"bench": "node_pod_start", "skipped": why}))
        return
    print(json.dumps(asyncio.run(bench(args))))


if __name__ == "__main__":
    main()
