"""An argparse parser whose flags may also come from environment variables, and the helpers
that add Go-style flags to it.

As in Go's ``flag`` package, a flag is only ever recognised by its full name: argparse's
prefix matching is off (``--time=1s`` is an error, not ``--timeout``). Every flag added with
:func:`add_flag`, :func:`add_bool_flag` or :func:`add_duration_flag` can also be set from an
environment variable (``PYPROVLIB_<FLAG_NAME>``, plus conventional names such as
``POD_NAMESPACE``); a flag on the command line wins over the environment, which wins over the
default. The upstream sidecars' flags that pyprovlib does not implement
(:data:`UNSUPPORTED_UPSTREAM_FLAGS`) are rejected by name in one line.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from pyprovlib._version import __version__
from pyprovlib.runtime.flag_values import format_duration, parse_bool, parse_duration

__all__ = [
    "ENV_PREFIX",
    "UNSUPPORTED_UPSTREAM_FLAGS",
    "RuntimeArgumentParser",
    "add_bool_flag",
    "add_duration_flag",
    "add_flag",
    "add_version_flag",
    "env_name",
]

ENV_PREFIX = "PYPROVLIB_"
"""Prefix of the environment variable that mirrors each flag (``--log-level`` →
``PYPROVLIB_LOG_LEVEL``)."""

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

_N = TypeVar("_N")


def env_name(flag: str) -> str:
    """The environment variable mirroring ``flag``:
    ``--kube-api-qps`` → ``PYPROVLIB_KUBE_API_QPS``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


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


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print the program's name and pyprovlib's version, and exit."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__}",
        help="print the version and exit",
    )


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
