"""Fixtures for the example backends' tests: ``short_dir`` for a unix socket, ``usage_error`` for
an entry point's usage errors, and ``ceph``, one
real single-node Ceph cluster per test session (see ``tests/ceph/cluster.py``), started on first
use.

Tests that need it skip with the reason when the ceph packages are not installed — unless
``PYPROVLIB_REQUIRE_CEPH=1`` is set (as in CI), in which case they fail.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from example_support import UsageError, example_env
from module_support import load_file

_CLUSTER_PY = Path(__file__).resolve().parents[1] / "ceph" / "cluster.py"


ceph_cluster = load_file("pyprovlib_tests_ceph_cluster", _CLUSTER_PY, register=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temporary directory with a path short enough for a unix socket (107 bytes), which
    pytest's ``tmp_path`` may not be."""
    with tempfile.TemporaryDirectory(prefix="pex") as directory:
        yield Path(directory)


@pytest.fixture
def usage_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> UsageError:
    """Runs an entry point's ``main(argv)`` in this process, in the environment a child under
    test gets (:func:`example_env`: none of pyprovlib's or the backends' variables), expecting a
    usage error (exit status 2); returns what it wrote to stderr."""
    keep = example_env()
    for name in list(os.environ):
        if name not in keep:
            monkeypatch.delenv(name)

    def run(main: Callable[[list[str]], object], argv: list[str]) -> str:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        return capsys.readouterr().err

    return run


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ceph: needs the real single-node Ceph cluster of tests/ceph (ceph packages)"
    )


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A running ``CephCluster`` (one mon, one memstore OSD, pool ``rbd``) for the session."""
    missing = ceph_cluster.missing_binaries()
    if missing:
        reason = (
            f"ceph packages not installed (missing {', '.join(missing)}); run "
            "tests/ceph/install-ceph.sh (as root) to install ceph-mon, ceph-osd and ceph-common"
        )
        if os.environ.get("PYPROVLIB_REQUIRE_CEPH") == "1":
            pytest.fail(reason + " — PYPROVLIB_REQUIRE_CEPH=1 demands them")
        pytest.skip(reason)
    cluster = ceph_cluster.CephCluster(tmp_path_factory.mktemp("ceph"))
    started = time.monotonic()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    print(f"\nceph cluster up in {time.monotonic() - started:.1f}s at {cluster.monitors}")
    try:
        yield cluster
    finally:
        cluster.stop()
