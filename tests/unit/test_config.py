"""Client configuration: where the config comes from, the user agent, and the shared
client-side QPS/burst limiter, against the in-memory API server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from kubernetes_asyncio.client import CoordinationV1Api

from pyprovlib._version import __version__
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._config import (
    DEFAULT_USER_AGENT,
    ClientSettings,
    ConfigError,
    LimitedApiClient,
    load_configuration,
    new_client,
    request_json,
    shared_limiter,
)
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.testing import eventually
from pyprovlib.testing._server import ApiServer

NO_SA = "/nonexistent/serviceaccount"


def _kubeconfig(path: Path, contexts: dict[str, str], current: str, token: str = "") -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url in contexts.items()],
        "users": [{"name": "u", "user": {"token": token} if token else {}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in contexts],
        "current-context": current,
    }
    path.write_text(json.dumps(doc))
    return path


async def _wait_for(predicate: Any, timeout: float = 5.0) -> None:
    await eventually(predicate, timeout=timeout, interval=0.005)


def test_defaults_are_client_go_defaults() -> None:
    s = ClientSettings()
    assert (s.qps, s.burst) == (5.0, 10)
    assert s.user_agent == f"pyprovlib/{__version__}" == DEFAULT_USER_AGENT
    with pytest.raises(ValueError, match="burst"):
        ClientSettings(qps=5, burst=0)
    with pytest.raises(ValueError, match="request_timeout"):
        ClientSettings(request_timeout=0)
    with pytest.raises(ValueError, match="max_connections"):
        ClientSettings(max_connections=0)
    assert ClientSettings().max_connections is None  # kubernetes-asyncio's pool size
    ClientSettings(qps=0, burst=0)  # unthrottled needs no burst


async def test_explicit_kubeconfig_reaches_the_server_with_user_agent(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kc.json")
    settings = ClientSettings(kubeconfig=str(path), qps=0)
    async with await new_client(settings, environ={}, service_account_dir=NO_SA) as client:
        assert isinstance(client, LimitedApiClient)
        await CoordinationV1Api(client).list_namespaced_lease("default")
        got = await request_json(client, "GET", "/api/v1/namespaces/default/events")
    assert got["kind"] == "EventList"
    assert apiserver.requests.count("list", "leases") == 1
    assert list(apiserver.requests.user_agents) == [DEFAULT_USER_AGENT] * 2


@pytest.mark.parametrize(("wanted", "limit"), [(None, 100), (8, 8)])
async def test_max_connections_bounds_the_connection_pool(
    apiserver: ApiServer, tmp_path: Path, wanted: int | None, limit: int
) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kc.json")
    settings = ClientSettings(kubeconfig=str(path), qps=0, max_connections=wanted)
    async with await new_client(settings, environ={}, service_account_dir=NO_SA) as client:
        # kubernetes-asyncio's setting, and the aiohttp connector it made from it.
        assert client.configuration.connection_pool_maxsize == limit
        assert client.rest_client.pool_manager.connector.limit == limit
        await asyncio.gather(
            *(CoordinationV1Api(client).list_namespaced_lease("default") for _ in range(12))
        )
    assert apiserver.requests.count("list", "leases") == 12


async def test_kubeconfig_from_env_and_custom_user_agent(
    apiserver: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kc.json")
    # A list like kubectl's; the missing entry is skipped.
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{path}")
    settings = ClientSettings(user_agent="my-provisioner/1.0", qps=0)
    async with await new_client(settings, service_account_dir=NO_SA) as client:
        await CoordinationV1Api(client).list_namespaced_lease("default")
    assert apiserver.requests.user_agents[-1] == "my-provisioner/1.0"


async def test_context_selection(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "kc", {"a": "http://a.example:1", "b": "http://b.example:2"}, "a")
    cfg, source = await load_configuration(
        ClientSettings(kubeconfig=str(path)), environ={}, service_account_dir=NO_SA
    )
    assert cfg.host == "http://a.example:1"
    assert str(path) in source
    cfg, _ = await load_configuration(
        ClientSettings(kubeconfig=str(path), context="b"), environ={}, service_account_dir=NO_SA
    )
    assert cfg.host == "http://b.example:2"


async def test_in_cluster(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("in-cluster-token")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", "HOME": "/x"}
    cfg, source = await load_configuration(ClientSettings(), environ=env, service_account_dir=sa)
    assert source == "in-cluster service account"
    assert cfg.host == "https://10.0.0.1:443"
    assert cfg.api_key["BearerToken"] == "Bearer in-cluster-token"
    assert cfg.ssl_ca_cert == str(sa / "ca.crt")


async def test_kubeconfig_env_wins_over_in_cluster(apiserver: ApiServer, tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    (sa / "ca.crt").write_text("c")
    path = apiserver.write_kubeconfig(tmp_path / "kc.json")
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": str(path),
    }
    cfg, _ = await load_configuration(ClientSettings(), environ=env, service_account_dir=sa)
    assert cfg.host == apiserver.url


async def test_home_kubeconfig_is_the_last_resort(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    _kubeconfig(tmp_path / ".kube" / "config", {"h": "http://home.example:3"}, "h")
    cfg, source = await load_configuration(
        ClientSettings(), environ={"HOME": str(tmp_path)}, service_account_dir=NO_SA
    )
    assert cfg.host == "http://home.example:3"
    assert ".kube" in source


async def test_nothing_found_names_every_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        await load_configuration(
            ClientSettings(), environ={"HOME": str(tmp_path)}, service_account_dir=NO_SA
        )
    tried = info.value.tried
    assert len(tried) == 4
    assert tried[0].startswith("--kubeconfig")
    assert tried[1].startswith("KUBECONFIG")
    assert "in-cluster" in tried[2]
    assert "Service host/port is not set" in tried[2]
    assert str(tmp_path / ".kube" / "config") in tried[3]
    assert "in-cluster" in str(info.value)


async def test_explicit_kubeconfig_failure_is_final(tmp_path: Path) -> None:
    # Even with a usable ~/.kube/config, a bad --kubeconfig is an error, not a fallback.
    (tmp_path / ".kube").mkdir()
    _kubeconfig(tmp_path / ".kube" / "config", {"h": "http://home.example:3"}, "h")
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        await load_configuration(
            ClientSettings(kubeconfig=str(tmp_path / "missing.yaml")),
            environ={"HOME": str(tmp_path)},
            service_account_dir=NO_SA,
        )


async def test_errors_never_contain_credentials(tmp_path: Path) -> None:
    secret = "s3cr3t-t0ken-value"
    broken = tmp_path / "broken.yaml"
    broken.write_text(f"users:\n- name: u\n  user: {{token: {secret}\n  : : [\n")
    with pytest.raises(ConfigError) as info:
        await load_configuration(
            ClientSettings(kubeconfig=str(broken)), environ={}, service_account_dir=NO_SA
        )
    assert secret not in str(info.value)
    assert "YAML" in str(info.value)
    # A kubeconfig whose current context names nothing usable.
    bad_ctx = _kubeconfig(tmp_path / "bad", {"a": "http://a:1"}, "nope", token=secret)
    with pytest.raises(ConfigError) as info:
        await load_configuration(
            ClientSettings(kubeconfig=str(bad_ctx)), environ={}, service_account_dir=NO_SA
        )
    assert secret not in str(info.value)


@pytest.mark.parametrize("text", ["my-host-name\n", "- alpha-item\n- beta-item\n", "42424242\n"])
async def test_a_file_that_is_not_a_kubeconfig_is_said_so(tmp_path: Path, text: str) -> None:
    """Regression (issue 30): ``--kubeconfig /etc/hostname`` said ``TypeError``."""
    not_a_kubeconfig = tmp_path / "hostname"
    not_a_kubeconfig.write_text(text)
    with pytest.raises(ConfigError) as info:
        await load_configuration(
            ClientSettings(kubeconfig=str(not_a_kubeconfig)), environ={}, service_account_dir=NO_SA
        )
    assert f"--kubeconfig {not_a_kubeconfig}: not a kubeconfig (expected a YAML mapping" in str(
        info.value
    )
    assert "Error" not in str(info.value)
    assert text.rsplit(maxsplit=1)[-1] not in str(info.value)  # the content is not echoed


def test_limiter_is_shared_per_settings() -> None:
    a = ClientSettings(kubeconfig="/a", qps=7, burst=3)
    assert shared_limiter(a) is shared_limiter(ClientSettings(kubeconfig="/a", qps=7, burst=3))
    assert shared_limiter(a) is not shared_limiter(ClientSettings(kubeconfig="/a", qps=8, burst=3))
    assert shared_limiter(ClientSettings(kubeconfig="/a", qps=0, burst=0)).unlimited


async def test_clients_from_equal_settings_share_one_limiter(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kc.json")
    settings = ClientSettings(kubeconfig=str(path), qps=3, burst=4, user_agent="share-test")
    # Created first with a fake clock, so no refill happens between the two requests.
    bucket = shared_limiter(settings, clock=FakeClock())
    async with (
        await new_client(settings, environ={}, service_account_dir=NO_SA) as one,
        await new_client(settings, environ={}, service_account_dir=NO_SA) as two,
    ):
        assert one.limiter is two.limiter is bucket
        await CoordinationV1Api(one).list_namespaced_lease("default")
        await CoordinationV1Api(two).list_namespaced_lease("default")
        assert bucket.tokens() == 2


async def test_limiter_paces_requests(apiserver: ApiServer) -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 2, clock=clock)
    async with LimitedApiClient(apiserver.configuration(), limiter=bucket) as client:
        api = CoordinationV1Api(client)
        n = 6
        tasks = [asyncio.ensure_future(api.list_namespaced_lease("default")) for _ in range(n)]
        # The burst goes at once; the rest wait for fake time.
        await _wait_for(lambda: apiserver.requests.count("list", "leases") == 2)
        await _wait_for(lambda: clock.waiters == n - 2)
        for i in range(n - 2):
            await clock.advance(0.1)
            await _wait_for(lambda i=i: apiserver.requests.count("list", "leases") == 3 + i)
        await asyncio.gather(*tasks)
        # (N - burst) / qps seconds of (fake) time in all.
        assert clock.monotonic() == pytest.approx((n - 2) / 10)


async def test_unlimited_when_qps_not_positive(apiserver: ApiServer) -> None:
    clock = FakeClock()
    async with LimitedApiClient(
        apiserver.configuration(), limiter=TokenBucket(0, 0, clock=clock)
    ) as client:
        api = CoordinationV1Api(client)
        await asyncio.gather(*(api.list_namespaced_lease("default") for _ in range(20)))
    assert apiserver.requests.count("list", "leases") == 20
    assert clock.waiters == 0


async def test_request_timeout_applies_to_requests_not_watches(apiserver: ApiServer) -> None:
    apiserver.faults.latency(0.5, verb="list", resource="leases", count=1)
    async with LimitedApiClient(
        apiserver.configuration(), limiter=TokenBucket(0, 0), request_timeout=0.05
    ) as client:
        with pytest.raises((asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            await CoordinationV1Api(client).list_namespaced_lease("default")
        # A watch is long-running: the default timeout is not applied to it.
        # Not the model: with _preload_content=False the client answers the open response.
        resp = cast(
            aiohttp.ClientResponse,
            await CoordinationV1Api(client).list_namespaced_lease(
                "default", watch=True, timeout_seconds=1, _preload_content=False
            ),
        )
        resp.release()


def test_service_account_namespace_reads_the_mounted_file(tmp_path: Path) -> None:
    from pyprovlib.kube._config import service_account_namespace

    assert service_account_namespace(tmp_path) == ""  # outside a pod
    (tmp_path / "namespace").write_text("storage-system\n", encoding="utf-8")
    assert service_account_namespace(tmp_path) == "storage-system"
