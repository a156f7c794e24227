"""The raw-JSON request path (send_request/request_json) authenticates as kubernetes-asyncio
does: a kubeconfig exec plugin's token is fetched, and fetched again once it has expired
(kubernetes-asyncio's ``load_from_exec_plugin``, from the configuration's refresh hook); a
token without an expiry is kept.

The API server here is a few lines of aiohttp.web that only records the Authorization header
each request carries (the in-memory server does not check credentials)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp.web
import pytest
import yaml

from pyprovlib.kube._config import ClientSettings, new_client, request_json
from pyprovlib.kube._ratelimit import TokenBucket

PLUGIN = """
import json, pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text() or 0) + 1 if counter.exists() else 1
counter.write_text(str(n))
status = {"token": f"token-{n}"}
if sys.argv[2] == "expired":
    # Already expired: kubernetes-asyncio runs the plugin again before the next request.
    status["expirationTimestamp"] = "2000-01-01T00:00:00Z"
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "kind": "ExecCredential",
    "status": status,
}))
"""


@pytest.fixture
async def header_server() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return aiohttp.web.json_response({"kind": "NamespaceList", "items": []})

    app = aiohttp.web.Application()
    app.router.add_get("/api/v1/namespaces", handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("expiry", "expected"),
    [
        ("expired", ["Bearer token-2", "Bearer token-3"]),  # fetched again for each request
        ("none", ["Bearer token-1", "Bearer token-1"]),  # no expiry: kept
    ],
)
async def test_exec_plugin_tokens_are_used_and_refreshed(
    header_server: tuple[str, list[str]], tmp_path: Path, expiry: str, expected: list[str]
) -> None:
    server, seen = header_server
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    counter = tmp_path / "count"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": sys.executable,
                                "args": [str(plugin), str(counter), expiry],
                            }
                        },
                    }
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    settings = ClientSettings(kubeconfig=str(kubeconfig), qps=0)
    async with await new_client(settings, environ={}, limiter=TokenBucket(0, 0)) as api:
        first = await request_json(api, "GET", "/api/v1/namespaces")
        await request_json(api, "GET", "/api/v1/namespaces")
    assert first["kind"] == "NamespaceList"
    assert seen == expected
