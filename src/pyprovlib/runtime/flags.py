"""Command-line flags and environment variables shared by every pyprovlib entry point.

The flag names, defaults and value syntax follow the Kubernetes CSI sidecars
(external-provisioner, external-attacher): ``--leader-election=true``, Go durations such as
``15s`` or ``1m30s``, ``--http-endpoint=:8080``. Every flag can also be set from an
environment variable (``PYPROVLIB_<FLAG_NAME>``, plus a few conventional names such as
``POD_NAMESPACE``); a flag on the command line wins over the environment, which wins over
the default.

As in Go's ``flag`` package, a flag is only ever recognised by its full name: argparse's
prefix matching is off on every parser (``--time=1s`` is an error, not ``--timeout``).
klog's ``-v N`` / ``--v=N`` is accepted (see :data:`KLOG_DEBUG_VERBOSITY`), and the upstream
sidecars' flags that pyprovlib does not implement (:data:`UNSUPPORTED_UPSTREAM_FLAGS`) are
rejected by name in one line.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, overload

from pyprovlib._version import __version__

if TYPE_CHECKING:
    from pyprovlib.kube.config import ClientSettings
    from pyprovlib.kube.leaderelection import LeaderElectionConfig

__all__ = [
    "ENV_PREFIX",
    "KLOG_DEBUG_VERBOSITY",
    "UNSUPPORTED_UPSTREAM_FLAGS",
    "CommonOptions",
    "HttpAddress",
    "RuntimeArgumentParser",
    "add_bool_flag",
    "add_duration_flag",
    "add_flag",
    "common_parser",
    "env_name",
    "format_duration",
    "parse_bool",
    "parse_common",
    "parse_duration",
    "parse_http_address",
]

ENV_PREFIX = "PYPROVLIB_"
"""Prefix of the environment variable that mirrors each flag (``--log-level`` →
``PYPROVLIB_LOG_LEVEL``)."""

LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")

KLOG_DEBUG_VERBOSITY = 4
"""klog's ``-v``/``--v`` level from which pyprovlib logs at debug. Kubernetes' logging
conventions call V(4) "debug level" and V(5) "trace level"; levels 0-3 are all info messages
of more or less detail, and a verbosity never hides warnings or errors. So ``--v`` only ever
makes the log more verbose: ``--v=4`` and above set the level to debug, ``--v=0`` to ``--v=3``
leave ``--log-level`` as it is (info unless set)."""

_KLOG_FLAGS = (
    "klog flag: pyprovlib logs to stderr through structlog; use --log-level and --log-format"
)
_FEATURE_GATES = "feature gates of the Go sidecars: pyprovlib has none"
UNSUPPORTED_UPSTREAM_FLAGS: Mapping[str, str] = {
    # external-provisioner
    "--enable-capacity": "CSIStorageCapacity objects are not implemented",
    "--capacity-threads": "CSIStorageCapacity objects are not implemented",
    "--capacity-poll-interval": "CSIStorageCapacity objects are not implemented",
    "--capacity-for-immediate-binding": "CSIStorageCapacity objects are not implemented",
    "--capacity-ownerref-level": "CSIStorageCapacity objects are not implemented",
    "--kube-api-capacity-qps": "CSIStorageCapacity objects are not implemented",
    "--kube-api-capacity-burst": "CSIStorageCapacity objects are not implemented",
    "--node-deployment": "per-node deployment (distributed provisioning) is not implemented",
    "--node-deployment-immediate-binding": "per-node deployment is not implemented",
    "--node-deployment-base-delay": "per-node deployment is not implemented",
    "--node-deployment-max-delay": "per-node deployment is not implemented",
    "--cloning-protection-threads": "the cloning-protection finalizer controller is not "
    "implemented",
    "--controller-publish-readonly": "marking ROX volumes read-only at ControllerPublish is "
    "not implemented",
    "--enable-pprof": "Go's pprof has no Python counterpart here",
    "--feature-gates": _FEATURE_GATES,
    "--master": "use --kubeconfig (or the in-cluster service account)",
    "--connection-timeout": "removed upstream; the sidecar waits for the CSI socket until it "
    "appears",
    "--provisioner": "removed upstream; the provisioner name comes from the driver's GetPluginInfo",
    "--leader-election-type": "removed upstream; leader election always uses Leases",
    "--enable-leader-election": "removed upstream; use --leader-election",
    # external-attacher / external-resizer
    "--max-grpc-log-length": "gRPC payloads are never logged",
    "--extra-modify-metadata": "VolumeAttributesClass (ControllerModifyVolume) is not implemented",
    # klog / component-base logging
    "--logtostderr": _KLOG_FLAGS,
    "--alsologtostderr": _KLOG_FLAGS,
    "--log-dir": _KLOG_FLAGS,
    "--log-file": _KLOG_FLAGS,
    "--log-file-max-size": _KLOG_FLAGS,
    "--log-flush-frequency": _KLOG_FLAGS,
    "--stderrthreshold": _KLOG_FLAGS,
    "--vmodule": _KLOG_FLAGS,
    "--skip-headers": _KLOG_FLAGS,
    "--skip-log-headers": _KLOG_FLAGS,
    "--add-dir-header": _KLOG_FLAGS,
    "--one-output": _KLOG_FLAGS,
    "--log-backtrace-at": _KLOG_FLAGS,
    "--log_backtrace_at": _KLOG_FLAGS,
    "--logging-format": _KLOG_FLAGS,
    "--log-json-split-stream": _KLOG_FLAGS,
    "--log-json-info-buffer-size": _KLOG_FLAGS,
}
"""Flags of external-provisioner, external-attacher, external-resizer and klog that
pyprovlib's entry points do not implement, each with why. Given one, an entry point exits
with status 2 and one line naming it (not argparse's usage dump), so an upstream manifest
that relies on it fails loudly instead of running without it. A flag an entry point does
define is never looked up here."""

_SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

_N = TypeVar("_N")


def env_name(flag: str) -> str:
    """The environment variable mirroring ``flag``:
    ``--kube-api-qps`` → ``PYPROVLIB_KUBE_API_QPS``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


# ---------------------------------------------------------------------------------------------
# Value syntax


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """Parse a boolean the way Go's ``strconv.ParseBool`` (and so Go's ``flag``) does.

    Accepts ``1 t T TRUE true True`` and ``0 f F FALSE false False``; anything else raises
    :class:`argparse.ArgumentTypeError`.
    """
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}: use true or false")


_DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # Go accepts both micro signs
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# Longer units first so "ms" is not read as "m" followed by garbage.
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration string (``300ms``, ``15s``, ``1m30s``, ``1.5h``) into seconds.

    The grammar is Go's ``time.ParseDuration``: one or more decimal numbers each followed by a
    unit (``ns``, ``us``, ``ms``, ``s``, ``m``, ``h``); a bare ``0`` is allowed. Negative
    durations are rejected because no flag here can use one. Errors raise
    :class:`argparse.ArgumentTypeError` so argparse reports them against the flag.
    """
    s = text.strip()
    if s.startswith("+"):
        s = s[1:]
    if s.startswith("-"):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must not be negative")
    if s == "0":
        return 0.0
    if not s:
        raise argparse.ArgumentTypeError("invalid duration '': expected e.g. 15s, 1m30s, 500ms")
    total = 0.0
    pos = 0
    while pos < len(s):
        match = _DURATION_PART.match(s, pos)
        if match is None:
            hint = " (missing unit)" if re.fullmatch(r"[\d.]+", s) else ""
            raise argparse.ArgumentTypeError(
                f"invalid duration {text!r}{hint}: expected e.g. 15s, 1m30s, 500ms, 1h"
            )
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return total


def format_duration(seconds: float) -> str:
    """Render seconds the way Go's ``time.Duration.String`` does: ``15s``, ``1m30s``, ``500ms``,
    ``1h0m0s``."""
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
            if seconds >= scale:
                return f"{sign}{_trim(seconds / scale)}{unit}"
        return f"{sign}{_trim(seconds / 1e-9)}ns"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{int(hours)}h{int(minutes)}m{_trim(secs)}s"
    if minutes:
        return f"{sign}{int(minutes)}m{_trim(secs)}s"
    return f"{sign}{_trim(secs)}s"


def _trim(value: float) -> str:
    return f"{round(value, 9):.9f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class HttpAddress:
    """A parsed ``host:port`` listen address. ``host`` is ``None`` for all interfaces
    (``:8080``)."""

    host: str | None
    port: int

    def __str__(self) -> str:
        if self.host is None:
            return f":{self.port}"
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def parse_http_address(text: str) -> HttpAddress:
    """Parse a Go-style TCP listen address: ``:8080``, ``0.0.0.0:8080``, ``127.0.0.1:0``,
    ``[::1]:9090``, ``localhost:8080``. Port 0 picks a free port."""
    s = text.strip()
    host: str
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or s[end + 1 : end + 2] != ":":
            raise argparse.ArgumentTypeError(f"invalid address {text!r}: expected [host]:port")
        host, port_text = s[1:end], s[end + 2 :]
    else:
        host, sep, port_text = s.rpartition(":")
        if not sep:
            raise argparse.ArgumentTypeError(
                f"invalid address {text!r}: expected host:port or :port (e.g. :8080)"
            )
        if ":" in host:
            raise argparse.ArgumentTypeError(
                f"invalid address {text!r}: IPv6 hosts need brackets, e.g. [::1]:8080"
            )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: port must be 0-65535")
    return HttpAddress(host=host or None, port=int(port_text))


def _http_address_or_empty(text: str) -> str:
    # Validated now so a typo fails at startup, kept as text so "" can mean "off".
    if text.strip():
        parse_http_address(text)
    return text.strip()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _qps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError("must be a number, got NaN")
    return value


def _metrics_path(text: str) -> str:
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"invalid path {text!r}: must start with '/'")
    return text


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice {text!r} (choose from {', '.join(choices)})"
            )
        return value

    return convert


# ---------------------------------------------------------------------------------------------
# The parser


@dataclass(frozen=True)
class _EnvBinding:
    dest: str
    flag: str
    names: tuple[str, ...]
    convert: Callable[[str], Any]


class RuntimeArgumentParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose flags may also come from the environment.

    Flags added with :func:`add_flag`, :func:`add_bool_flag` or :func:`add_duration_flag` are
    bound to environment variables; the environment is read when arguments are parsed, so a
    flag on the command line wins over the environment, which wins over the default. An
    invalid environment value is reported like an invalid flag value (exit status 2).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        # Go's flag package has no prefix matching: neither do we (--time is not --timeout).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._env_bindings: list[_EnvBinding] = []
        self.environ: Mapping[str, str] | None = None
        """The environment to read; ``None`` means ``os.environ`` at parse time."""

    def bind_env(
        self, dest: str, flag: str, names: Sequence[str], convert: Callable[[str], Any]
    ) -> None:
        """Let ``dest`` be set from the first of ``names`` present in the environment."""
        self._env_bindings.append(_EnvBinding(dest, flag, tuple(names), convert))

    @property
    def env_bindings(self) -> Mapping[str, tuple[str, ...]]:
        """Each bound destination with its environment variable names, in precedence order."""
        return {b.dest: b.names for b in self._env_bindings}

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None, namespace: _N
    ) -> tuple[_N, list[str]]: ...

    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        if namespace is None:
            namespace = argparse.Namespace()
        environ = os.environ if self.environ is None else self.environ
        for binding in self._env_bindings:
            if hasattr(namespace, binding.dest):
                continue
            for name in binding.names:
                raw = environ.get(name)
                if raw is None or raw == "":
                    continue
                try:
                    value = binding.convert(raw)
                except (argparse.ArgumentTypeError, ValueError) as err:
                    self.error(f"environment variable {name} (for {binding.flag}): {err}")
                # argparse keeps attributes already on the namespace unless the flag is given,
                # which is exactly "flag > environment > default".
                setattr(namespace, binding.dest, value)
                break
        parsed, extras = super().parse_known_args(args, namespace)
        self._reject_unsupported(extras)
        return parsed, extras

    def _reject_unsupported(self, extras: Sequence[str]) -> None:
        # Only what no action of this parser took ends up here, so a flag an entry point
        # implements (e.g. --extra-create-metadata) is never rejected.
        for arg in extras:
            name = arg.split("=", 1)[0]
            if name.startswith("-") and not name.startswith("--"):
                name = "-" + name  # Go accepts -flag for --flag
            reason = UNSUPPORTED_UPSTREAM_FLAGS.get(name)
            if reason is not None:
                self.exit(
                    2,
                    f"{self.prog}: error: {name} is an upstream flag pyprovlib does not "
                    f"support: {reason}; remove it\n",
                )


def _env_names(flag: str, env: Sequence[str] | None, extra_env: Sequence[str]) -> tuple[str, ...]:
    names = [env_name(flag)] if env is None else list(env)
    return tuple(names) + tuple(extra_env)


def _help_suffix(default_text: str, names: Sequence[str], env_note: str) -> str:
    parts = [f"default: {default_text}"]
    if names:
        parts.append("env: " + ", ".join(names) + env_note)
    return " (" + "; ".join(parts) + ")"


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def add_flag(
    parser: RuntimeArgumentParser,
    flag: str,
    *,
    default: Any,
    help: str,
    type: Callable[[str], Any] = str,
    env: Sequence[str] | None = None,
    extra_env: Sequence[str] = (),
    env_note: str = "",
    metavar: str | None = None,
    default_text: str | None = None,
    group: argparse._ArgumentGroup | None = None,
    aliases: Sequence[str] = (),
) -> None:
    """Add a value flag (``--name VALUE`` or ``--name=VALUE``) bound to the environment.

    ``env`` replaces the default variable name (``PYPROVLIB_<NAME>``); ``extra_env`` adds
    lower-precedence names (e.g. ``POD_NAMESPACE``). ``--help`` shows the default and the
    variables. ``type`` converts both command-line and environment text. ``aliases`` are
    other spellings of the same flag (``-v`` for ``--v``).
    """
    names = _env_names(flag, env, extra_env)
    dest = flag.lstrip("-").replace("-", "_")
    shown = default_text if default_text is not None else ("''" if default == "" else str(default))
    target = group if group is not None else parser
    target.add_argument(
        flag,
        *aliases,
        dest=dest,
        type=type,
        default=default,
        metavar=metavar or dest.upper(),
        help=_escape(help + _help_suffix(shown, names, env_note)),
    )
    parser.bind_env(dest, flag, names, type)


def add_bool_flag(
    parser: RuntimeArgumentParser,
    flag: str,
    *,
    default: bool,
    help: str,
    env: Sequence[str] | None = None,
    extra_env: Sequence[str] = (),
    group: argparse._ArgumentGroup | None = None,
) -> None:
    """Add a Go-style boolean flag: ``--name`` means true, ``--name=true|false`` sets it."""
    names = _env_names(flag, env, extra_env)
    dest = flag.lstrip("-").replace("-", "_")
    target = group if group is not None else parser
    target.add_argument(
        flag,
        dest=dest,
        nargs="?",
        const=True,
        type=parse_bool,
        default=default,
        metavar="true|false",
        help=_escape(help + _help_suffix(str(default).lower(), names, "")),
    )
    parser.bind_env(dest, flag, names, parse_bool)


def add_duration_flag(
    parser: RuntimeArgumentParser,
    flag: str,
    *,
    default: float,
    help: str,
    env: Sequence[str] | None = None,
    extra_env: Sequence[str] = (),
    group: argparse._ArgumentGroup | None = None,
) -> None:
    """Add a Go duration flag (``15s``, ``1m30s``, ``500ms``); the parsed value is seconds."""
    add_flag(
        parser,
        flag,
        default=float(default),
        help=help,
        type=parse_duration,
        env=env,
        extra_env=extra_env,
        metavar="DURATION",
        default_text=format_duration(float(default)),
        group=group,
    )


_COMMON_DEFAULTS: dict[str, object] = {
    "kubeconfig": None,
    "leader_election": False,
    "leader_election_namespace": "",
    "leader_election_lease_duration": 15.0,
    "leader_election_renew_deadline": 10.0,
    "leader_election_retry_period": 2.0,
    "kube_api_qps": 5.0,
    "kube_api_burst": 10,
    "http_endpoint": "",
    "metrics_address": "",
    "metrics_path": "/metrics",
    "log_format": "auto",
    "log_level": "info",
    "worker_threads": 4,
    "shutdown_grace_period": 30.0,
}

_DURATION_DESTS = frozenset(
    {
        "leader_election_lease_duration",
        "leader_election_renew_deadline",
        "leader_election_retry_period",
        "shutdown_grace_period",
    }
)


def _seconds(dest: str, value: object) -> float:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"default for {dest} must be seconds or a duration string, got {value!r}")


def common_parser(
    prog: str,
    description: str,
    *,
    defaults: Mapping[str, object] | None = None,
) -> RuntimeArgumentParser:
    """The flags every pyprovlib entry point shares, ready for the entry point to extend.

    ``defaults`` overrides the built-in defaults by destination name (``worker_threads``,
    ``leader_election_retry_period``, ...); durations may be given as seconds or Go duration
    strings. The overrides show in ``--help``. Read the result with :func:`parse_common`.
    """
    values = dict(_COMMON_DEFAULTS)
    for key, value in (defaults or {}).items():
        if key not in values:
            raise ValueError(
                f"unknown default {key!r}; known: {', '.join(sorted(_COMMON_DEFAULTS))}"
            )
        values[key] = _seconds(key, value) if key in _DURATION_DESTS else value

    parser = RuntimeArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__}",
        help="print the version and exit",
    )

    kube = parser.add_argument_group("Kubernetes API")
    add_flag(
        parser,
        "--kubeconfig",
        default=values["kubeconfig"],
        help="path to a kubeconfig file; without it KUBECONFIG, then the in-cluster service "
        "account, then ~/.kube/config are used",
        metavar="PATH",
        default_text="none",
        group=kube,
    )
    add_flag(
        parser,
        "--kube-api-qps",
        default=float(_as_float(values["kube_api_qps"])),
        type=_qps,
        help="queries per second to the API server (client-side limit; 0 disables it)",
        metavar="QPS",
        group=kube,
    )
    add_flag(
        parser,
        "--kube-api-burst",
        default=int(_as_float(values["kube_api_burst"])),
        type=_non_negative_int,
        help="burst of requests to the API server above --kube-api-qps",
        metavar="N",
        group=kube,
    )

    le = parser.add_argument_group("leader election")
    add_bool_flag(
        parser,
        "--leader-election",
        default=bool(values["leader_election"]),
        help="run only while holding a coordination.k8s.io Lease, so several replicas can run "
        "with one active",
        group=le,
    )
    add_flag(
        parser,
        "--leader-election-namespace",
        default=values["leader_election_namespace"],
        help="namespace of the leader election Lease; empty means the pod's namespace "
        "(POD_NAMESPACE, else the service account's namespace, else 'default')",
        extra_env=("POD_NAMESPACE",),
        metavar="NAMESPACE",
        group=le,
    )
    add_duration_flag(
        parser,
        "--leader-election-lease-duration",
        default=_as_float(values["leader_election_lease_duration"]),
        help="how long non-leaders wait before taking over a Lease that is not renewed",
        group=le,
    )
    add_duration_flag(
        parser,
        "--leader-election-renew-deadline",
        default=_as_float(values["leader_election_renew_deadline"]),
        help="how long the leader keeps retrying to renew before giving up leadership",
        group=le,
    )
    add_duration_flag(
        parser,
        "--leader-election-retry-period",
        default=_as_float(values["leader_election_retry_period"]),
        help="how long to wait between attempts to acquire or renew the Lease",
        group=le,
    )

    http = parser.add_argument_group("HTTP endpoint")
    add_flag(
        parser,
        "--http-endpoint",
        default=values["http_endpoint"],
        type=_http_address_or_empty,
        help="TCP address (e.g. :8080) of the HTTP server for metrics (--metrics-path), "
        "/healthz and /readyz; empty disables it. Only one of --metrics-address and "
        "--http-endpoint can be set",
        metavar="ADDRESS",
        group=http,
    )
    add_flag(
        parser,
        "--metrics-address",
        default=values["metrics_address"],
        type=_http_address_or_empty,
        help="(deprecated: use --http-endpoint) TCP address (e.g. :8080) of an HTTP server for "
        "metrics only; empty disables it",
        metavar="ADDRESS",
        group=http,
    )
    add_flag(
        parser,
        "--metrics-path",
        default=values["metrics_path"],
        type=_metrics_path,
        help="HTTP path where Prometheus metrics are served",
        metavar="PATH",
        group=http,
    )

    proc = parser.add_argument_group("process")
    add_flag(
        parser,
        "--log-format",
        default=values["log_format"],
        type=_choice(LOG_FORMATS),
        help="log output: json (one JSON object per line), console (for humans), or auto "
        "(console when the log stream is a terminal, json otherwise)",
        metavar="{" + ",".join(LOG_FORMATS) + "}",
        group=proc,
    )
    add_flag(
        parser,
        "--log-level",
        default=values["log_level"],
        type=_choice(LOG_LEVELS),
        help="lowest level logged",
        metavar="{" + ",".join(LOG_LEVELS) + "}",
        group=proc,
    )
    add_flag(
        parser,
        "--v",
        default=None,
        type=_non_negative_int,
        help=f"klog's verbosity, accepted for drop-in use with upstream manifests: "
        f"{KLOG_DEBUG_VERBOSITY} or more logs at debug, less leaves --log-level as it is",
        metavar="N",
        default_text="unset",
        group=proc,
        aliases=("-v",),
    )
    add_flag(
        parser,
        "--worker-threads",
        default=int(_as_float(values["worker_threads"])),
        type=_positive_int,
        help="number of concurrent workers processing the controller's queue",
        metavar="N",
        group=proc,
    )
    add_duration_flag(
        parser,
        "--shutdown-grace-period",
        default=_as_float(values["shutdown_grace_period"]),
        help="after SIGTERM/SIGINT, how long in-flight operations may take before they are "
        "cancelled (a second signal cancels them at once)",
        group=proc,
    )
    return parser


def _as_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------------------------
# The parsed options


class LeaderElectionFields(TypedDict):
    """The leader-election fields every controller's options share
    (``ProvisionControllerOptions``, ``AttachControllerOptions``, ``ResizeControllerOptions``):
    ``Options(..., **options.leader_election_fields())``."""

    leader_election: bool
    leader_election_namespace: str
    lease_duration: float
    renew_deadline: float
    retry_period: float


@dataclass(frozen=True)
class CommonOptions:
    """The common flags, parsed and checked. Durations are seconds.

    Build it with :meth:`from_namespace` (or :func:`parse_common`, which also turns a
    :class:`ValueError` into a usage error).
    """

    kubeconfig: str | None = None
    leader_election: bool = False
    leader_election_namespace: str = ""
    leader_election_lease_duration: float = 15.0
    leader_election_renew_deadline: float = 10.0
    leader_election_retry_period: float = 2.0
    kube_api_qps: float = 5.0
    kube_api_burst: int = 10
    http_endpoint: str = ""
    metrics_address: str = ""
    metrics_path: str = "/metrics"
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    worker_threads: int = 4
    shutdown_grace_period: float = 30.0
    v: int | None = None
    """klog's verbosity as given (``--v``); already folded into :attr:`log_level` by
    :meth:`from_namespace`."""

    def __post_init__(self) -> None:
        if self.http_endpoint and self.metrics_address:
            raise ValueError("only one of --metrics-address and --http-endpoint can be set")
        if self.worker_threads < 1:
            raise ValueError(f"--worker-threads must be at least 1, got {self.worker_threads}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
        if 0 < self.kube_api_qps < math.inf and self.kube_api_burst < 1:
            raise ValueError("--kube-api-burst must be at least 1 when --kube-api-qps is set")
        if self.leader_election:
            # client-go's NewLeaderElector checks the same relations (JitterFactor is 1.2).
            if self.leader_election_lease_duration <= self.leader_election_renew_deadline:
                raise ValueError(
                    "--leader-election-lease-duration must be greater than "
                    "--leader-election-renew-deadline"
                )
            if self.leader_election_renew_deadline <= 1.2 * self.leader_election_retry_period:
                raise ValueError(
                    "--leader-election-renew-deadline must be greater than 1.2 x "
                    "--leader-election-retry-period"
                )
            if self.leader_election_retry_period <= 0:
                raise ValueError("--leader-election-retry-period must be positive")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> CommonOptions:
        """Pick the common flags out of a namespace parsed by :func:`common_parser` (extra
        entry-point flags are ignored). Raises :class:`ValueError` for inconsistent values.

        ``--v`` of :data:`KLOG_DEBUG_VERBOSITY` or more makes the level debug."""
        v = getattr(ns, "v", None)
        log_level = ns.log_level
        if v is not None and v >= KLOG_DEBUG_VERBOSITY:
            log_level = "debug"
        return cls(
            kubeconfig=ns.kubeconfig or None,
            leader_election=bool(ns.leader_election),
            leader_election_namespace=ns.leader_election_namespace or "",
            leader_election_lease_duration=float(ns.leader_election_lease_duration),
            leader_election_renew_deadline=float(ns.leader_election_renew_deadline),
            leader_election_retry_period=float(ns.leader_election_retry_period),
            kube_api_qps=float(ns.kube_api_qps),
            kube_api_burst=int(ns.kube_api_burst),
            http_endpoint=ns.http_endpoint,
            metrics_address=ns.metrics_address,
            metrics_path=ns.metrics_path,
            log_format=ns.log_format,
            log_level=log_level,
            worker_threads=int(ns.worker_threads),
            shutdown_grace_period=float(ns.shutdown_grace_period),
            v=None if v is None else int(v),
        )

    @property
    def http_address(self) -> HttpAddress | None:
        """Where the HTTP server listens (``--http-endpoint`` or ``--metrics-address``), or
        ``None`` when it is off."""
        text = self.http_endpoint or self.metrics_address
        return parse_http_address(text) if text else None

    @property
    def serve_health(self) -> bool:
        """Whether ``/healthz`` and ``/readyz`` are served: only with ``--http-endpoint``, as in
        the CSI sidecars, where the deprecated ``--metrics-address`` serves metrics alone."""
        return bool(self.http_endpoint)

    def client_settings(self) -> ClientSettings:
        """The API client settings these flags ask for."""
        from pyprovlib.kube.config import ClientSettings

        return ClientSettings(
            kubeconfig=self.kubeconfig, qps=self.kube_api_qps, burst=self.kube_api_burst
        )

    def resolved_leader_election_namespace(self) -> str:
        """The Lease's namespace: the flag (or its environment variables), else the service
        account's namespace when running in a pod, else ``default`` — csi-lib-utils' order."""
        if self.leader_election_namespace:
            return self.leader_election_namespace
        try:
            text = _SERVICE_ACCOUNT_NAMESPACE_FILE.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        return text or "default"

    def leader_election_fields(self) -> LeaderElectionFields:
        """These flags as the leader-election fields of a controller's options (the namespace
        resolved as :meth:`resolved_leader_election_namespace` does)."""
        return LeaderElectionFields(
            leader_election=self.leader_election,
            leader_election_namespace=self.resolved_leader_election_namespace(),
            lease_duration=self.leader_election_lease_duration,
            renew_deadline=self.leader_election_renew_deadline,
            retry_period=self.leader_election_retry_period,
        )

    def leader_election_config(self, lease_name: str) -> LeaderElectionConfig:
        """The leader election settings these flags ask for, for a Lease named ``lease_name``."""
        from pyprovlib.kube.leaderelection import LeaderElectionConfig

        return LeaderElectionConfig(
            lease_name=lease_name,
            namespace=self.resolved_leader_election_namespace(),
            lease_duration=self.leader_election_lease_duration,
            renew_deadline=self.leader_election_renew_deadline,
            retry_period=self.leader_election_retry_period,
        )


def parse_common(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> tuple[CommonOptions, argparse.Namespace]:
    """Parse ``argv`` (default ``sys.argv[1:]``) with ``parser``; return the common options and
    the whole namespace (the entry point's own flags included). Usage errors exit with status
    2 after printing the usage, like any argparse error."""
    ns = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        options = CommonOptions.from_namespace(ns)
    except ValueError as err:
        parser.error(str(err))
    return options, ns
