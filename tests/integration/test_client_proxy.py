"""Clients from pyprovlib.kube._config.new_client reach the API server through the proxy the
environment or the kubeconfig names (client-go's rules), with aiohttp's per-request
environment lookups (trust_env) off."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import yaml

from pyprovlib.kube._config import ClientSettings, new_client, request_json
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.testing._server import ApiServer


class ForwardProxy:
    """A minimal plain-HTTP forward proxy: records each request line (absolute-form, as sent
    to a proxy) and relays the request, one per connection, to the API server."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.request_lines: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            self.request_lines.append(lines[0])
            path = "/" + target.split("://", 1)[1].split("/", 1)[1]
            headers = [h for h in lines[1:] if h and not h.lower().startswith("connection:")]
            sizes = [h.split(":", 1)[1] for h in headers if h.lower().startswith("content-length:")]
            length = int(sizes[0]) if sizes else 0
            body = await reader.readexactly(length) if length else b""
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            request = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close"])
            up_writer.write(request.encode("latin-1") + b"\r\n\r\n" + body)
            await up_writer.drain()
            writer.write(await up_reader.read())
            await writer.drain()
            up_writer.close()
            await up_writer.wait_closed()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def forward_proxy(upstream_port: int) -> AsyncIterator[tuple[ForwardProxy, int]]:
    proxy = ForwardProxy(upstream_port)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    async with server:
        yield proxy, server.sockets[0].getsockname()[1]


def kubeconfig(path: Path, server: str, proxy_url: str | None = None) -> str:
    cluster: dict[str, str] = {"server": server}
    if proxy_url:
        cluster["proxy-url"] = proxy_url
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def settings(path: str) -> ClientSettings:
    return ClientSettings(kubeconfig=path, qps=0)


async def test_https_proxy_from_the_environment_is_used(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    port = int(apiserver.url.rsplit(":", 1)[1])
    async with forward_proxy(port) as (proxy, proxy_port):
        # A name only the proxy can reach: a direct connection would fail to resolve it.
        path = kubeconfig(tmp_path / "kc", f"http://apiserver.invalid:{port}")
        env = {"HTTP_PROXY": f"http://127.0.0.1:{proxy_port}", "NO_PROXY": "other.invalid"}
        async with await new_client(settings(path), environ=env, limiter=TokenBucket(0, 0)) as api:
            assert api.rest_client.pool_manager.trust_env is False
            listed = await request_json(api, "GET", "/api/v1/namespaces")
            await request_json(api, "GET", "/api/v1/namespaces/default")
    assert listed["kind"] == "NamespaceList"
    assert proxy.request_lines == [
        f"GET http://apiserver.invalid:{port}/api/v1/namespaces HTTP/1.1",
        f"GET http://apiserver.invalid:{port}/api/v1/namespaces/default HTTP/1.1",
    ]


async def test_no_proxy_and_loopback_connect_directly(apiserver: ApiServer, tmp_path: Path) -> None:
    port = int(apiserver.url.rsplit(":", 1)[1])
    async with forward_proxy(port) as (proxy, proxy_port):
        env = {"HTTP_PROXY": f"http://127.0.0.1:{proxy_port}", "NO_PROXY": "apiserver.test"}
        # Loopback: never proxied (Go's ProxyFromEnvironment), the environment notwithstanding.
        path = kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
        async with await new_client(settings(path), environ=env, limiter=TokenBucket(0, 0)) as api:
            assert (await request_json(api, "GET", "/api/v1/namespaces"))["kind"]
    assert proxy.request_lines == []


async def test_kubeconfig_proxy_url_is_used(apiserver: ApiServer, tmp_path: Path) -> None:
    port = int(apiserver.url.rsplit(":", 1)[1])
    async with forward_proxy(port) as (proxy, proxy_port):
        path = kubeconfig(
            tmp_path / "kc", f"http://127.0.0.1:{port}", proxy_url=f"http://127.0.0.1:{proxy_port}"
        )
        async with await new_client(settings(path), environ={}, limiter=TokenBucket(0, 0)) as api:
            await request_json(api, "GET", "/api/v1/namespaces")
    assert proxy.request_lines == [f"GET http://127.0.0.1:{port}/api/v1/namespaces HTTP/1.1"]
