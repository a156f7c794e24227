"""Proxy resolution of pyprovlib.kube._config: client-go's rules (kubeconfig proxy-url, else
HTTP(S)_PROXY / NO_PROXY, never for loopback), resolved once per client instead of aiohttp's
per-request environment lookups."""

from __future__ import annotations

import pytest

from pyprovlib.kube._config import resolve_proxy

HTTPS = "https://api.example.com:6443"


@pytest.mark.parametrize(
    ("host", "env", "expected"),
    [
        (HTTPS, {}, None),
        (HTTPS, {"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        (HTTPS, {"https_proxy": "http://lower:3128"}, "http://lower:3128"),
        # Upper case wins, as in Go's getEnvAny.
        (HTTPS, {"HTTPS_PROXY": "http://up:1", "https_proxy": "http://low:2"}, "http://up:1"),
        # An https server ignores HTTP_PROXY and vice versa.
        (HTTPS, {"HTTP_PROXY": "http://proxy:3128"}, None),
        ("http://api.example.com", {"HTTP_PROXY": "http://p:1"}, "http://p:1"),
        ("http://api.example.com", {"HTTPS_PROXY": "http://p:1"}, None),
        # host[:port] means http://host[:port].
        (HTTPS, {"HTTPS_PROXY": "proxy.corp:8080"}, "http://proxy.corp:8080"),
        (HTTPS, {"HTTPS_PROXY": "socks5://proxy:1080"}, "socks5://proxy:1080"),
        # Loopback and localhost are never proxied.
        ("https://127.0.0.1:6443", {"HTTPS_PROXY": "http://p:1"}, None),
        ("https://[::1]:6443", {"HTTPS_PROXY": "http://p:1"}, None),
        ("https://localhost:6443", {"HTTPS_PROXY": "http://p:1"}, None),
    ],
)
def test_proxy_from_the_environment(host: str, env: dict[str, str], expected: str | None) -> None:
    assert resolve_proxy(host, environ=env) == expected


@pytest.mark.parametrize(
    ("host", "no_proxy", "proxied"),
    [
        (HTTPS, "*", False),
        (HTTPS, "example.com", False),  # the domain and its subdomains
        (HTTPS, "api.example.com", False),
        (HTTPS, ".example.com", False),  # subdomains only
        ("https://example.com", ".example.com", True),
        ("https://example.com", "*.example.com", True),
        (HTTPS, "*.example.com", False),
        (HTTPS, "ample.com", True),  # not a domain boundary
        (HTTPS, "api.example.com:6443", False),
        (HTTPS, "api.example.com:443", True),  # another port
        ("https://api.example.com", "api.example.com:443", False),  # the scheme's default port
        (HTTPS, " other.org , API.EXAMPLE.COM ", False),  # spaces and case
        ("https://10.1.2.3:6443", "10.0.0.0/8", False),
        ("https://10.1.2.3:6443", "192.168.0.0/16", True),
        ("https://10.1.2.3:6443", "10.1.2.3", False),
        ("https://10.1.2.3:6443", "10.1.2.3:6443", False),
        ("https://10.1.2.3:6443", "10.1.2.3:443", True),
        ("https://[2001:db8::1]:6443", "2001:db8::/32", False),
        ("https://[2001:db8::1]:6443", "[2001:db8::1]:6443", False),
        (HTTPS, "", True),
        (HTTPS, ",,", True),
    ],
)
def test_no_proxy(host: str, no_proxy: str, proxied: bool) -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": no_proxy}
    assert (resolve_proxy(host, environ=env) is not None) is proxied


def test_lower_case_no_proxy_is_honoured() -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "example.com"}
    assert resolve_proxy(HTTPS, environ=env) is None


def test_kubeconfig_proxy_url_wins_even_for_loopback() -> None:
    # client-go: rest.Config.Proxy replaces ProxyFromEnvironment entirely.
    env = {"HTTPS_PROXY": "http://env:1", "NO_PROXY": "*"}
    assert resolve_proxy(HTTPS, proxy_url="http://kc:2", environ=env) == "http://kc:2"
    assert resolve_proxy("https://127.0.0.1", proxy_url="http://kc:2", environ={}) == "http://kc:2"
