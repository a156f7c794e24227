"""Build the kubernetes-asyncio ``ApiClient`` every entry point uses: find the cluster
configuration (kubeconfig or in-cluster service account), set the user agent, resolve the
HTTP(S) proxy once like client-go, and put a client-side QPS/burst limiter in front of every
request. :func:`send_request` is the raw-JSON request path of every pyprovlib client, on
kubernetes-asyncio's own ``ApiClient.request`` (its aiohttp session)."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack
from urllib.parse import urlsplit

import aiohttp
import yaml
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from kubernetes_asyncio.config.kube_config import ConfigNode, KubeConfigLoader, KubeConfigMerger

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib._version import __version__
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._ratelimit import TokenBucket

__all__ = [
    "DEFAULT_USER_AGENT",
    "READ_IDLE_TIMEOUT",
    "SERVICE_ACCOUNT_DIR",
    "ClientSettings",
    "ConfigError",
    "LimitedApiClient",
    "RequestOptions",
    "api_exception",
    "check_status",
    "describe_transport_error",
    "load_configuration",
    "new_client",
    "request_json",
    "resolve_proxy",
    "send_request",
    "service_account_namespace",
    "shared_limiter",
    "use_resolved_proxy",
]

log = get_logger(__name__)

DEFAULT_USER_AGENT = f"pyprovlib/{__version__}"
"""The ``User-Agent`` sent by clients built here unless the settings name another."""

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where Kubernetes mounts a pod's service-account token and CA bundle."""

_AUTH_SETTINGS = ["BearerToken"]


def service_account_namespace(
    service_account_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR,
) -> str:
    """The namespace of the pod this process runs in, as its service account's ``namespace``
    file says; ``""`` outside a pod (no such file)."""
    try:
        return (Path(service_account_dir) / "namespace").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


READ_IDLE_TIMEOUT = 45.0
"""Seconds a request or watch may wait for the next bytes from the server before the connection
is taken as dead. client-go notices a connection a partition left half-open (a NAT or load
balancer forgot it, no reset ever comes) with HTTP/2 health checks: a ping after 30 s of
silence, dead 15 s later. Over aiohttp's HTTP/1.1 the same bound is a read-idle timeout;
watches ask for bookmarks, so a live watch is never silent that long on a server that sends
them often (a quiet watch on one that does not is simply resumed)."""


@dataclass(frozen=True)
class ClientSettings:
    """How to reach the API server and how hard to push it.

    ``qps=5`` and ``burst=10`` are client-go's ``rest.Config`` defaults
    (``DefaultQPS``/``DefaultBurst``) and the defaults of external-provisioner's
    ``--kube-api-qps`` / ``--kube-api-burst`` flags. A ``qps`` of 0 or less, or ``inf``,
    disables the client-side limiter. ``request_timeout`` (seconds) bounds every request
    except watches, which are long-running by design; ``None`` means no client-side timeout,
    as with client-go's zero ``rest.Config.Timeout``. ``max_connections`` bounds the
    connections to the API server (kubernetes-asyncio's
    ``Configuration.connection_pool_maxsize``, the aiohttp connector's limit); ``None`` keeps
    kubernetes-asyncio's default (100). Each connection costs a TLS handshake and ~0.3 MB
    that stay; requests beyond the bound wait for a free connection, and open watches hold
    one each.
    """

    kubeconfig: str | None = None
    context: str | None = None
    qps: float = 5.0
    burst: int = 10
    user_agent: str = DEFAULT_USER_AGENT
    request_timeout: float | None = None
    max_connections: int | None = None

    def __post_init__(self) -> None:
        limited = 0 < self.qps < float("inf")
        if limited and self.burst < 1:
            raise ValueError(f"burst must be at least 1 when qps is limited, got {self.burst}")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive, got {self.request_timeout}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")


class ConfigError(PyprovlibError):
    """No usable cluster configuration was found.

    ``tried`` lists every place that was looked at, each with why it could not be used.
    The message never contains credentials.
    """

    def __init__(self, tried: list[str]) -> None:
        self.tried = tuple(tried)
        super().__init__(
            "no usable Kubernetes client configuration; tried: "
            + "; ".join(self.tried)
            + ". Pass --kubeconfig, set KUBECONFIG, or run in a pod with a service account."
        )


def _describe(err: BaseException) -> str:
    # Only messages known not to echo file content: YAML errors quote the offending text,
    # which may be a token, so only their position is reported.
    if isinstance(err, yaml.YAMLError):
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        return f"not valid YAML{where}"
    if isinstance(err, OSError):
        return err.strerror or type(err).__name__
    if isinstance(err, ConfigException):
        return str(err)
    if isinstance(err, TypeError | KeyError):
        # kubernetes-asyncio indexes the parsed YAML as a kubeconfig: a file that is YAML but
        # no kubeconfig (a word, a list, a mapping of something else) fails so.
        return "not a kubeconfig (expected a YAML mapping with clusters, contexts and users)"
    return type(err).__name__


def _any_exists(paths: str) -> bool:
    return any(os.path.exists(os.path.expanduser(p)) for p in paths.split(os.pathsep) if p)


async def _load_kubeconfig(paths: str, context: str | None) -> Configuration:
    # Checked first: kubernetes-asyncio's merger would log a warning of its own ("Config not
    # found") beside the error this raises.
    if not _any_exists(paths):
        raise FileNotFoundError(2, "file not found")
    merger = KubeConfigMerger(paths)
    if not merger.paths:
        raise FileNotFoundError(2, "file not found")
    if merger.config is None:
        raise ConfigException("empty kubeconfig")
    # persist_config stays off: a library must not rewrite the user's kubeconfig.
    loader = KubeConfigLoader(
        config_dict=merger.config, config_base_path=None, active_context=context
    )
    configuration: Configuration = type.__call__(Configuration)
    await loader.load_and_set(configuration)
    if isinstance(merger.config.value, dict) and _uses_exec_plugin(loader, merger.config.value):
        configuration.refresh_api_key_hook = _exec_token_refresher(loader)
    return configuration


def _uses_exec_plugin(loader: KubeConfigLoader, kubeconfig: dict[str, Any]) -> bool:
    """Whether the kubeconfig's current user gets its token from an exec plugin."""
    context = loader.current_context or {}
    user_name = (context.get("context") or {}).get("user")
    for node in kubeconfig.get("users") or () if user_name else ():
        entry = node.value if isinstance(node, ConfigNode) else node  # the merger's wrapping
        if isinstance(entry, dict) and entry.get("name") == user_name:
            return "exec" in (entry.get("user") or {})
    return False


def _exec_token_refresher(loader: KubeConfigLoader) -> Callable[[Configuration], Awaitable[None]]:
    """A ``Configuration.refresh_api_key_hook`` (kubernetes-asyncio calls it before reading
    the token for a request, as it does for the in-cluster token file) that runs the exec
    plugin again once its token has expired, through kubernetes-asyncio's own
    ``KubeConfigLoader.load_from_exec_plugin`` (which checks the expiry, with its 5-minute
    margin). A token the plugin gave no expiry is kept, as client-go keeps it. Concurrent
    requests wait for one run of the plugin."""
    lock = asyncio.Lock()

    async def refresh(configuration: Configuration) -> None:
        if getattr(loader, "exec_plugin_expiry", None) is None:
            return
        async with lock:
            await loader.load_from_exec_plugin()
        configuration.api_key["BearerToken"] = loader.token

    return refresh


def _load_in_cluster(environ: Mapping[str, str], service_account_dir: Path) -> Configuration:
    loader = InClusterConfigLoader(
        token_filename=str(service_account_dir / "token"),
        cert_filename=str(service_account_dir / "ca.crt"),
        environ=dict(environ),
    )
    configuration: Configuration = type.__call__(Configuration)
    loader.load_and_set(configuration)
    return configuration


async def load_configuration(
    settings: ClientSettings,
    *,
    environ: Mapping[str, str] | None = None,
    service_account_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR,
) -> tuple[Configuration, str]:
    """Find the cluster configuration; return it with a description of where it came from.

    The order is controller-runtime's ``config.GetConfig()``:

    1. ``settings.kubeconfig`` (``--kubeconfig``) — used alone; a failure is final;
    2. the ``KUBECONFIG`` environment variable (a ``:``-separated list, merged like kubectl) —
       when set, it is the only kubeconfig consulted and the in-cluster config is skipped;
    3. the in-cluster service account (``KUBERNETES_SERVICE_HOST``/``_PORT`` plus the token
       and CA bundle in ``service_account_dir``);
    4. ``~/.kube/config``.

    client-go's ``clientcmd.BuildConfigFromFlags`` (what external-provisioner calls when
    ``--kubeconfig`` is given) only does 1 then 3; 2 and 4 are what kubectl and
    controller-runtime add. Raises :class:`ConfigError` naming every place tried.
    """
    env = os.environ if environ is None else environ
    tried: list[str] = []
    if settings.kubeconfig:
        try:
            cfg = await _load_kubeconfig(settings.kubeconfig, settings.context)
        except (ConfigException, OSError, yaml.YAMLError, KeyError, TypeError) as err:
            tried.append(f"--kubeconfig {settings.kubeconfig}: {_describe(err)}")
            raise ConfigError(tried) from None
        return cfg, f"kubeconfig {settings.kubeconfig}"
    tried.append("--kubeconfig: not given")

    env_paths = env.get("KUBECONFIG", "")
    if env_paths:
        try:
            cfg = await _load_kubeconfig(env_paths, settings.context)
        except (ConfigException, OSError, yaml.YAMLError, KeyError, TypeError) as err:
            tried.append(f"KUBECONFIG={env_paths}: {_describe(err)}")
            raise ConfigError(tried) from None
        return cfg, f"KUBECONFIG={env_paths}"
    tried.append("KUBECONFIG: not set")

    sa_dir = Path(service_account_dir)
    try:
        cfg = _load_in_cluster(env, sa_dir)
    except (ConfigException, OSError) as err:
        tried.append(f"in-cluster ({sa_dir}): {_describe(err)}")
    else:
        return cfg, "in-cluster service account"

    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    default_path = home / ".kube" / "config"
    if default_path.exists():
        try:
            cfg = await _load_kubeconfig(str(default_path), settings.context)
        except (ConfigException, OSError, yaml.YAMLError, KeyError, TypeError) as err:
            tried.append(f"{default_path}: {_describe(err)}")
            raise ConfigError(tried) from None
        return cfg, f"kubeconfig {default_path}"
    tried.append(f"{default_path}: file not found")
    raise ConfigError(tried)


def _env_any(environ: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return ""


def _no_proxy_matches(no_proxy: str, host: str, port: str) -> bool:
    """Go's ``httpproxy`` NO_PROXY rules: ``*``; IPs and CIDRs; ``host[:port]`` entries that
    match the host and its subdomains (``.host`` and ``*.host``: subdomains only)."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                pass
            else:
                if ip is not None and ip in network:
                    return True
                continue
        entry_host, entry_port = entry, ""
        if entry.startswith("["):
            bracket = entry.find("]")
            entry_host = entry[1:bracket] if bracket > 0 else entry
            if bracket > 0 and entry[bracket + 1 : bracket + 2] == ":":
                entry_port = entry[bracket + 2 :]
        elif entry.count(":") == 1:
            entry_host, entry_port = entry.split(":")
        try:
            entry_ip = ipaddress.ip_address(entry_host)
        except ValueError:
            entry_ip = None
        if entry_ip is not None:
            if ip is not None and ip == entry_ip and entry_port in ("", port):
                return True
            continue
        if not entry_host:
            continue
        match_host = not entry_host.startswith((".", "*."))
        suffix = entry_host[1:] if entry_host.startswith("*.") else entry_host
        if not suffix.startswith("."):
            suffix = "." + suffix
        if (host.endswith(suffix) or (match_host and host == suffix[1:])) and entry_port in (
            "",
            port,
        ):
            return True
    return False


def resolve_proxy(
    host_url: str, *, proxy_url: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The proxy for requests to ``host_url`` (the API server), or None for a direct connection.

    client-go's rules: a kubeconfig ``proxy-url`` (``proxy_url``) is used as given; otherwise
    ``http.ProxyFromEnvironment`` — ``HTTPS_PROXY``/``https_proxy`` for an https server,
    ``HTTP_PROXY``/``http_proxy`` for http (upper case first), never for ``localhost`` or a
    loopback address, and not when ``NO_PROXY``/``no_proxy`` matches the host. A proxy given as
    ``host[:port]`` means ``http://host[:port]``. Go reads the environment once per process;
    this is resolved once per client, since every request of a client goes to the same server.
    """
    if proxy_url:
        return proxy_url
    env = os.environ if environ is None else environ
    parts = urlsplit(host_url)
    scheme = (parts.scheme or "https").lower()
    host = (parts.hostname or "").lower()
    port = str(parts.port or (443 if scheme == "https" else 80))
    if scheme == "https":
        proxy = _env_any(env, "HTTPS_PROXY", "https_proxy")
    else:
        proxy = _env_any(env, "HTTP_PROXY", "http_proxy")
    if not proxy or not host:
        return None
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    if _no_proxy_matches(_env_any(env, "NO_PROXY", "no_proxy"), host, port):
        return None
    if urlsplit(proxy).scheme.lower() not in ("http", "https", "socks5", "socks5h"):
        proxy = "http://" + proxy
    return proxy


# kubernetes-asyncio's session reads at most this much of a response at once (watch events
# of large objects: etcd's 1.5 MiB request limit); the session replacing it keeps the figure.
_READ_BUFSIZE = 2**21


def use_resolved_proxy(api_client: ApiClient, *, environ: Mapping[str, str] | None = None) -> None:
    """Resolve ``api_client``'s proxy once (:func:`resolve_proxy`) and stop aiohttp's
    per-request environment lookups.

    kubernetes-asyncio opens its aiohttp session with ``trust_env=True``: every request then
    reads ``~/.netrc`` and the proxy variables in the default thread pool — two executor round
    trips per request, about a third of a controller's CPU time in ``bench/provision.py``.
    Proxies from the environment keep working: the proxy is resolved here, with client-go's
    rules, and handed to kubernetes-asyncio's ``rest_client.proxy``, which passes it with every
    request. The session is replaced, through aiohttp's public API, by one on the same connector
    (kubernetes-asyncio's TLS set-up) that does not read the environment and keeps no cookies.
    (``.netrc`` credentials and ``Set-Cookie`` answers are ignored; client-go ignores them too.)
    """
    configuration = api_client.configuration
    rest = api_client.rest_client
    proxy = resolve_proxy(configuration.host or "", proxy_url=configuration.proxy, environ=environ)
    rest.proxy = proxy or ""  # falsy: no proxy argument, a direct connection
    session: aiohttp.ClientSession = rest.pool_manager
    if session.trust_env and not session.closed:
        connector = session.connector
        session.detach()  # the connector now belongs to the new session alone
        rest.pool_manager = aiohttp.ClientSession(
            connector=connector,
            trust_env=False,
            read_bufsize=_READ_BUFSIZE,
            # No cookie store, as client-go has none: nothing to file or filter per request.
            # (A kubeconfig's cookie still goes out: ApiClient.cookie is a plain header.)
            cookie_jar=aiohttp.DummyCookieJar(),
        )


_limiters: dict[ClientSettings, TokenBucket] = {}


def shared_limiter(settings: ClientSettings, *, clock: Clock | None = None) -> TokenBucket:
    """The process-wide limiter for ``settings``: every client built from equal settings
    shares one token bucket, so the process as a whole stays within qps/burst (client-go
    gets the same by sharing one ``rest.Config``'s ``RateLimiter``). ``clock`` is only used
    when the bucket is first created."""
    bucket = _limiters.get(settings)
    if bucket is None:
        bucket = TokenBucket(settings.qps, settings.burst, clock=clock)
        _limiters[settings] = bucket
    return bucket


class LimitedApiClient(ApiClient):
    """An ``ApiClient`` whose every request (watches included, like client-go) first waits
    for a token from ``limiter``, and whose non-watch requests get a default timeout.

    Its proxy is resolved once from the configuration (kubeconfig ``proxy-url``) or from
    ``environ`` (default ``os.environ``), see :func:`use_resolved_proxy`. Typed API calls and
    :func:`send_request` (the raw-JSON path of ResourceClient, informers, events and leases)
    all go through :meth:`request`, that is kubernetes-asyncio's aiohttp session.
    Close the client (``async with``) to close the session."""

    def __init__(
        self,
        configuration: Configuration,
        *,
        limiter: TokenBucket,
        user_agent: str = DEFAULT_USER_AGENT,
        request_timeout: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(configuration=configuration)
        use_resolved_proxy(self, environ=environ)
        self.limiter = limiter
        self.request_timeout = request_timeout
        self.user_agent = user_agent

    async def request(  # noqa: PLR0917 - mirrors ApiClient.request
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        """Wait for the limiter, then send the request as ``ApiClient.request`` does."""
        await self.limiter.wait()
        if (
            _request_timeout is None
            and self.request_timeout is not None
            and not _is_watch(query_params)
        ):
            _request_timeout = self.request_timeout
        return await super().request(
            method,
            url,
            query_params=query_params,
            headers=headers,
            post_params=post_params,
            body=body,
            _preload_content=_preload_content,
            _request_timeout=_request_timeout,
        )


def _is_watch(query_params: Any) -> bool:
    if not query_params:
        return False
    items = query_params.items() if isinstance(query_params, Mapping) else query_params
    return any(k == "watch" and str(v).lower() in ("true", "1") for k, v in items)


async def new_client(
    settings: ClientSettings | None = None,
    *,
    limiter: TokenBucket | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR,
) -> LimitedApiClient:
    """The one place that builds the ``ApiClient`` for an entry point.

    Configuration comes from :func:`load_configuration`; requests share
    :func:`shared_limiter` for these settings unless ``limiter`` is given. The caller owns
    the client: ``async with await new_client(settings) as api: ...``.
    """
    settings = settings or ClientSettings()
    configuration, source = await load_configuration(
        settings, environ=environ, service_account_dir=service_account_dir
    )
    log.info(
        "kubernetes client configured",
        source=source,
        host=configuration.host,
        qps=settings.qps,
        burst=settings.burst,
    )
    if settings.max_connections is not None:
        # Read when the client opens its connector, below.
        configuration.connection_pool_maxsize = settings.max_connections
    return LimitedApiClient(
        configuration,
        limiter=limiter if limiter is not None else shared_limiter(settings),
        user_agent=settings.user_agent,
        request_timeout=settings.request_timeout,
        environ=environ,
    )


@functools.cache
def _default_timeout(read_idle: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(sock_connect=30.0, sock_read=read_idle)


class RequestOptions(TypedDict, total=False):
    """The optional parts of one request made with :func:`send_request` or
    :func:`request_json`.

    ``body`` must already be JSON-serialisable (dicts and lists of plain values, as the
    raw-JSON clients hold); ``content_type`` defaults to ``application/json``; ``query`` is a
    list of (name, value) pairs. ``request_timeout`` is seconds or an
    ``aiohttp.ClientTimeout``; without one (here or on the client), a response silent for
    :data:`READ_IDLE_TIMEOUT` seconds fails the request instead of hanging on a dead
    connection.
    """

    body: Any
    content_type: str
    query: list[tuple[str, str]] | None
    request_timeout: float | aiohttp.ClientTimeout | None


async def send_request(
    api_client: ApiClient, method: str, path: str, **options: Unpack[RequestOptions]
) -> aiohttp.ClientResponse:
    """Send one request through ``api_client`` and return the open aiohttp response, whatever
    its status; the caller reads and releases it.

    What ``ApiClient.call_api`` does for a raw request, minus its recursive
    ``sanitize_for_serialization`` of the body: headers (the client's default headers, such as
    the user agent, win), cookie, bearer-token auth (``update_params_for_auth``: the
    configuration's refresh hook, so exec plugins and rotated tokens apply), then
    ``api_client.request`` with ``_preload_content=False`` — the limiter of a
    :class:`LimitedApiClient`, a subclass's own ``request``, kubernetes-asyncio's session.
    ``options`` are :class:`RequestOptions`.
    """
    request_timeout = options.get("request_timeout")
    if request_timeout is None and getattr(api_client, "request_timeout", None) is None:
        request_timeout = _default_timeout(READ_IDLE_TIMEOUT)
    headers = {
        "Accept": "application/json",
        "Content-Type": options.get("content_type", "application/json"),
    }
    headers.update(api_client.default_headers)
    if api_client.cookie:
        headers["Cookie"] = api_client.cookie
    params = list(options.get("query") or [])
    await api_client.update_params_for_auth(headers, params, _AUTH_SETTINGS)
    response: aiohttp.ClientResponse = await api_client.request(
        method,
        f"{api_client.configuration.host}{path}",
        query_params=params,
        headers=headers,
        body=options.get("body"),
        _preload_content=False,
        _request_timeout=request_timeout,
    )
    return response


def api_exception(response: aiohttp.ClientResponse, body: bytes) -> ApiException:
    """The ``ApiException`` of a non-2xx ``response`` whose body was ``body``: status, reason,
    headers, and the body decoded to str, as kubernetes-asyncio's own call path leaves it."""
    err = ApiException(status=response.status, reason=response.reason)
    err.body = body.decode("utf-8", "replace")  # type: ignore[assignment]
    err.headers = response.headers
    return err


async def check_status(response: aiohttp.ClientResponse) -> aiohttp.ClientResponse:
    """``response`` itself when it is 2xx, for a caller that reads the body as it arrives (a
    watch); otherwise its body is read, the response released and :func:`api_exception`
    raised."""
    if 200 <= response.status <= 299:
        return response
    try:
        body = await response.read()
    finally:
        response.release()
    raise api_exception(response, body)


def describe_transport_error(err: BaseException) -> str:
    """One line for a request that got no HTTP answer, fit for a log: ``host:port`` and the
    cause when the connection could not be made (``cannot connect to 10.0.0.1:6443:
    Connection refused``), aiohttp's own message otherwise — never a ``repr()`` of its
    connection internals."""
    if isinstance(err, aiohttp.ClientConnectorError):
        cause = err.os_error
        reason = (cause.strerror if isinstance(cause, OSError) else None) or str(cause)
        return f"cannot connect to {err.host}:{err.port}: {reason or type(cause).__name__}"
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


async def request_json(
    api_client: ApiClient, method: str, path: str, **options: Unpack[RequestOptions]
) -> dict[str, Any]:
    """Send one request through ``api_client`` (auth, user agent and limiter apply; ``options``
    as for :func:`send_request`) and return the JSON body as a dict, skipping
    kubernetes-asyncio's model deserialization.

    Raises ``ApiException`` (with status, body and headers) on a non-2xx answer, like the
    typed API methods do.
    """
    resp = await send_request(api_client, method, path, **options)
    try:
        data: bytes = await resp.content.read()
    finally:
        resp.release()
    if not 200 <= resp.status <= 299:
        raise api_exception(resp, data)
    if not data:
        return {}
    # The API speaks UTF-8 (RFC 8259): decoding first skips json's encoding sniffing.
    decoded = json.loads(data.decode("utf-8"))
    return decoded if isinstance(decoded, dict) else {}
