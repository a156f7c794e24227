"""The CSI conformance suite (kubernetes-csi/csi-test's csi-sanity) against the example driver
``pyprovlib.examples.csi_hostpath``, once with logging left unconfigured (a library user's
default) and once at debug: no test may fail in either.

csi-sanity is found in the assets directory (``$PYPROVLIB_KUBE_ASSETS`` or
``$KUBEBUILDER_ASSETS``, docs/testing.md "The assets directory"), else unpacked from the
compressed copy CI keeps beside the checkout; without either the test is skipped, saying so.
Regression (issue 21): unconfigured, every answer holding a Timestamp (CreateSnapshot,
ListSnapshots) was lost to a failing debug log line and csi-sanity saw 10 failures.
"""

from __future__ import annotations

import lzma
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED_XZ = REPO.parent / "shared" / "kube" / "csi-sanity.xz"

# The driver with nothing configured: the library's own defaults decide what is written.
UNCONFIGURED = """
import asyncio, sys
from pyprovlib.examples.csi_hostpath._cli import serve
from pyprovlib.examples.csi_hostpath._driver import DriverOptions
options = DriverOptions(nodeid="sanity-node", statedir=sys.argv[2], enable_attach=True)
asyncio.run(serve(options, sys.argv[1]))
"""


@pytest.fixture(scope="module")
def csi_sanity(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    for variable in ("PYPROVLIB_KUBE_ASSETS", "KUBEBUILDER_ASSETS"):
        directory = os.environ.get(variable)
        if directory and os.access(os.path.join(directory, "csi-sanity"), os.X_OK):
            return pathlib.Path(directory) / "csi-sanity"
    if not SHARED_XZ.is_file():
        pytest.skip(
            "no csi-sanity: put it (kubernetes-csi/csi-test) in the assets directory "
            "PYPROVLIB_KUBE_ASSETS names (docs/testing.md, 'The assets directory')"
        )
    binary = tmp_path_factory.mktemp("csi-sanity") / "csi-sanity"
    with lzma.open(SHARED_XZ) as packed, open(binary, "wb") as unpacked:
        shutil.copyfileobj(packed, unpacked)
    binary.chmod(0o755)
    return binary


def start_driver(mode: str, directory: pathlib.Path) -> tuple[subprocess.Popen[bytes], str]:
    socket = directory / "csi.sock"
    endpoint = f"unix://{socket}"
    statedir = str(directory / "state")
    if mode == "unconfigured":
        argv = [sys.executable, "-c", UNCONFIGURED, endpoint, statedir]
    else:
        argv = [
            sys.executable,
            "-m",
            "pyprovlib.examples.csi_hostpath",
            f"--endpoint={endpoint}",
            "--nodeid=sanity-node",
            f"--statedir={statedir}",
            "--enable-attach=true",
            "--log-level=debug",
            "--log-format=json",
        ]
    driver = subprocess.Popen(
        argv,
        stdout=open(directory / "driver.out", "wb"),  # noqa: SIM115 - closed with the process
        stderr=open(directory / "driver.err", "wb"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 30
    while not socket.exists():
        if driver.poll() is not None or time.monotonic() > deadline:
            driver.kill()
            err = (directory / "driver.err").read_text(errors="replace")
            pytest.fail(f"the driver did not start ({mode}): {err[-2000:]}")
        time.sleep(0.05)
    return driver, str(socket)


SUMMARY = re.compile(
    r"(\d+) Passed \| (\d+) Failed \| (?:(\d+) Pending \| )?(\d+) Skipped", re.MULTILINE
)


@pytest.mark.parametrize("mode", ["unconfigured", "debug"])
def test_csi_sanity_passes(
    mode: str, csi_sanity: pathlib.Path, tmp_path: pathlib.Path, record_property: object
) -> None:
    # A short directory: unix socket paths are limited to 107 bytes.
    directory = pathlib.Path(tmp_path)
    driver, socket = start_driver(mode, directory)
    try:
        result = subprocess.run(
            [
                str(csi_sanity),
                f"--csi.endpoint={socket}",
                f"--csi.mountdir={directory / 'mnt'}",
                f"--csi.stagingdir={directory / 'stg'}",
                "--ginkgo.no-color",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        driver.terminate()
        try:
            driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
    output = result.stdout + result.stderr
    found = SUMMARY.findall(output)
    assert found, f"no csi-sanity summary in its output:\n{output[-3000:]}"
    passed, failed, _pending, skipped = (int(x or 0) for x in found[-1])
    print(f"csi-sanity ({mode}): {passed} passed, {failed} failed, {skipped} skipped")
    if callable(record_property):
        record_property("csi_sanity", {"passed": passed, "failed": failed, "skipped": skipped})
    failures = re.findall(r"^\s*\[FAIL\] (.*)$", output, re.MULTILINE)
    assert failed == 0, f"{failed} failed: {failures}"
    assert result.returncode == 0, output[-3000:]
    assert passed >= 70, f"csi-sanity ran only {passed} tests"
    stdout = (directory / "driver.out").read_text(errors="replace")
    stderr = (directory / "driver.err").read_text(errors="replace")
    assert "Logging error" not in stderr, stderr[-3000:]
    if mode == "unconfigured":
        # A library writes nothing to stdout, and nothing at debug, until configured.
        assert stdout == "", stdout[:2000]
        assert '"csi call"' not in stderr
        assert "csi call done" not in stderr
    else:
        assert "csi call done" in stderr  # debug is on: every call is logged
        assert "creation_time" in stderr  # snapshots' Timestamps are rendered
