"""The flags every pyprovlib entry point shares (:func:`common_parser`) and their parsed,
checked form (:class:`CommonOptions`).

The flag names, defaults and value syntax follow the Kubernetes CSI sidecars
(external-provisioner, external-attacher): ``--leader-election=true``, Go durations such as
``15s`` or ``1m30s``, ``--http-endpoint=:8080``. Every flag can also be set from an
environment variable (the program's prefix and the flag's name: ``MY_PROVISIONER_LOG_LEVEL``
for ``my-provisioner``, ``PYPROVLIB_LOG_LEVEL`` for pyprovlib's entry points; plus a few
conventional names such as ``POD_NAMESPACE``); a flag on the command line wins over the
environment, which wins over the default. klog's ``-v N`` / ``--v=N`` is accepted (see
:data:`KLOG_DEBUG_VERBOSITY`).

The value syntax lives in :mod:`pyprovlib.runtime._flag_values`, the environment-aware parser
in :mod:`pyprovlib.runtime._flag_parser`; their names are re-exported here. A controller's
options are built from :class:`CommonOptions` by :mod:`pyprovlib.runtime._controller_options`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

from pyprovlib.controller._renamed import renamed_field
from pyprovlib.runtime._flag_parser import (
    ENV_PREFIX,
    UNSUPPORTED_UPSTREAM_FLAGS,
    RuntimeArgumentParser,
    add_bool_flag,
    add_duration_flag,
    add_flag,
    add_version_flag,
    env_name,
    env_prefix_for,
    version_text,
)
from pyprovlib.runtime._flag_values import (
    HttpAddress,
    format_duration,
    parse_bool,
    parse_duration,
    parse_http_address,
    parse_non_negative_int,
    parse_positive_int,
    parse_qps,
)

if TYPE_CHECKING:
    from pyprovlib.kube._config import ClientSettings
    from pyprovlib.kube._leaderelection import LeaderElectionConfig

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
    "add_logging_flags",
    "common_parser",
    "env_name",
    "env_prefix_for",
    "format_duration",
    "parse_bool",
    "parse_common",
    "parse_duration",
    "parse_http_address",
    "version_text",
]

LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")

KLOG_DEBUG_VERBOSITY = 4
"""klog's ``-v``/``--v`` level from which pyprovlib logs at debug. Kubernetes' logging
conventions call V(4) "debug level" and V(5) "trace level"; levels 0-3 are all info messages
of more or less detail, and a verbosity never hides warnings or errors. So ``--v`` only ever
makes the log more verbose: ``--v=4`` and above set the level to debug, ``--v=0`` to ``--v=3``
leave ``--log-level`` as it is (info unless set)."""


def _http_address_or_empty(text: str) -> str:
    # Validated now so a typo fails at startup, kept as text so "" can mean "off".
    if text.strip():
        parse_http_address(text)
    return text.strip()


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


def add_logging_flags(
    parser: RuntimeArgumentParser,
    group: argparse._ArgumentGroup | None = None,
    *,
    log_format: str = "auto",
    log_level: str = "info",
) -> None:
    """``--log-format`` and ``--log-level``, the two arguments of
    :func:`~pyprovlib.runtime._logging.configure_logging`: the logging flags of every pyprovlib
    program, whether its parser starts from :func:`common_parser` or not."""
    add_flag(
        parser,
        "--log-format",
        default=log_format,
        type=_choice(LOG_FORMATS),
        help="log output: json (one JSON object per line), console (for humans), or auto "
        "(console when the log stream is a terminal, json otherwise)",
        metavar="{" + ",".join(LOG_FORMATS) + "}",
        group=group,
    )
    add_flag(
        parser,
        "--log-level",
        default=log_level,
        type=_choice(LOG_LEVELS),
        help="lowest level logged",
        metavar="{" + ",".join(LOG_LEVELS) + "}",
        group=group,
    )


def _common_defaults() -> dict[str, object]:
    # The flags' defaults are CommonOptions' field defaults, written once there. --v has none
    # to override: unset means "leave --log-level as it is".
    # Keyed by the flags' destinations: the field ``workers`` is set by --worker-threads.
    dest = {"workers": "worker_threads"}
    return {
        dest.get(f.name, f.name): f.default
        for f in dataclasses.fields(CommonOptions)
        if f.name != "v"
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
    version: str | None = None,
    env_prefix: str | None = None,
    defaults: Mapping[str, object] | None = None,
) -> RuntimeArgumentParser:
    """The flags every pyprovlib entry point shares, ready for the entry point to extend.

    ``prog`` is the program's name (usage lines, ``--version``, the logger, the help section
    of flags added without a group); ``version`` its own version, which ``--version`` prints
    beside pyprovlib's; ``env_prefix`` the start of every flag's environment variable,
    by default made from ``prog`` (``my-provisioner`` → ``MY_PROVISIONER_KUBECONFIG``,
    :func:`env_prefix_for`). ``defaults`` overrides the built-in defaults by destination name
    (``worker_threads``, ``leader_election_retry_period``, ...); durations may be given as
    seconds or Go duration strings. The overrides show in ``--help``. Read the result with
    :func:`parse_common`.
    """
    values = _common_defaults()
    for key, value in (defaults or {}).items():
        if key not in values:
            raise ValueError(f"unknown default {key!r}; known: {', '.join(sorted(values))}")
        values[key] = _seconds(key, value) if key in _DURATION_DESTS else value

    parser = RuntimeArgumentParser(
        prog=prog, description=description, env_prefix=env_prefix, version=version
    )
    add_version_flag(parser)

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
        type=parse_qps,
        help="queries per second to the API server (client-side limit; 0 disables it)",
        metavar="QPS",
        group=kube,
    )
    add_flag(
        parser,
        "--kube-api-burst",
        default=int(_as_float(values["kube_api_burst"])),
        type=parse_non_negative_int,
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
    # The Lease timings (client-go's LeaderElectionConfig), each a duration flag.
    for flag, help_text in (
        (
            "--leader-election-lease-duration",
            "how long non-leaders wait before taking over a Lease that is not renewed",
        ),
        (
            "--leader-election-renew-deadline",
            "how long the leader keeps retrying to renew before giving up leadership",
        ),
        (
            "--leader-election-retry-period",
            "how long to wait between attempts to acquire or renew the Lease",
        ),
    ):
        dest = flag.removeprefix("--").replace("-", "_")
        add_duration_flag(parser, flag, default=_as_float(values[dest]), help=help_text, group=le)

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
    add_logging_flags(
        parser,
        proc,
        log_format=str(values["log_format"]),
        log_level=str(values["log_level"]),
    )
    add_flag(
        parser,
        "--v",
        default=None,
        type=parse_non_negative_int,
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
        type=parse_positive_int,
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


@renamed_field("worker_threads", "workers")
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
    workers: int = 4
    """The worker count (``--worker-threads``; ``worker_threads``, its former name, still
    works with a DeprecationWarning)."""
    shutdown_grace_period: float = 30.0
    v: int | None = None
    """klog's verbosity as given (``--v``); already folded into :attr:`log_level` by
    :meth:`from_namespace`."""

    def __post_init__(self) -> None:
        if self.http_endpoint and self.metrics_address:
            raise ValueError("only one of --metrics-address and --http-endpoint can be set")
        if self.workers < 1:
            raise ValueError(f"--worker-threads must be at least 1, got {self.workers}")
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
            workers=int(ns.worker_threads),
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
        from pyprovlib.kube._config import ClientSettings

        return ClientSettings(
            kubeconfig=self.kubeconfig, qps=self.kube_api_qps, burst=self.kube_api_burst
        )

    def resolved_leader_election_namespace(self) -> str:
        """The Lease's namespace: the flag (or its environment variables), else the service
        account's namespace when running in a pod, else ``default`` — csi-lib-utils' order."""
        from pyprovlib.kube._config import service_account_namespace

        return self.leader_election_namespace or service_account_namespace() or "default"

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
        from pyprovlib.kube._leaderelection import LeaderElectionConfig

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
