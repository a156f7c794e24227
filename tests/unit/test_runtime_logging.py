"""Logging set up by pyprovlib.runtime: JSON lines, console output, stdlib routing, redaction."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from datetime import datetime, timedelta

import pytest
import structlog
from kubernetes_asyncio.client import V1ObjectMeta, V1Secret

from pyprovlib.runtime import bind, bound, configure_logging, get_logger
from pyprovlib.runtime._logging import REDACTED, is_secret_key, redact_value, scrub_text, unbind

# Each test leaves logging as it found it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("restore_logging")


PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAwhF4ThisIsNotARealKeyButLooksLikeOne0123456789\n"
    "-----END RSA PRIVATE KEY-----"
)
JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXZhbHVl"


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def configured(level: str = "info") -> io.StringIO:
    stream = io.StringIO()
    configure_logging("json", level, stream=stream)
    return stream


# --- JSON structure ------------------------------------------------------------------------


def test_json_lines_have_timestamp_level_logger_event_and_context() -> None:
    stream = configured()
    log = get_logger("pyprovlib.test", driver="hostpath.example.com")
    log.info("provisioned", pv="pvc-1", size=1024)
    (line,) = json_lines(stream)
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]
    assert line["level"] == "info"
    assert line["logger"] == "pyprovlib.test"
    assert line["event"] == "provisioned"
    assert line["pv"] == "pvc-1"
    assert line["size"] == 1024
    assert line["driver"] == "hostpath.example.com"
    stamp = datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)


def test_bound_context_is_scoped_and_per_task() -> None:
    stream = configured()
    log = get_logger("t")

    async def worker(claim: str, release: asyncio.Event) -> None:
        with bound(claim=claim):
            await release.wait()
            log.info("working")

    async def main() -> None:
        release = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(worker("ns/a", release))
            tg.create_task(worker("ns/b", release))
            await asyncio.sleep(0)
            release.set()

    asyncio.run(main())
    log.info("after")
    lines = json_lines(stream)
    assert sorted(str(line["claim"]) for line in lines[:2]) == ["ns/a", "ns/b"]
    assert "claim" not in lines[2]


def test_bind_and_unbind() -> None:
    stream = configured()
    bind(volume="pvc-9")
    get_logger("t").info("one")
    unbind("volume")
    get_logger("t").info("two")
    first, second = json_lines(stream)
    assert first["volume"] == "pvc-9"
    assert "volume" not in second


def test_stdlib_loggers_share_the_pipeline() -> None:
    stream = configured()
    with bound(attachment="csi-123"):
        logging.getLogger("kubernetes_asyncio.rest").warning("retrying %s after %d", "GET", 3)
        logging.getLogger("grpclib.client").error("stream reset", extra={"peer": "unix:///csi"})
    first, second = json_lines(stream)
    assert first == {
        "timestamp": first["timestamp"],
        "level": "warning",
        "logger": "kubernetes_asyncio.rest",
        "event": "retrying GET after 3",
        "attachment": "csi-123",
    }
    assert second["logger"] == "grpclib.client"
    assert second["peer"] == "unix:///csi"


def test_level_filters_structlog_and_stdlib_and_can_be_changed() -> None:
    stream = configured("warning")
    get_logger("t").info("hidden")
    logging.getLogger("aiohttp.client").info("hidden too")
    get_logger("t").warning("shown")
    assert [line["event"] for line in json_lines(stream)] == ["shown"]

    stream2 = configured("debug")
    get_logger("t").debug("now shown")
    assert [line["event"] for line in json_lines(stream2)] == ["now shown"]
    assert [line["event"] for line in json_lines(stream)] == ["shown"]  # old stream let go


def test_reconfiguring_does_not_duplicate_output() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    configure_logging("json", "info", stream=stream)
    get_logger("t").info("once")
    assert len(json_lines(stream)) == 1


def test_logger_made_before_configuration_follows_it() -> None:
    early = structlog.get_logger("early")
    stream = configured()
    early.info("late call")
    assert json_lines(stream)[0]["logger"] == "early"


def test_exceptions_are_rendered_in_json() -> None:
    stream = configured()
    try:
        raise RuntimeError("backend unreachable")
    except RuntimeError:
        get_logger("t").exception("provision failed")
    (line,) = json_lines(stream)
    assert line["level"] == "error"
    assert "RuntimeError: backend unreachable" in str(line["exception"])


def test_console_format() -> None:
    stream = io.StringIO()
    configure_logging("console", "info", stream=stream)
    get_logger("t").info("hello console", claim="ns/c", password="hunter2")
    out = stream.getvalue()
    assert "hello console" in out
    assert "claim=ns/c" in out
    assert "hunter2" not in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_auto_is_json_when_not_a_tty() -> None:
    stream = io.StringIO()
    configure_logging("auto", "info", stream=stream)
    get_logger("t").info("auto")
    assert json_lines(stream)[0]["event"] == "auto"


def test_auto_is_console_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    configure_logging("auto", "info", stream=stream)
    get_logger("t").info("on a terminal")
    assert "on a terminal" in stream.getvalue()
    with pytest.raises(json.JSONDecodeError):
        json.loads(stream.getvalue().splitlines()[0])


@pytest.mark.parametrize(("fmt", "level"), [("xml", "info"), ("json", "trace")])
def test_bad_configuration_is_rejected(fmt: str, level: str) -> None:
    with pytest.raises(ValueError, match="must be"):
        configure_logging(fmt, level, stream=io.StringIO())


# --- redaction -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "Password",
        "db_password",
        "passwd",
        "secret",
        "secrets",
        "clientSecret",
        "token",
        "bearerToken",
        "apiKey",
        "APIKey",
        "api_key",
        "client-key-data",
        "tls.key",
        "ssh-privatekey",
        "private_key",
        "credentials",
        "Authorization",
        "csi.storage.k8s.io/secrets",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "monkey",
        "keyboard",
        "key",
        "claim",
        "pv",
        "secret_name",
        "secretName",
        "csi.storage.k8s.io/provisioner-secret-name",
        "csi.storage.k8s.io/provisioner-secret-namespace",
        "token_file",
        "tokenizer",
        "passport",
        "event",
    ],
)
def test_non_secret_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_redacts_nested_values_and_keeps_shape() -> None:
    value = {
        "parameters": {"pool": "fast", "password": "p4ss"},
        "secrets": {"username": "admin", "key": "k3y"},
        "items": [{"token": "t0k"}, {"name": "ok"}],
        "credentials": ["a", "b"],
        "secret_name": "my-secret",
        "none_token": None,
    }
    out = redact_value(value)
    assert out == {
        "parameters": {"pool": "fast", "password": REDACTED},
        "secrets": {"username": REDACTED, "key": REDACTED},
        "items": [{"token": REDACTED}, {"name": "ok"}],
        "credentials": [REDACTED, REDACTED],
        "secret_name": "my-secret",
        "none_token": None,
    }


def test_secret_objects_have_their_data_masked() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "ceph-admin", "namespace": "kube-system"},
        "data": {"userID": "YWRtaW4=", "userKey": "QVFE"},
        "stringData": {"anything": "plain"},
    }
    out = redact_value(secret)
    assert out["metadata"] == {"name": "ceph-admin", "namespace": "kube-system"}
    assert out["data"] == {"userID": REDACTED, "userKey": REDACTED}
    assert out["stringData"] == {"anything": REDACTED}
    assert "YWRtaW4=" not in json.dumps(out)


def test_kubernetes_models_are_converted_and_masked() -> None:
    model = V1Secret(kind="Secret", metadata=V1ObjectMeta(name="s"), data={"username": "dXNlcg=="})
    out = redact_value(model)
    assert out["data"] == {"username": REDACTED}
    assert out["metadata"]["name"] == "s"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop"),
        ("header bearer Zm9vYmFyYmF6cXV4", "Zm9vYmFyYmF6cXV4"),
        (f"loaded key {PEM} from file", "ThisIsNotARealKey"),
        (f"token is {JWT}", "c2lnbmF0dXJlLXZhbHVl"),
        ("connect user=admin password=hunter2 host=db", "hunter2"),
        ('{"apiKey": "s3cr3t-value", "pool": "a"}', "s3cr3t-value"),
        ("{'client_secret': 'abc123'}", "abc123"),
        ("--token=xyz987 --verbose", "xyz987"),
        ('{"kind":"Secret","data":{"user":"dXNlcm5hbWU="}}', "dXNlcm5hbWU="),
    ],
)
def test_scrub_text(text: str, secret: str) -> None:
    out = scrub_text(text)
    assert secret not in out
    assert REDACTED in out


@pytest.mark.parametrize(
    "text",
    [
        "provisioned volume pvc-1 for claim ns/c",
        "monkey=3 keyboard=qwerty",
        "secret_name=my-secret",
        "basic setup complete",
        "queue key=default/claim-1",
    ],
)
def test_scrub_text_leaves_ordinary_text(text: str) -> None:
    assert scrub_text(text) == text


def test_secrets_never_reach_json_output() -> None:
    stream = configured("debug")
    log = get_logger("pyprovlib.csi")
    log.info(
        "CreateVolume",
        parameters={"pool": "fast"},
        secrets={"adminKey": "AQD-key-material"},
        password="hunter2",
        auth_header="Bearer tok-abcdefghijk",
    )
    log.debug(f"loaded {PEM}")
    try:
        raise ValueError("login failed: password=hunter2")
    except ValueError:
        log.exception("backend error")
    out = stream.getvalue()
    for leaked in ("AQD-key-material", "hunter2", "tok-abcdefghijk", "ThisIsNotARealKey"):
        assert leaked not in out
    first = json_lines(stream)[0]
    assert first["parameters"] == {"pool": "fast"}
    assert first["secrets"] == {"adminKey": REDACTED}


def test_secrets_through_a_stdlib_logger_are_masked() -> None:
    stream = configured("debug")
    std = logging.getLogger("kubernetes_asyncio.rest")
    std.debug("response body: %s", '{"kind":"Secret","data":{"password":"aHVudGVyMg=="}}')
    std.info("request headers %s", {"Authorization": "Bearer sa-token-0123456789"})
    std.warning("calling backend", extra={"token": "xyz-extra-token", "pool": "p1"})
    out = stream.getvalue()
    for leaked in ("aHVudGVyMg==", "sa-token-0123456789", "xyz-extra-token"):
        assert leaked not in out
    third = json_lines(stream)[2]
    assert third["token"] == REDACTED
    assert third["pool"] == "p1"


def test_secret_in_bound_context_is_masked() -> None:
    stream = configured()
    with bound(token="ctx-secret-value"):
        logging.getLogger("asyncio").error("loop error")
        get_logger("t").info("structlog")
    assert "ctx-secret-value" not in stream.getvalue()
    assert all(line["token"] == REDACTED for line in json_lines(stream))


def test_console_exceptions_are_scrubbed() -> None:
    stream = io.StringIO()
    configure_logging("console", "info", stream=stream)
    try:
        raise RuntimeError("auth failed with Bearer abcdefghijklmnopq")
    except RuntimeError:
        get_logger("t").exception("failed")
    out = stream.getvalue()
    assert "RuntimeError" in out
    assert "abcdefghijklmnopq" not in out
