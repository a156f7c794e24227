"""pyprovlib logs as a library does (issue 21): nothing is written until the application
configures logging, records go through stdlib ``logging``, and ``configure_logging`` sets
pyprovlib's level apart from the noisy third-party loggers'."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import structlog

from pyprovlib._logging import get_logger
from pyprovlib.runtime._logging import NOISY_LOGGERS, configure_logging

# Imports pyprovlib and uses it — a CSI server and client making calls (debug lines on both
# sides, snapshots with Timestamps), library loggers at every level — configuring nothing.
USER_PROGRAM = textwrap.dedent(
    """
    import asyncio, datetime, os, sys, tempfile
    import pyprovlib
    from pyprovlib._logging import get_logger
    from pyprovlib.csi._proto.csi import v1
    from pyprovlib.csi._connection import CSIConnection
    from pyprovlib.csi._server import ControllerService, CSIServer, IdentityService

    class Controller(ControllerService):
        def __init__(self):
            super().__init__([v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_SNAPSHOT])

        async def create_snapshot(self, message):
            return v1.CreateSnapshotResponse(snapshot=v1.Snapshot(
                snapshot_id="s", source_volume_id=message.source_volume_id, ready_to_use=True,
                creation_time=datetime.datetime.now(datetime.UTC)))

        async def delete_snapshot(self, message):
            return v1.DeleteSnapshotResponse()

    async def main():
        with tempfile.TemporaryDirectory() as directory:
            endpoint = f"unix://{directory}/csi.sock"
            identity = IdentityService("quiet.test", "1", services=[
                v1.PluginCapabilityServiceType.CONTROLLER_SERVICE])
            async with CSIServer([identity, Controller()], endpoint):
                connection = await CSIConnection.open(endpoint)
                try:
                    request = v1.CreateSnapshotRequest(name="n", source_volume_id="v")
                    answer = await connection.call("/csi.v1.Controller/CreateSnapshot", request)
                    assert answer.snapshot.creation_time is not None
                finally:
                    connection.close()
        log = get_logger("pyprovlib.user_visible")
        log.debug("debug line", a=1)
        log.info("info line")
        log.warning("warning line", password="hunter2")

    asyncio.run(main())
    print("done", file=sys.stderr)
    """
)


def test_an_unconfigured_process_writes_nothing_to_stdout_and_nothing_at_debug() -> None:
    result = subprocess.run(
        [sys.executable, "-c", USER_PROGRAM],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    # Python's default: warnings and errors to stderr (lastResort), nothing below.
    assert "warning line" in result.stderr
    assert "hunter2" not in result.stderr
    for quiet in ("debug line", "info line", "csi call", "csi server listening"):
        assert quiet not in result.stderr, result.stderr


@pytest.fixture
def restored_logging() -> Iterator[None]:
    saved = structlog.get_config()
    levels = {name: logging.getLogger(name).level for name in ("", "pyprovlib", *NOISY_LOGGERS)}
    try:
        yield
    finally:
        configure_logging("json", "warning", stream=io.StringIO())
        structlog.configure(**saved)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_records_reach_the_applications_stdlib_handlers(restored_logging: None) -> None:
    # The application decides with stdlib logging alone: a handler on "pyprovlib" sees the
    # records, at the level the application sets, with the event's context in the message.
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("pyprovlib")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    structlog.reset_defaults()
    try:
        log = get_logger("pyprovlib.app_test")
        log.debug("hidden")
        log.info("shown", claim="ns/name", token="abc")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    text = stream.getvalue()
    assert "hidden" not in text
    assert "event='shown'" in text
    assert "claim='ns/name'" in text
    assert "abc" not in text  # secrets masked before stdlib sees the record
    assert "ValueError: boom" in text  # the traceback passed on as exc_info


def test_configure_logging_sets_noisy_loggers_apart(restored_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("json", "debug", stream=stream)
    assert logging.getLogger("pyprovlib").getEffectiveLevel() == logging.DEBUG
    for name in NOISY_LOGGERS:
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING
    logging.getLogger("hpack.hpack").debug("Decoded %s", "header")
    get_logger("pyprovlib.kube.test").debug("ours", key="ns/name")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["ours"]
    configure_logging("json", "debug", stream=stream, third_party_level="debug")
    assert logging.getLogger("h2").getEffectiveLevel() == logging.DEBUG
    with pytest.raises(ValueError, match="third-party log level"):
        configure_logging("json", "info", third_party_level="loud")


def test_every_module_logs_through_the_library_loggers() -> None:
    # structlog.get_logger() follows structlog's global configuration, whose default prints
    # every level to stdout: a library module must use pyprovlib._logging.get_logger.
    import pathlib

    source = pathlib.Path(__file__).resolve().parents[2] / "src" / "pyprovlib"
    offenders = [
        str(path.relative_to(source))
        for path in sorted(source.rglob("*.py"))
        if "structlog.get_logger(" in path.read_text(encoding="utf-8")
        or "structlog.stdlib.get_logger(" in path.read_text(encoding="utf-8")
    ]
    assert offenders == [], f"use pyprovlib._logging.get_logger in {offenders}"
