"""The ``rbd`` command runner: validation and redaction, then every command against the real
single-node Ceph (``ceph`` fixture), error classification (ENOENT, EEXIST, EBUSY, timeouts),
the key's temporary 0600 keyfile and its absence from every process's argv."""

from __future__ import annotations

import asyncio
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pyprovlib import testing
from pyprovlib.examples.rbd._rbd_cli import (
    CephCredentials,
    InvalidValueError,
    RbdBinaryNotFoundError,
    RbdBusyError,
    RbdExistsError,
    RbdNotFoundError,
    RbdRunner,
    RbdTimeoutError,
    _summarize,
    redact_text,
    validate_key,
    validate_monitors,
    validate_name,
)

KEY_SHAPED = "AQBd2jxnAAAAABAAtQTe0p6RRhW1ffhc9c3LkA=="


@pytest.mark.parametrize(
    "value",
    ["-x", "--help", "a/b", "img@snap", "", ".hidden", "a b", "a\nb", "x" * 256, "ä"],
)
def test_bad_names_are_rejected(value: str) -> None:
    with pytest.raises(InvalidValueError):
        validate_name(value, "pool")


@pytest.mark.parametrize("value", ["rbd", "kube_pool-1", "kubernetes-dynamic-pvc-1.2", "_x"])
def test_good_names(value: str) -> None:
    assert validate_name(value, "pool") == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.0.0.1:6789", ("10.0.0.1:6789",)),
        (" a.example:6789 , b.example ", ("a.example:6789", "b.example")),
        ("[fd00::1]:6789,v1:10.0.0.2:6789", ("[fd00::1]:6789", "v1:10.0.0.2:6789")),
    ],
)
def test_good_monitors(value: str, expected: tuple[str, ...]) -> None:
    assert validate_monitors(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        " , ",
        "-m",
        "--keyring=/etc/ceph/keyring",
        "10.0.0.1:6789 --id admin",
        "10.0.0.1:6789;rm",
        "host\n[global]",
        "10.0.0.1:99999",
        "fd00::1",
        ",".join(["h"] * 33),
    ],
)
def test_bad_monitors_are_rejected(value: str) -> None:
    with pytest.raises(InvalidValueError):
        validate_monitors(value)


@pytest.mark.parametrize("value", ["", "  ", "key\nkeyring = /x", "a b", "k" * 2000])
def test_bad_keys_are_rejected_without_echo(value: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        validate_key(value, "the key")
    if value.strip():
        assert value.strip() not in str(info.value)


def test_credentials_hide_the_key() -> None:
    creds = CephCredentials("admin", KEY_SHAPED)
    assert KEY_SHAPED not in repr(creds)
    with pytest.raises(InvalidValueError):
        CephCredentials("-admin", KEY_SHAPED)


def test_redaction() -> None:
    text = f"secret {KEY_SHAPED} and hunter2 and AQ{'x' * 38}=="
    out = redact_text(text, ["hunter2"])
    assert KEY_SHAPED not in out
    assert "hunter2" not in out
    assert "AQxxxx" not in out
    assert out.startswith("secret [REDACTED]")


def test_stderr_summary_keeps_the_reasons_and_drops_the_noise() -> None:
    stderr = (
        "rbd: image format 1 is deprecated"
        "2026-11-22T11:07:11.492+0000 7f71f9e8e380 -1 librbd: Format 1 image creation "
        "unsupported. \n"
        "2026-11-22T11:07:11.476+0000 7f71f82ab6c0 -1 --2-  >> v2:127.0.0.1:5/0 conn(0x5)"
        "._handle_peer_banner peer v2:127.0.0.1:5/0 is using msgr V1 protocol\n"
        "2026-11-22T11:07:11.476+0000 7f71f82ab6c0  0 monclient(hunting): authenticate\n"
        f"rbd: create error: (22) Invalid argument key={KEY_SHAPED}\n"
        "rbd: create error: (22) Invalid argument key=hunter2\n"
    )
    assert _summarize(stderr, ["hunter2"]) == (
        "rbd: image format 1 is deprecated; librbd: Format 1 image creation unsupported.; "
        "rbd: create error: (22) Invalid argument key=[REDACTED]"
    )
    assert _summarize("", []) == "(no output)"
    assert len(_summarize("rbd: " + "x" * 5000, [])) == 600


async def test_missing_binary_is_one_clear_error(tmp_path: Path) -> None:
    runner = RbdRunner(str(tmp_path / "no-rbd-here"))
    with pytest.raises(RbdBinaryNotFoundError, match="install ceph-common"):
        runner.resolve_binary()
    with pytest.raises(RbdBinaryNotFoundError):
        await runner.version()
    with pytest.raises(RbdBinaryNotFoundError):
        await runner.info(("127.0.0.1:1",), CephCredentials("admin", KEY_SHAPED), "rbd", "x")


@pytest.mark.ceph
async def test_version_runs_the_real_binary(ceph: Any) -> None:
    assert "ceph version" in await RbdRunner().version()


def _image() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


class Target(NamedTuple):
    """A runner against the test cluster as client.admin, and a fresh image name."""

    runner: RbdRunner
    mons: tuple[str, ...]
    admin: CephCredentials
    image: str


@pytest.fixture
def target(ceph: Any) -> Target:
    return Target(
        RbdRunner(timeout=10), (ceph.monitors,), CephCredentials("admin", ceph.admin_key), _image()
    )


@pytest.mark.ceph
async def test_lifecycle_against_real_ceph(ceph: Any, target: Target) -> None:
    runner, mons, admin, image = target
    assert await runner.info(mons, admin, "rbd", image) is None
    assert await runner.status(mons, admin, "rbd", image) is None

    await runner.create(
        mons, admin, "rbd", image, size_mib=5, image_format=2, features=["layering"]
    )
    info = await runner.info(mons, admin, "rbd", image)
    assert info is not None
    assert (info.name, info.size, info.size_mib, info.format) == (image, 5 * 2**20, 5, 2)
    assert info.features == ("layering",)
    # Independently, with the cluster's own config and keyring.
    assert ceph.rbd_json("info", "--pool", "rbd", "--image", image)["size"] == 5 * 2**20

    with pytest.raises(RbdExistsError) as exists:
        await runner.create(mons, admin, "rbd", image, size_mib=5, image_format=2, features=[])
    assert exists.value.returncode == 17

    await runner.resize(mons, admin, "rbd", image, 12)
    assert ceph.rbd_json("info", "--pool", "rbd", "--image", image)["size"] == 12 * 2**20
    assert await runner.status(mons, admin, "rbd", image) == []

    assert await runner.remove(mons, admin, "rbd", image) is True
    assert await runner.remove(mons, admin, "rbd", image) is False
    assert image not in ceph.rbd("ls", "--pool", "rbd").split()


@pytest.mark.ceph
async def test_no_features_and_missing_pool(ceph: Any, target: Target) -> None:
    runner, mons, admin, image = target
    await runner.create(mons, admin, "rbd", image, size_mib=1, image_format=2, features=[])
    info = await runner.info(mons, admin, "rbd", image)
    assert info is not None
    assert info.features == ()
    await runner.remove(mons, admin, "rbd", image)
    with pytest.raises(RbdNotFoundError, match="nopool"):
        await runner.create(mons, admin, "nopool", image, size_mib=1, image_format=2, features=[])


@pytest.mark.ceph
async def test_watched_image_is_busy(ceph: Any, target: Target) -> None:
    runner, mons, admin, image = target
    await runner.create(mons, admin, "rbd", image, size_mib=1, image_format=2, features=[])
    async with ceph.watching(image):
        watchers = await testing.eventually(
            lambda: runner.status(mons, admin, "rbd", image), message="watcher registered"
        )
        assert watchers[0].address.startswith("127.0.0.1:")
        with pytest.raises(RbdBusyError) as busy:
            await runner.remove(mons, admin, "rbd", image)
        assert busy.value.returncode == 16
        assert "still has watchers" in str(busy.value)
    assert await runner.status(mons, admin, "rbd", image) == []
    assert await runner.remove(mons, admin, "rbd", image) is True


def _rbd_processes() -> list[list[str]]:
    procs = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"rbd"):
            procs.append([a.decode(errors="replace") for a in argv if a])
    return procs


@pytest.mark.ceph
async def test_unreachable_monitor_times_out_and_key_stays_off_argv(ceph: Any) -> None:
    # Nothing listens on this port: librados keeps hunting until client_mount_timeout.
    runner = RbdRunner(timeout=3)
    admin = CephCredentials("admin", ceph.admin_key)
    dead = ("127.0.0.1:1",)
    task = asyncio.create_task(runner.info(dead, admin, "rbd", "kubernetes-dynamic-pvc-x"))
    seen: list[list[str]] = []
    keyfiles: list[tuple[str, int, int]] = []
    for _ in range(100):
        await asyncio.sleep(0.05)
        for argv in _rbd_processes():
            if "127.0.0.1:1" in argv:
                seen.append(argv)
                keyfile = argv[argv.index("--keyfile") + 1]
                with open(keyfile) as f:  # noqa: ASYNC230 - a tiny file while rbd runs
                    assert f.read() == ceph.admin_key
                keyfiles.append(
                    (
                        keyfile,
                        stat.S_IMODE(os.stat(keyfile).st_mode),
                        stat.S_IMODE(os.stat(os.path.dirname(keyfile)).st_mode),
                    )
                )
        if keyfiles:
            break
    started = time.monotonic()
    with pytest.raises(RbdTimeoutError) as info:
        await task
    assert time.monotonic() - started < 10
    assert seen, "the rbd process was never visible"
    argv = seen[0]
    assert ceph.admin_key not in " ".join(argv)
    for flag in ("--client_mount_timeout", "--rados_mon_op_timeout", "--rados_osd_op_timeout"):
        assert argv[argv.index(flag) + 1] == "3"
    assert argv[argv.index("-c") + 1].endswith("/ceph.conf")
    keyfile, mode, dir_mode = keyfiles[0]
    assert (mode, dir_mode) == (0o600, 0o700)
    assert not Path(keyfile).exists()  # noqa: ASYNC240 - a stat in a test
    assert not Path(keyfile).parent.exists()
    assert info.value.returncode == 110
    assert ceph.admin_key not in str(info.value)


@pytest.mark.ceph
async def test_unresponsive_osd_times_out(ceph: Any) -> None:
    runner = RbdRunner(timeout=2)
    mons = (ceph.monitors,)
    admin = CephCredentials("admin", ceph.admin_key)
    image = _image()
    await runner.create(mons, admin, "rbd", image, size_mib=1, image_format=2, features=[])
    with ceph.osd_paused():
        started = time.monotonic()
        with pytest.raises(RbdTimeoutError) as info:
            await runner.info(mons, admin, "rbd", image)
        elapsed = time.monotonic() - started
    assert elapsed < 10
    assert info.value.returncode == 110
    assert await runner.remove(mons, admin, "rbd", image) is True


@pytest.mark.ceph
async def test_command_deadline_kills_rbd(ceph: Any) -> None:
    runner = RbdRunner(timeout=30, command_timeout=1)
    admin = CephCredentials("admin", ceph.admin_key)
    started = time.monotonic()
    with pytest.raises(RbdTimeoutError, match="within 1s"):
        await runner.status(("127.0.0.1:1",), admin, "rbd", "img")
    assert time.monotonic() - started < 5
    assert not [a for a in _rbd_processes() if "127.0.0.1:1" in a]


@pytest.mark.ceph
async def test_wrong_key_fails_fast_without_echo(ceph: Any) -> None:
    runner = RbdRunner(timeout=2)
    wrong = CephCredentials("admin", KEY_SHAPED)
    started = time.monotonic()
    with pytest.raises(RbdTimeoutError) as info:
        await runner.info((ceph.monitors,), wrong, "rbd", "img")
    assert time.monotonic() - started < 10
    assert KEY_SHAPED not in str(info.value)
    assert "couldn't connect to the cluster" in str(info.value)


@pytest.mark.ceph
async def test_cancellation_reaps_the_process(ceph: Any) -> None:
    runner = RbdRunner(timeout=30)
    admin = CephCredentials("admin", ceph.admin_key)
    task = asyncio.create_task(runner.info(("127.0.0.1:1",), admin, "rbd", "img"))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if [a for a in _rbd_processes() if "127.0.0.1:1" in a]:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not [a for a in _rbd_processes() if "127.0.0.1:1" in a]
