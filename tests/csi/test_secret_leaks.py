"""Secrets never reach logs, events or exception messages, along every path that handles them."""

from __future__ import annotations

import io
import logging
import pathlib
from collections.abc import Iterator

import pytest
import structlog
from csi_driver import Fault
from csi_e2e import (
    all_events,
    create_claim,
    create_class,
    create_secret,
    csi_env,
    delete_claim,
    wait_bound,
    wait_event,
    wait_until,
    wait_volume_gone,
)
from grpclib.const import Status

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._redact import STRIPPED, sanitize, strip_secrets, strip_secrets_dict
from pyprovlib.kube._resources import EVENTS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

SECRET = "Zq9-TOPSECRET-value-7"


def test_every_secret_field_of_the_spec_is_stripped() -> None:
    from pyprovlib.csi._proto.secret_fields import SECRET_FIELDS

    classes = {
        name: getattr(v1, name.removeprefix("csi.v1.").replace(".", "")) for name in SECRET_FIELDS
    }
    assert len(classes) >= 19
    for cls in classes.values():
        message = cls(secrets={"key": SECRET})
        assert SECRET not in sanitize(message)
        assert strip_secrets(message)["secrets"] == STRIPPED


def test_nested_and_dict_forms() -> None:
    request = v1.CreateVolumeRequest(
        name="pvc-1",
        secrets={"a": SECRET},
        parameters={"p": "visible"},
        volume_capabilities=[v1.VolumeCapability(block=v1.VolumeCapabilityBlockVolume())],
    )
    stripped = strip_secrets(request)
    assert stripped["parameters"] == {"p": "visible"}
    assert stripped["secrets"] == STRIPPED
    assert stripped["volume_capabilities"] == [{"block": {}}]
    from_dict = strip_secrets_dict(v1.CreateVolumeRequest, request.to_dict())
    assert from_dict == stripped
    # Messages without secret fields are rendered whole.
    response = v1.CreateVolumeResponse(volume=v1.Volume(volume_id="v", capacity_bytes=5))
    assert strip_secrets(response) == {"volume": {"capacity_bytes": 5, "volume_id": "v"}}


@pytest.fixture
def rendered_logs() -> Iterator[io.StringIO]:
    """Every pyprovlib line at debug level, rendered as JSON with tracebacks, into a buffer
    (without the runtime's redacting processor: the CSI code must not need it). pyprovlib's
    records go through stdlib logging, so the buffer is a stdlib handler's stream."""
    saved = structlog.get_config()
    buffer = io.StringIO()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(buffer)
    handler.setLevel(logging.DEBUG)
    logger = logging.getLogger("pyprovlib")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        structlog.configure(**saved)


async def test_no_secret_in_logs_events_or_errors(
    kube_cluster: TestCluster,
    sock_dir: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    rendered_logs: io.StringIO,
) -> None:
    ns = kube_cluster.namespace
    async with csi_env(kube_cluster, sock_dir) as env:
        await create_secret(env, "creds", {"password": SECRET})
        class_name = await create_class(
            env,
            parameters={
                "csi.storage.k8s.io/provisioner-secret-name": "creds",
                "csi.storage.k8s.io/provisioner-secret-namespace": ns,
            },
        )
        # A driver that quotes the secret in its error, then one that crashes with it in
        # the exception text, then a success and a deletion.
        env.driver.fail(
            "CreateVolume",
            Fault(status=Status.PERMISSION_DENIED, message=f"password {SECRET} rejected"),
        )
        env.driver.fail("CreateVolume", Fault(exception=RuntimeError(f"boom {SECRET}")))
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        await wait_event(env, name, "ProvisioningFailed", "rejected")
        await wait_event(env, name, "ProvisioningFailed", "Internal")
        bound = await wait_bound(env, name)
        env.driver.fail(
            "DeleteVolume", Fault(status=Status.INTERNAL, message=f"cannot use {SECRET}")
        )
        await delete_claim(env, name)
        await wait_volume_gone(env, bound["spec"]["volumeName"])
        await wait_until(
            env, lambda: len(env.driver.requests("DeleteVolume")) == 2, "delete retried"
        )
        request = env.driver.requests("CreateVolume")[0]
        assert isinstance(request, v1.CreateVolumeRequest)
        assert request.secrets == {"password": SECRET}  # the driver did get it
        events = await all_events(env)
        events += (await ResourceClient(kube_cluster.api_client, EVENTS).list("default"))["items"]
    messages = " ".join(e.get("message", "") for e in events)
    assert "rejected" in messages
    assert SECRET not in messages
    assert STRIPPED in messages
    logs = rendered_logs.getvalue()
    # The paths that handle the secret were all logged: the request, the driver's crash, the
    # failed calls.
    assert "csi handler failed" in logs
    assert "Traceback" in logs
    assert '\\"secrets\\":\\"***stripped***\\"' in logs
    assert "PermissionDenied" in logs
    assert SECRET not in logs
    out, err = capsys.readouterr()
    assert SECRET not in out
    assert SECRET not in err
