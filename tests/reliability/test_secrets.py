"""Secrets never leak (issue 11, "Secrets").

A run with secrets — a controller-publish Secret an attacher backend echoes back in its
errors (attach and detach, typed and untyped, also as the cause of another error), a provisioner
failing with a message that quotes a Secret's value it was given through a class's secret
reference, and a kubeconfig bearer token — while every output is captured: the process's
stdout/stderr (all logs at debug level), every object the API server stores except the Secrets
themselves (Events, VolumeAttachment statuses, PVs, claims), the Prometheus metrics text and the
text of every exception raised. None of them may contain a secret value.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import structlog
from claim_support import attachment_body
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from rel_support import create_namespace, csi_volume_body, unique, wait_until

from pyprovlib._attacher import Attacher, AttachError, AttachNode, AttachVolume
from pyprovlib.controller._attach import AttachController
from pyprovlib.controller._attach.options import AttachControllerOptions
from pyprovlib.kube._resources import (
    CSINODES,
    PERSISTENT_VOLUMES,
    RESOURCES,
    SECRETS,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.runtime._logging import configure_logging
from pyprovlib.testing._server import ApiServer

PASSWORD = "pw-Xq7vK2mZ9tR4"
TOKEN = "tok-Jh3nB8pL5wQ1sD6f"
DRIVER = "secrets.attach.test"


class EchoingAttacher(Attacher):
    """A backend that quotes its credentials in every error, as careless ones do."""

    def __init__(self) -> None:
        self.failures = 3
        self.raised: list[str] = []

    def _fail(self, volume: AttachVolume, op: str) -> None:
        secret = volume.secrets.get("password", "")
        assert secret == PASSWORD  # the secret did reach the backend
        self.failures -= 1
        kinds: list[BaseException] = [
            AttachError(f"{op}: login as admin/{secret} refused", code=16),
            RuntimeError(f"{op}: connection string user=admin password={secret}"),
        ]
        err = kinds[self.failures % 2]
        if self.failures == 0:
            try:
                raise ValueError(f"inner {op} failure with {secret}")
            except ValueError as inner:
                err = RuntimeError(f"{op} failed (cause: {inner})")
        self.raised.append(str(err))
        raise err

    async def attach(
        self, volume: AttachVolume, node: AttachNode, readonly: bool, context: Mapping[str, str]
    ) -> Mapping[str, str]:
        if self.failures > 0:
            self._fail(volume, "attach")
        return {"device": "/dev/x"}

    async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
        if self.failures > -3:
            self.failures -= 1
            message = f"detach: password {volume.secrets.get('password')} expired"
            self.raised.append(message)
            raise AttachError(message, code=16)


def leaks(text: str, secrets: Sequence[str]) -> list[str]:
    found = []
    for secret in secrets:
        for form in (secret, base64.b64encode(secret.encode()).decode()):
            if form in text:
                found.append(form)
    return found


def server_dump(server: ApiServer) -> str:
    """Every stored object except Secrets, as JSON."""
    parts: list[str] = []
    for resource in RESOURCES:
        if resource is SECRETS or resource.group == "events.k8s.io":
            continue
        parts.extend(json.dumps(o) for o in server.storage.list(resource))
    return "\n".join(parts)


@pytest.fixture
def debug_logs_to_stderr() -> Iterator[None]:
    """pyprovlib's logs at debug on stderr, as a ``python -m`` entry point writes them (a
    library process that configures nothing gets none)."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("json", "debug", stream=sys.stderr)
    try:
        yield
    finally:
        configure_logging("json", "warning", stream=io.StringIO())
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
        logging.getLogger("pyprovlib").setLevel(logging.NOTSET)
        structlog.configure(**saved)


async def test_attacher_run_with_secrets_leaks_nothing(
    capfd: pytest.CaptureFixture[str], debug_logs_to_stderr: None
) -> None:
    registry = CollectorRegistry()
    async with ApiServer() as server, server.api_client() as client:
        ns = unique("secrets")
        await create_namespace(client, ns)
        await ResourceClient(client, SECRETS).create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "creds", "namespace": ns},
                "data": {"password": base64.b64encode(PASSWORD.encode()).decode()},
            },
            ns,
        )
        await ResourceClient(client, CSINODES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": "node-1"},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": "node-1-id"}]},
            }
        )
        await ResourceClient(client, PERSISTENT_VOLUMES).create(
            csi_volume_body(
                "pv-secret",
                {
                    "driver": DRIVER,
                    "volumeHandle": "vol-1",
                    "controllerPublishSecretRef": {"name": "creds", "namespace": ns},
                },
            )
        )
        backend = EchoingAttacher()
        options = AttachControllerOptions(
            retry_interval_start=0.01,
            retry_interval_max=0.05,
            workers=2,
            resync_period=0.0,
            timeout=5.0,
            registry=registry,
            leader_election=False,
        )
        controller = AttachController(client, DRIVER, backend, options)
        vas = ResourceClient(client, VOLUME_ATTACHMENTS)
        task = asyncio.create_task(controller.run())
        try:
            await vas.create(attachment_body("va-secret", DRIVER, "node-1", "pv-secret"))

            def attached() -> bool:
                va = server.storage.get(VOLUME_ATTACHMENTS, None, "va-secret")
                return bool(va and (va.get("status") or {}).get("attached"))

            await wait_until(attached, timeout=30, message="attached after the failures")
            await vas.delete("va-secret")
            await wait_until(
                lambda: server.storage.get(VOLUME_ATTACHMENTS, None, "va-secret") is None,
                timeout=30,
                message="detached after the failures",
            )
        finally:
            controller.stop()
            async with asyncio.timeout(10):
                await task
        assert len(backend.raised) >= 5, backend.raised
        assert any(PASSWORD in r for r in backend.raised)  # the backend did leak into errors
        outputs = {
            "stored objects": server_dump(server),
            "metrics": generate_latest(registry).decode() + generate_latest(REGISTRY).decode(),
        }
    captured = capfd.readouterr()
    outputs["stdout/stderr (logs)"] = captured.out + captured.err
    assert "attach" in outputs["stdout/stderr (logs)"]  # logs were captured at all
    for where, text in outputs.items():
        assert not leaks(text, [PASSWORD]), f"a secret leaked into {where}"


async def test_kubeconfig_token_never_reaches_logs(tmp_path: Path) -> None:
    """A controller process (the NFS example) with a bearer token in its kubeconfig, at debug
    level, through API failures (401, 403, 500) and a graceful stop: its output never holds the
    token."""
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        doc = json.loads(kubeconfig.read_text())
        doc["users"][0]["user"] = {"token": TOKEN}
        kubeconfig.write_text(json.dumps(doc))
        root = tmp_path / "export"
        root.mkdir()
        for status in (401, 403, 500):
            server.faults.fail(status, count=5)
        log = tmp_path / "out.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pyprovlib.examples.nfs",
                f"--kubeconfig={kubeconfig}",
                "--nfs-server=nfs.test",
                "--nfs-path=/export",
                f"--nfs-mount-path={root}",
                "--leader-election=false",
                "--log-level=debug",
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=dict(os.environ),
            )
            try:

                def synced() -> bool:
                    # Each kind of failure met, and every request the process made so far
                    # answered with a failure it has logged: its informers are backing off,
                    # nothing of it is in flight or left to log.
                    text = log.read_text(errors="replace")
                    logged = sum(text.count(f'"status": {code}') for code in (401, 403, 500))
                    return (
                        all(f'"status": {code}' in text for code in (401, 403, 500))
                        and logged == server.requests.count()
                    )

                await wait_until(
                    synced, timeout=30, message="the process met the API failures and went on"
                )
            finally:
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):
                    await proc.wait()
        text = log.read_text(errors="replace")
        assert "401" in text, "the injected 401s were not met: the scenario tested nothing"
        assert not leaks(text, [TOKEN]), "the kubeconfig token leaked into the logs"
        assert not leaks(server_dump(server), [TOKEN])
