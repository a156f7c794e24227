"""A throw-away single-node Ceph cluster for tests: one mon and one memstore OSD on 127.0.0.1,
everything (config, fsid, keyrings, data, logs, sockets, pid files) in one temporary directory.

Used by the RBD tests' session fixture; also runnable by hand::

    python tests/ceph/cluster.py /tmp/ceph-dev      # start, print how to reach it, wait for ^C

No mgr is started: the ``rbd`` commands the provisioner uses do not need one. Every command
runs with an argv list and a timeout; no shell is involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "REQUIRED_BINARIES",
    "CephCluster",
    "CephStartError",
    "missing_binaries",
]

REQUIRED_BINARIES = ("ceph-mon", "ceph-osd", "ceph", "ceph-authtool", "monmaptool", "rbd")
"""Programs the cluster needs (Debian packages ceph-mon, ceph-osd and ceph-common)."""

POOL = "rbd"
"""The RBD pool every test uses."""

_CMD_TIMEOUT = 60.0
_CLIENT_TIMEOUTS = (
    "--client_mount_timeout",
    "10",
    "--rados_mon_op_timeout",
    "10",
    "--rados_osd_op_timeout",
    "10",
)


class CephStartError(RuntimeError):
    """The cluster did not come up; the message carries the tail of the daemons' logs."""


def missing_binaries() -> list[str]:
    """The required programs not found in PATH (empty when the cluster can run)."""
    return [name for name in REQUIRED_BINARIES if shutil.which(name) is None]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Looked up once in the parent, so the child between fork and exec only makes one libc call.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:
    # The daemons get SIGKILL if the test process dies without stopping them.
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


@dataclass
class CephCluster:
    """One mon + one memstore OSD under ``root``; :meth:`start` and :meth:`stop`."""

    root: Path
    fsid: str = field(default_factory=lambda: str(uuid.uuid4()))
    mon_port: int = 0
    """The monitor's msgr1 port: what ``-m 127.0.0.1:PORT`` and the kernel client speak."""
    mon_port_v2: int = 0
    admin_key: str = ""
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        """The cluster's ceph.conf."""
        return self.root / "ceph.conf"

    @property
    def admin_keyring(self) -> Path:
        """Keyring of client.admin."""
        return self.root / "client.admin.keyring"

    @property
    def monitors(self) -> str:
        """The monitor address as a StorageClass's ``monitors`` parameter spells it."""
        return f"127.0.0.1:{self.mon_port}"

    def _write_conf(self) -> None:
        r = self.root
        self.conf.write_text(
            f"""[global]
fsid = {self.fsid}
mon host = [v2:127.0.0.1:{self.mon_port_v2},v1:127.0.0.1:{self.mon_port}]
mon initial members = a
public addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {self.admin_keyring}
run dir = {r}/run
crash dir = {r}/crash
exporter sock dir = {r}/run
admin socket = {r}/run/$name.$pid.asok
pid file = {r}/run/$name.pid
log file = {r}/log/$name.log
mon cluster log file = {r}/log/cluster.log
log to stderr = false
err to stderr = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
paxos propose interval = 0.1
mon osd reporter subtree level = osd
auth allow insecure global id reclaim = false
ms async op threads = 1

[mon]
mon data = {r}/mon-$id

[osd]
osd data = {r}/osd-$id
osd objectstore = memstore
memstore device bytes = 1073741824
osd op num shards = 1
osd op num threads per shard = 1
osd max object name len = 256
osd max object namespace len = 64
"""
        )

    def _run(self, argv: Sequence[str], *, timeout: float = _CMD_TIMEOUT) -> str:
        try:
            done = subprocess.run(
                list(argv),
                cwd=self.root,
                capture_output=True,
                timeout=timeout,
                check=False,
                env=self.env(),
            )
        except subprocess.TimeoutExpired as err:
            raise CephStartError(f"{argv[0]} {argv[1:3]} timed out after {timeout}s") from err
        if done.returncode != 0:
            raise CephStartError(
                f"{' '.join(argv)} exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )
        return done.stdout.decode()

    def env(self) -> dict[str, str]:
        """An environment for ceph tools that cannot pick up a stray config."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}

    def ceph(self, *args: str, timeout: float = _CMD_TIMEOUT) -> str:
        """Run ``ceph`` as client.admin against this cluster; its stdout."""
        return self._run(["ceph", "-c", str(self.conf), *_CLIENT_TIMEOUTS, *args], timeout=timeout)

    def rbd_argv(self, *args: str) -> list[str]:
        """argv of an ``rbd`` command run as client.admin against this cluster."""
        return ["rbd", "-c", str(self.conf), *_CLIENT_TIMEOUTS, *args]

    def rbd(self, *args: str, timeout: float = _CMD_TIMEOUT) -> str:
        """Run ``rbd`` as client.admin against this cluster; its stdout."""
        return self._run(self.rbd_argv(*args), timeout=timeout)

    def rbd_json(self, *args: str) -> object:
        """``rbd ... --format=json``, parsed."""
        return json.loads(self.rbd(*args, "--format=json"))

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "wb")  # noqa: SIM115 - child owns it
        with log:
            proc = subprocess.Popen(
                list(argv),
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - one prctl call, no locks
            )
        self._procs.append(proc)

    def _check_alive(self) -> None:
        for proc in self._procs:
            if proc.poll() is not None:
                raise CephStartError(f"{proc.args!r} exited with {proc.returncode}\n{self.logs()}")

    def logs(self) -> str:
        """The tail of every daemon log (for failure messages)."""
        out = []
        for path in sorted((self.root / "log").glob("*")):
            out.append(f"--- {path.name}\n{_tail(path)}")
        return "\n".join(out)

    def start(self, timeout: float = 90.0) -> None:
        """Create and start the cluster and an RBD pool; returns once ``rbd`` works."""
        deadline = time.monotonic() + timeout
        for sub in ("run", "log", "crash", "mon-a", "osd-0"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.mon_port = self.mon_port or _free_port()
        self.mon_port_v2 = self.mon_port_v2 or _free_port()
        self._write_conf()
        mon_keyring = self.root / "mon.keyring"
        self._run(
            [
                "ceph-authtool",
                "--create-keyring",
                str(mon_keyring),
                "--gen-key",
                "-n",
                "mon.",
                "--cap",
                "mon",
                "allow *",
            ]
        )
        self._run(
            [
                "ceph-authtool",
                "--create-keyring",
                str(self.admin_keyring),
                "--gen-key",
                "-n",
                "client.admin",
                "--cap",
                "mon",
                "allow *",
                "--cap",
                "osd",
                "allow *",
                "--cap",
                "mgr",
                "allow *",
                "--cap",
                "mds",
                "allow *",
            ]
        )
        self._run(["ceph-authtool", str(mon_keyring), "--import-keyring", str(self.admin_keyring)])
        self.admin_key = self._run(
            ["ceph-authtool", str(self.admin_keyring), "-n", "client.admin", "-p"]
        ).strip()
        monmap = self.root / "monmap"
        self._run(
            [
                "monmaptool",
                "--create",
                "--fsid",
                self.fsid,
                "--addv",
                "a",
                f"[v2:127.0.0.1:{self.mon_port_v2},v1:127.0.0.1:{self.mon_port}]",
                str(monmap),
            ]
        )
        self._run(
            [
                "ceph-mon",
                "-c",
                str(self.conf),
                "--mkfs",
                "-i",
                "a",
                "--monmap",
                str(monmap),
                "--keyring",
                str(mon_keyring),
            ]
        )
        self._spawn("mon.a", ["ceph-mon", "-f", "-c", str(self.conf), "-i", "a"])

        osd_uuid = str(uuid.uuid4())
        osd_key = self._run(["ceph-authtool", "--gen-print-key"]).strip()
        secret = self.root / "osd-0.json"
        secret.write_text(json.dumps({"cephx_secret": osd_key}))
        osd_id = self._retry(deadline, lambda: self.ceph("osd", "new", osd_uuid, "-i", str(secret)))
        if osd_id.strip() != "0":
            raise CephStartError(f"expected OSD id 0, got {osd_id!r}")
        (self.root / "osd-0" / "keyring").write_text(f"[osd.0]\n\tkey = {osd_key}\n")
        self._run(
            [
                "ceph-osd",
                "-c",
                str(self.conf),
                "-i",
                "0",
                "--mkfs",
                "--osd-uuid",
                osd_uuid,
                "--keyring",
                str(self.root / "osd-0" / "keyring"),
            ]
        )
        self._spawn(
            "osd.0",
            [
                "ceph-osd",
                "-f",
                "-c",
                str(self.conf),
                "-i",
                "0",
                "--keyring",
                str(self.root / "osd-0" / "keyring"),
            ],
        )
        self.ceph("osd", "pool", "create", POOL, "8", "8")
        self.ceph("osd", "pool", "application", "enable", POOL, "rbd")
        while json.loads(self.ceph("osd", "stat", "--format=json")).get("num_up_osds") != 1:
            self._check_alive()
            if time.monotonic() > deadline:
                raise CephStartError(f"the OSD did not come up in time\n{self.logs()}")
            time.sleep(0.2)
        # A real write and delete: the pool's placement groups are active and serving.
        self._retry(deadline, lambda: self.rbd("create", "--pool", POOL, "--size", "1", "probe"))
        self.rbd("rm", "--no-progress", "--pool", POOL, "probe")

    def _retry(self, deadline: float, op: object) -> str:
        assert callable(op)
        while True:
            self._check_alive()
            try:
                return str(op())
            except CephStartError:
                if time.monotonic() > deadline:
                    raise CephStartError(f"cluster not up in time\n{self.logs()}") from None
                time.sleep(0.3)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the daemons (SIGTERM, then SIGKILL) — the OSD first, then the mon."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    @contextlib.asynccontextmanager
    async def watching(self, image: str, pool: str = "rbd") -> AsyncIterator[None]:
        """An ``rbd watch`` client holds a watch on ``pool/image`` while the context is open
        (it may take a moment to register); afterwards it unwatches cleanly."""
        watcher = await asyncio.create_subprocess_exec(
            *self.rbd_argv("watch", "--pool", pool, image),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=self.root,
        )
        try:
            yield
        finally:
            assert watcher.stdin is not None
            watcher.stdin.write(b"\n")  # "press enter to exit": a clean unwatch
            await watcher.stdin.drain()
            await asyncio.wait_for(watcher.wait(), 10)

    @contextlib.contextmanager
    def osd_paused(self) -> Iterator[None]:
        """The OSD is frozen (SIGSTOP) while the context is open: monitors answer, reads and
        writes do not — what a dead OSD looks like to a client."""
        osd = self._procs[-1]
        osd.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            osd.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def running_cluster(root: Path) -> Iterator[CephCluster]:
    """Start a cluster in ``root``, yield it, stop it."""
    cluster = CephCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def main(argv: Sequence[str]) -> int:
    """``cluster.py DIR``: start a cluster in DIR (must be empty or missing) until ^C."""
    if len(argv) != 1:
        print("usage: cluster.py DIR", file=sys.stderr)
        return 2
    root = Path(argv[0]).resolve()
    started = time.monotonic()
    with running_cluster(root) as cluster:
        print(f"ceph up in {time.monotonic() - started:.1f}s: monitors={cluster.monitors}")
        print(f"  rbd -c {cluster.conf} ls {POOL}")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
