"""``python -m pyprovlib.csi``: the provisioner, attacher and resizer (with its modify
controller) in one process, as a real process against the in-memory API server and the Python
CSI test driver — provision (with a VolumeAttributesClass), attach, expand, modify, detach and
delete through it, over one CSI connection, one set of informers and one Lease; and its flags,
which are the three sidecars' own."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import aiohttp
import pytest
from csi_driver import DRIVER_NAME, serve_driver
from csi_full_driver import serve_full_driver
from process_support import (
    DEADLINE,
    attach_to_node_1,
    create_claim,
    create_class,
    entry_point,
    rbac_granted,
    rbac_used,
    register_node_1,
    status,
    until,
    wait_claim_bound,
)

from pyprovlib import testing
from pyprovlib.csi._combined import CONTROLLERS, build_parser, lease_name
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.attacher import _options as attacher
from pyprovlib.csi.provisioner import _options as provisioner
from pyprovlib.csi.resizer import _options as resizer
from pyprovlib.kube._config import DEFAULT_USER_AGENT, LimitedApiClient
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.kube._resources import (
    LEASES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    VOLUME_ATTACHMENTS,
    VOLUME_ATTRIBUTES_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.runtime._flags import parse_common
from pyprovlib.testing._server import ApiServer

NOT_EXERCISED: dict[tuple[str, str, str], str] = {
    # What examples/csi-hostpath/rbac.yaml grants that the end-to-end run does not ask for,
    # each with the code path that needs it. Anything else granted but unused, or used but
    # not granted, fails the test.
    ("", "persistentvolumes", "get"): "a clone's source PV; a PV's existence before re-saving",
    ("", "persistentvolumeclaims", "get"): "clone-source protection finalizer (read-modify-write)",
    ("", "persistentvolumeclaims", "update"): "clone-source protection; rescheduling a claim",
    ("", "events", "patch"): "a repeated event's count (the recorder's aggregation)",
    ("", "nodes", "get"): "topology: the selected node, on a cache miss",
    ("", "nodes", "list"): "topology: the informer of a driver with VOLUME_ACCESSIBILITY",
    ("", "nodes", "watch"): "topology: the informer of a driver with VOLUME_ACCESSIBILITY",
    ("storage.k8s.io", "csinodes", "get"): "topology: the selected node's CSINode, cache miss",
    ("", "secrets", "get"): "csi.storage.k8s.io/*-secret-* class parameters",
    ("snapshot.storage.k8s.io", "volumesnapshots", "get"): "restore from a VolumeSnapshot",
    ("snapshot.storage.k8s.io", "volumesnapshots", "list"): "snapshot-source protection sweep",
    ("snapshot.storage.k8s.io", "volumesnapshots", "update"): "snapshot-source protection",
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get"): "restore from a snapshot",
    # --enable-capacity (each one asked for in test_capacity_sidecar.py):
    ("storage.k8s.io", "csistoragecapacities", "list"): "--enable-capacity: its informer",
    ("storage.k8s.io", "csistoragecapacities", "watch"): "--enable-capacity: its informer",
    ("storage.k8s.io", "csistoragecapacities", "create"): "--enable-capacity: a new object",
    ("storage.k8s.io", "csistoragecapacities", "update"): "--enable-capacity: new capacity",
    ("storage.k8s.io", "csistoragecapacities", "delete"): "--enable-capacity: a class gone",
    ("", "pods", "get"): "--enable-capacity: the owner, from $POD_NAME",
    ("apps", "replicasets", "get"): "--enable-capacity: the owner Deployment, from the pod",
}


def check_rbac(requests: dict[tuple[str, str], int]) -> None:
    """The process asked for nothing rbac.yaml does not grant, and rbac.yaml grants nothing
    but what it asked for and the paths listed in NOT_EXERCISED."""
    used = rbac_used(requests)
    allowed = rbac_granted()
    assert used - allowed == set(), "requests the RBAC does not allow"
    # An informer LISTs, then WATCHes: a watch that had not reached the server when the run
    # ended (a loaded machine) is still asked for by the code that listed.
    listed = {(group, resource, "watch") for group, resource, verb in used if verb == "list"}
    assert allowed - used - listed == set(NOT_EXERCISED), "grants that nothing uses"


# -- flags -----------------------------------------------------------------------------------


def test_each_controller_keeps_its_sidecars_defaults() -> None:
    _, ns = parse_common(build_parser(), [])
    assert ns.controllers == CONTROLLERS
    sidecar = ns.sidecar_args
    expected = {
        "provisioner": provisioner.build_parser().parse_args([]),
        "attacher": attacher.parser().parse_args([]),
        "resizer": resizer.parser().parse_args([]),
    }
    assert {name: vars(sidecar[name]) for name in CONTROLLERS} == {
        name: vars(args) for name, args in expected.items()
    }
    # The defaults that differ stay different.
    assert [sidecar[n].timeout for n in CONTROLLERS] == [10.0, 15.0, 10.0]
    assert [sidecar[n].worker_threads for n in CONTROLLERS] == [100, 10, 10]


def test_a_given_flag_reaches_every_controller_that_has_it() -> None:
    argv = [
        "--timeout=30s",
        "--volume-name-prefix",
        "vol",
        "--max-entries=5",
        "--workers",
        "7",
        "--controllers=resizer,attacher",
        "--leader-election",
        "--http-endpoint=:0",
    ]
    options, ns = parse_common(build_parser(), argv)
    sidecar = ns.sidecar_args
    assert ns.controllers == ("attacher", "resizer")  # in CONTROLLERS order
    assert [sidecar[n].timeout for n in CONTROLLERS] == [30.0, 30.0, 30.0]
    assert sidecar["provisioner"].volume_name_prefix == "vol"
    assert sidecar["attacher"].max_entries == 5
    # --workers is the resizer's alone.
    assert [sidecar[n].worker_threads for n in CONTROLLERS] == [100, 10, 7]
    # Process-wide options follow the first enabled controller (the attacher here).
    assert options.leader_election is True
    assert options.leader_election_retry_period == 5.0
    assert options.http_endpoint == ":0"


def test_environment_is_read_by_each_sidecars_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYPROVLIB_TIMEOUT", "3s")
    monkeypatch.setenv("PYPROVLIB_CONTROLLERS", "provisioner")
    _, ns = parse_common(build_parser(), [])
    assert ns.controllers == ("provisioner",)
    assert [ns.sidecar_args[n].timeout for n in CONTROLLERS] == [3.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--controllers=provisioner,snapshotter"], "unknown controller 'snapshotter'"),
        (["--controllers="], "name at least one controller"),
        (["--max-entries=-1"], "--max-entries: must not be negative"),
        (["--timeout=soon"], "invalid duration 'soon'"),
    ],
)
def test_bad_flags_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_common(build_parser(), argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "python -m pyprovlib.csi: error:" in err


def test_help_lists_every_sidecars_flags() -> None:
    text = build_parser().format_help()
    for flag in ("--volume-name-prefix", "--max-entries", "--reconcile-sync", "--workers"):
        assert flag in text
    assert "--handle-volume-inuse-error" in text
    assert "--controllers LIST" in text
    assert "--timeout: provisioner 10s, attacher 15s, resizer 10s" in text
    # Every flag of every sidecar, the storage capacity group's included.
    parser = build_parser()
    for sidecar in parser.sidecars.values():
        for flag in re.findall(r"--[a-z][a-z0-9-]*", sidecar.format_help()):
            assert flag in text, flag
    assert "--enable-capacity" in text


# -- the process -----------------------------------------------------------------------------


Process = testing.ChildProcess  # the combined process; its JSON log lines are collected


def combined(kubeconfig: pathlib.Path, *args: str) -> AbstractAsyncContextManager[Process]:
    return entry_point("pyprovlib.csi", kubeconfig, *args, terminate_timeout=DEADLINE)


def unix_connections(socket: pathlib.Path) -> int:
    """Connected sockets at ``socket``'s path (the driver's accepted ones), from
    /proc/net/unix: the listening socket is not counted."""
    count = 0
    for line in pathlib.Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; St 03 = connected.
        if len(fields) >= 8 and fields[7] == str(socket) and fields[5] == "03":
            count += 1
    return count


TEST_USER_AGENT = "pyprovlib-tests (combined)"
"""The test's own client: its requests are not the process's."""


def own_client(server: ApiServer) -> LimitedApiClient:
    return LimitedApiClient(
        server.configuration(), limiter=TokenBucket(0, 0), user_agent=TEST_USER_AGENT
    )


def spec(obj: Obj) -> dict[str, Any]:
    value = obj.get("spec")
    return value if isinstance(value, dict) else {}


async def run_lifecycle(server: ApiServer, process: Process) -> dict[str, Obj]:
    """Provision, attach, expand, detach and delete one volume through the process; returns
    the objects as they were at each step."""
    seen: dict[str, Obj] = {}
    async with own_client(server) as api:
        claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
        volumes = ResourceClient(api, PERSISTENT_VOLUMES)
        attachments = ResourceClient(api, VOLUME_ATTACHMENTS)
        await register_node_1(api)
        await create_class(api, allowVolumeExpansion=True)
        classes = ResourceClient(api, VOLUME_ATTRIBUTES_CLASSES)
        for name, parameters in (("gold", {"iops": "3000"}), ("platinum", {"iops": "9000"})):
            await classes.create(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "VolumeAttributesClass",
                    "metadata": {"name": name},
                    "driverName": DRIVER_NAME,
                    "parameters": parameters,
                }
            )
        await create_claim(api, "data", volumeAttributesClassName="gold")
        seen["bound"] = claim = await wait_claim_bound(claims, "data", process)
        pv_name = spec(claim)["volumeName"]
        seen["bound_pv"] = await volumes.get(pv_name)

        seen["attached"] = await attach_to_node_1(api, "va-data", pv_name, process)

        await claims.patch(
            "data",
            {"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
            namespace="default",
        )

        async def expanded() -> Obj | None:
            claim = await claims.get("data", "default")
            return claim if status(claim).get("capacity", {}).get("storage") == "2Gi" else None

        seen["expanded"] = await until(expanded, "claim expanded", process)
        seen["expanded_pv"] = await volumes.get(pv_name)

        await claims.patch(
            "data", {"spec": {"volumeAttributesClassName": "platinum"}}, namespace="default"
        )

        async def modified() -> Obj | None:
            claim = await claims.get("data", "default")
            done = status(claim).get("currentVolumeAttributesClassName") == "platinum"
            return claim if done and "modifyVolumeStatus" not in status(claim) else None

        seen["modified"] = await until(modified, "claim modified", process)
        seen["modified_pv"] = await volumes.get(pv_name)

        await attachments.delete("va-data")

        async def detached() -> bool:
            return not any(
                va["metadata"]["name"] == "va-data"
                for va in (await attachments.list()).get("items") or []
            )

        await until(detached, "volume detached", process)
        await claims.delete("data", "default")

        async def deleted() -> bool:
            names = {pv["metadata"]["name"] for pv in (await volumes.list()).get("items") or []}
            return pv_name not in names

        await until(deleted, "volume deleted", process)
    return seen


async def test_one_process_provisions_attaches_expands_and_deletes(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    async with (
        serve_full_driver(sock_dir) as (state, driver, _),
    ):
        socket = sock_dir / "csi.sock"
        async with combined(
            kubeconfig,
            "--csi-address",
            f"unix://{socket}",
            "--leader-election",
            "--leader-election-namespace",
            "default",
        ) as process:
            seen = await run_lifecycle(server, process)

            calls = [method for method, _ in state.calls]
            for method in (
                "CreateVolume",
                "ControllerPublishVolume",
                "ControllerExpandVolume",
                "ControllerModifyVolume",
                "ControllerUnpublishVolume",
                "DeleteVolume",
            ):
                assert calls.count(method) == 1, (method, calls)
            (create,) = state.requests("CreateVolume")
            assert create.mutable_parameters == {"iops": "3000"}
            (modify,) = state.requests("ControllerModifyVolume")
            assert modify.mutable_parameters == {"iops": "9000"}
            assert spec(seen["bound_pv"])["volumeAttributesClassName"] == "gold"
            assert status(seen["bound"])["currentVolumeAttributesClassName"] == "gold"
            assert spec(seen["modified_pv"])["volumeAttributesClassName"] == "platinum"
            assert not state.volumes
            handle = spec(seen["expanded_pv"])["csi"]["volumeHandle"]
            assert driver.published == {handle: set()}  # published to node-1-id, then not
            (publish,) = state.requests("ControllerPublishVolume")
            assert publish.node_id == "node-1-id"
            assert spec(seen["expanded_pv"])["capacity"]["storage"] == "2Gi"

            # One connection: the driver was identified once, and one socket is connected.
            assert calls.count("GetPluginInfo") == 1, calls
            assert unix_connections(socket) == 1
            # One Lease, the combined process's.
            async with own_client(server) as api:
                leases = (await ResourceClient(api, LEASES).list("default")).get("items") or []
            assert [lease["metadata"]["name"] for lease in leases] == [lease_name(DRIVER_NAME)]
            # One set of informers: each resource watched once, though PersistentVolumes are
            # the provisioner's, the attacher's and the resizer's (three sidecars: three
            # watches). Claims may be listed once more by the provisioner's first data-source
            # protection sweep, when it runs before the cache synced.
            requests = server.requests.snapshot(DEFAULT_USER_AGENT)
            for resource in ("persistentvolumes", "persistentvolumeclaims", "storageclasses"):
                assert requests.get(("watch", resource)) == 1, (resource, requests)
            assert requests.get(("list", "persistentvolumes")) == 1, requests
            check_rbac(requests)

            process.proc.terminate()
            assert await asyncio.wait_for(process.proc.wait(), DEADLINE) == 0
        assert any(line.get("event") == "CSI controllers in one process" for line in process.lines)


@pytest.mark.parametrize("flag", [True, False], ids=["flag", "no-flag"])
async def test_read_only_many_is_published_read_only_with_controller_publish_readonly(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path, flag: bool
) -> None:
    # external-provisioner's --controller-publish-readonly marks the PV of a ReadOnlyMany
    # claim read-only; the attacher then publishes it read-only: one process, both halves.
    async with serve_full_driver(sock_dir) as (state, _, _):
        args = [
            f"--csi-address=unix://{sock_dir / 'csi.sock'}",
            "--controllers=provisioner,attacher",
        ]
        if flag:
            args.append("--controller-publish-readonly")
        async with combined(kubeconfig, *args) as process, own_client(server) as api:
            claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
            await register_node_1(api)
            await create_class(api)
            await create_claim(api, "shared", accessModes=["ReadOnlyMany"])
            claim = await wait_claim_bound(claims, "shared", process)
            pv_name = spec(claim)["volumeName"]
            pv = await ResourceClient(api, PERSISTENT_VOLUMES).get(pv_name)
            assert spec(pv)["csi"].get("readOnly", False) is flag
            await attach_to_node_1(api, "va-shared", pv_name, process)
            (publish,) = state.requests("ControllerPublishVolume")
            assert publish.readonly is flag
            mode = publish.volume_capability.access_mode.mode
            assert mode == v1.VolumeCapabilityAccessModeMode.MULTI_NODE_READER_ONLY


async def test_a_driver_without_expansion_is_refused_with_the_way_out(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    """The resizer enabled (the default) on a driver that expands nowhere: the process exits
    1 saying so and how to leave the resizer out; with --controllers it provisions."""
    async with serve_driver(sock_dir, snapshots=False):
        address = f"unix://{sock_dir / 'csi.sock'}"
        async with combined(kubeconfig, "--csi-address", address) as process:
            assert await asyncio.wait_for(process.proc.wait(), DEADLINE) == 1
        failed = [line for line in process.lines if line.get("level") == "error"]
        assert any(
            "neither supports controller resize" in str(line.get("error"))
            and "--controllers=provisioner,attacher" in str(line.get("error"))
            for line in failed
        ), process.raw[-10:]

        async with (
            combined(kubeconfig, "--csi-address", address, "--controllers=provisioner") as process,
            own_client(server) as api,
        ):
            await create_class(api)
            claims = await create_claim(api, "data")
            await wait_claim_bound(claims, "data", process)


async def test_a_lost_driver_connection_ends_the_process(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    """As each sidecar does (--exit-on-connection-loss, default true): the driver goes away,
    the next call finds it gone (a claim to provision), the process exits 1 so that the pod
    restarts it."""
    address = f"unix://{sock_dir / 'csi.sock'}"
    async with combined(kubeconfig, "--csi-address", address) as process:
        async with serve_full_driver(sock_dir):

            async def started() -> bool:
                return any(
                    line.get("event") == "CSI controllers in one process" for line in process.lines
                )

            await until(started, "start-up", process)
        # The driver is gone; the process is not stopped by the test.
        async with own_client(server) as api:
            await create_class(api)
            await create_claim(api, "after-loss")
        assert await asyncio.wait_for(process.proc.wait(), DEADLINE) == 1
    assert any("connection" in json.dumps(line).lower() for line in process.lines[-5:])


async def test_two_replicas_share_one_lease_and_the_standby_is_ready(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    """Two replicas: one Lease, held by one of them; both answer /healthz and /readyz 200 (a
    standby is ready: leadership is not readiness). Stopping the leader hands the Lease
    over."""
    async with (
        serve_full_driver(sock_dir),
    ):
        flags = (
            "--csi-address",
            f"unix://{sock_dir / 'csi.sock'}",
            "--leader-election",
            "--leader-election-namespace=default",
            "--leader-election-lease-duration=3s",
            "--leader-election-renew-deadline=2s",
            "--leader-election-retry-period=500ms",
            "--http-endpoint=127.0.0.1:0",
        )
        async with (
            combined(kubeconfig, *flags) as first,
            combined(kubeconfig, *flags) as second,
            own_client(server) as api,
            aiohttp.ClientSession() as http,
        ):
            leases = ResourceClient(api, LEASES)

            async def ports() -> list[int] | None:
                found = [
                    [
                        line["port"]
                        for line in p.lines
                        if line.get("event") == "HTTP server listening"
                    ]
                    for p in (first, second)
                ]
                return [f[0] for f in found] if all(found) else None

            first_port, second_port = await until(ports, "HTTP servers")

            async def holder() -> str | None:
                items = (await leases.list("default")).get("items") or []
                if len(items) != 1:
                    return None
                return str(items[0]["spec"].get("holderIdentity") or "") or None

            leader = await until(holder, "a leader")

            async def all_answer(path: str) -> bool:
                for port in (first_port, second_port):
                    async with http.get(f"http://127.0.0.1:{port}{path}") as response:
                        if response.status != 200:
                            return False
                return True

            await until(lambda: all_answer("/readyz"), "both ready")
            assert await all_answer("/healthz")
            items = (await leases.list("default")).get("items") or []
            assert [i["metadata"]["name"] for i in items] == [lease_name(DRIVER_NAME)]

            # The leader goes away gracefully: it releases the Lease, the other takes it.
            leading, standby = (first, second) if await _holds(first, leader) else (second, first)
            leading.proc.terminate()
            assert await asyncio.wait_for(leading.proc.wait(), DEADLINE) == 0

            async def taken_over() -> bool:
                now = await holder()
                return now is not None and now != leader

            await until(taken_over, "the Lease taken over", standby)
            assert standby.proc.returncode is None


async def _holds(process: Process, identity: str) -> bool:
    """Whether ``process`` logged ``identity`` as its own (the elector logs its id)."""
    return any(line.get("id") == identity for line in process.lines)


async def test_each_controller_writes_with_its_sidecars_api_budget(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    """--kube-api-qps and --kube-api-burst apply to each controller, as to each of the three
    Go sidecars: one process keeps three budgets, each controller its own client and limiter
    (one budget shared by all three made pods on a real node wait about twice as long for
    their volumes as with the Go sidecars, bench/node_pod_start.py). The shared informers and
    the Lease keep the process's client."""
    from pyprovlib._logging import get_logger
    from pyprovlib.csi._combined import build
    from pyprovlib.kube._config import new_client
    from pyprovlib.runtime import RuntimeContext

    async with serve_full_driver(sock_dir):
        argv = [
            f"--kubeconfig={kubeconfig}",
            f"--csi-address=unix://{sock_dir / 'csi.sock'}",
            "--kube-api-qps=7",
            "--kube-api-burst=9",
        ]
        options, args = parse_common(build_parser(), argv)
        async with await new_client(options.client_settings()) as api:
            ctx = RuntimeContext(options=options, args=args, api_client=api, log=get_logger("t"))
            combined = await build(ctx)
            # The resizer's modify controller too, with a budget of its own.
            # Each controller's own client (the Controller protocol does not name it).
            clients = [
                cast(Any, combined.controllers[name]).client for name in (*CONTROLLERS, "modify")
            ]
            try:
                assert combined.client is api
                assert len({id(client) for client in (api, *clients)}) == 5
                limiters = [client.limiter for client in clients]
                assert len({id(limiter) for limiter in limiters}) == 4
                assert {(limiter.qps, limiter.burst) for limiter in limiters} == {(7.0, 9)}
            finally:
                combined.connection.close()
                for client in clients:
                    await client.close()
