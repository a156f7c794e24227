"""Node deployment at scale with a crash (issue 28, "Done means"): the hostpath example in node
mode (``python -m pyprovlib.examples.hostpath --mode=node``), three real processes for three
nodes against the in-memory API server, 300 claims spread over the nodes; one process is
SIGKILLed midway and started again.

The three processes share one machine, so they share the class's basePath; which instance made
a directory is read from their JSON logs ("volume directory ready", with the node). After the
restart: every claim Bound to ``pvc-<uid>``, its PV on the claim's selected node, every
directory made only by that node's instance — exactly once, except that the killed instance's
claims may have been made again by its restarted self (mkdir is idempotent, the PV name
deterministic) — one directory per PV and none without; after deletion nothing is left.

With ``Immediate`` binding the instances also race for every claim: still one node per claim,
one PV, and each directory made by the winner only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from claim_support import claim_body
from rel_support import (
    LoggedProcess,
    bounded,
    create_class,
    create_namespace,
    unique,
    wait_until,
)

from pyprovlib.controller._provision import ANN_SELECTED_NODE
from pyprovlib.kube._objects import Obj, annotations_of, name_of, uid_of
from pyprovlib.kube._resources import NODES, PERSISTENT_VOLUME_CLAIMS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

PROVISIONER = "pyprovlib.io/hostpath"
NODE_NAMES = ("node-a", "node-b", "node-c")
READY = "volume directory ready"


class HostPathNode(LoggedProcess):
    """One node's ``python -m pyprovlib.examples.hostpath --mode=node``."""

    def __init__(self, kubeconfig: Path, node: str, log: Path) -> None:
        super().__init__(log)
        self.kubeconfig = kubeconfig
        self.node = node

    def argv(self) -> list[str]:
        import sys

        return [
            sys.executable,
            "-m",
            "pyprovlib.examples.hostpath",
            f"--kubeconfig={self.kubeconfig}",
            "--mode=node",
            f"--node-name={self.node}",
            "--leader-election=false",
            "--resize-events=false",
            "--worker-threads=8",
            "--node-deployment-base-delay=100ms",
            "--node-deployment-max-delay=1s",
            "--log-format=json",
        ]

    def made(self) -> list[str]:
        """The claims (namespace/name) this node's instance made a directory for, per run."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == READY:
                    assert record.get("node") == self.node, record
                    out.append(str(record["claim"]))
        return out


@contextlib.asynccontextmanager
async def three_nodes(tmp_path: Path, binding: str) -> AsyncIterator[tuple[Any, ...]]:
    root = tmp_path / "local"
    root.mkdir()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        for node in NODE_NAMES:
            await ResourceClient(client, NODES).create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                }
            )
        ns = unique("nd")
        await create_namespace(client, ns)
        class_name = await create_class(
            client,
            PROVISIONER,
            reclaimPolicy="Delete",
            volumeBindingMode=binding,
            parameters={"basePath": str(root)},
        )
        processes = {n: HostPathNode(kubeconfig, n, tmp_path / f"{n}.log") for n in NODE_NAMES}
        try:
            yield client, ns, class_name, root, processes
        finally:
            for process in processes.values():
                await process.close()


def claims_of(server_claims: list[Obj], ns: str) -> list[Obj]:
    return [c for c in server_claims if (c.get("metadata") or {}).get("namespace") == ns]


async def scenario(tmp_path: Path, *, binding: str, claims: int) -> None:
    async with three_nodes(tmp_path, binding) as (client, ns, class_name, root, processes):
        api = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        placed: dict[str, str | None] = {
            f"claim-{i:03d}": (NODE_NAMES[i % 3] if binding == "WaitForFirstConsumer" else None)
            for i in range(claims)
        }

        def body(name: str, node: str | None) -> Obj:
            selected = {ANN_SELECTED_NODE: node} if node else None
            return claim_body(name, class_name, namespace=ns, size="1Mi", annotations=selected)

        for process in processes.values():
            await process.start()
        await bounded((api.create(body(n, node)) for n, node in placed.items()), limit=16)

        state: dict[str, list[Obj]] = {"claims": []}

        async def refresh() -> None:
            state["claims"] = (await api.list(namespace=ns)).get("items") or []

        def bound() -> int:
            return sum((c.get("status") or {}).get("phase") == "Bound" for c in state["claims"])

        async def wait_bound(count: int, timeout: float) -> None:
            async def poll() -> None:
                while bound() < count:
                    await refresh()
                    await asyncio.sleep(0.2)

            try:
                async with asyncio.timeout(timeout):
                    await poll()
            except TimeoutError:
                tails = "\n".join(f"--- {n}\n{p.tail()}" for n, p in processes.items())
                raise AssertionError(f"{bound()}/{count} claims bound\n{tails}") from None

        # Midway: kill node-b's instance, let the others go on, start it again.
        victim = processes["node-b"]
        await wait_bound(claims // 3, timeout=120)
        await victim.kill()
        killed_at = bound()
        await wait_bound(min(claims, killed_at + claims // 6), timeout=120)
        await victim.start()
        await wait_bound(claims, timeout=240)
        assert killed_at < claims, "the kill landed after everything was bound"

        # Every claim bound to pvc-<uid>, on one node, made by that node's instance only.
        final = {name_of(c): c for c in state["claims"]}
        owner = {n: annotations_of(c)[ANN_SELECTED_NODE] for n, c in final.items()}
        if binding == "WaitForFirstConsumer":
            assert owner == placed
        made = {node: Counter(p.made()) for node, p in processes.items()}
        for name, claim in final.items():
            key = f"{ns}/{name}"
            assert claim["spec"]["volumeName"] == f"pvc-{uid_of(claim)}"
            makers = {node for node, counter in made.items() if counter[key]}
            assert makers == {owner[name]}, (key, makers, owner[name])
            if owner[name] != victim.node:
                assert made[owner[name]][key] == 1, key  # never twice
        assert sorted(p.name for p in root.iterdir()) == sorted(
            claim["spec"]["volumeName"] for claim in final.values()
        )

        # Deletion: each directory removed by its node's instance.
        await bounded((api.delete(n, ns) for n in placed), limit=16)
        await wait_until(
            lambda: not any(root.iterdir()),
            timeout=240,
            message=lambda: f"directories left: {len(list(root.iterdir()))}",
        )
        for process in processes.values():
            assert await process.terminate() == 0


@pytest.mark.heavy
async def test_300_claims_three_nodes_one_instance_sigkilled(tmp_path: Path) -> None:
    await scenario(tmp_path, binding="WaitForFirstConsumer", claims=300)


@pytest.mark.heavy
async def test_300_immediate_claims_three_nodes_one_instance_sigkilled(tmp_path: Path) -> None:
    await scenario(tmp_path, binding="Immediate", claims=300)
