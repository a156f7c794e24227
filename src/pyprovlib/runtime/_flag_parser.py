"""An argparse parser whose flags may also come from environment variables, and the helpers
that add Go-style flags to it.

As in Go's ``flag`` package, a flag is only ever recognised by its full name: argparse's
prefix matching is off (``--time=1s`` is an error, not ``--timeout``). Every flag added with
:func:`add_flag`, :func:`add_bool_flag` or :func:`add_duration_flag` can also be set from an
environment variable (``<PREFIX><FLAG_NAME>``, plus conventional names such as
``POD_NAMESPACE``); a flag on the command line wins over the environment, which wins over the
default. The prefix is the program's own (``MY_PROVISIONER_`` for ``my-provisioner``;
pyprovlib's entry points use :data:`ENV_PREFIX`). The upstream sidecars' flags that pyprovlib
does not implement (:data:`UNSUPPORTED_UPSTREAM_FLAGS`) are rejected by name in one line.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from pyprovlib._version import __version__
from pyprovlib.runtime._flag_values import format_duration, parse_bool, parse_duration

__all__ = [
    "ALWAYS_ON_FEATURE_GATES",
    "ENV_PREFIX",
    "UNSUPPORTED_UPSTREAM_FLAGS",
    "RuntimeArgumentParser",
    "add_bool_flag",
    "add_duration_flag",
    "add_flag",
    "add_version_flag",
    "env_name",
    "env_prefix_for",
    "version_text",
]

ENV_PREFIX = "PYPROVLIB_"
"""Prefix of the environment variables of pyprovlib's own entry points (``--log-level`` →
``PYPROVLIB_LOG_LEVEL``). A program of your own gets a prefix of its own
(:func:`env_prefix_for`)."""

_KLOG_FLAGS = (
    "klog flag: pyprovlib logs to stderr through structlog; use --log-level and --log-format"
)
_FEATURE_GATES = (
    "feature gates of the Go sidecars: pyprovlib has none to switch (Topology=true is "
    "accepted: topology is always on)"
)
UNSUPPORTED_UPSTREAM_FLAGS: Mapping[str, str] = {
    # external-provisioner
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

ALWAYS_ON_FEATURE_GATES: Mapping[str, str] = {
    "Topology": "topology is always on in pyprovlib (used whenever the CSI driver reports "
    "VOLUME_ACCESSIBILITY_CONSTRAINTS)",
}
"""Feature gates of the Go sidecars whose feature pyprovlib always has. Upstream manifests
commonly pass ``--feature-gates=Topology=true``; that is accepted (and changes nothing).
Turning one of these off, or naming any other gate, exits with status 2 and one line."""

_N = TypeVar("_N")


def env_name(flag: str, prefix: str = ENV_PREFIX) -> str:
    """The environment variable mirroring ``flag``:
    ``--kube-api-qps`` → ``PYPROVLIB_KUBE_API_QPS`` (``prefix`` + the flag's name)."""
    return prefix + flag.lstrip("-").replace("-", "_").upper()


def env_prefix_for(prog: str) -> str:
    """The environment prefix a program named ``prog`` gets unless it chooses one: its last
    word without ``.py``, upper case, every other character than a letter or digit an
    underscore, then an underscore (``my-provisioner`` → ``MY_PROVISIONER_``,
    ``python -m my.driver`` → ``MY_DRIVER_``)."""
    words = prog.split()
    name = os.path.basename(words[-1]) if words else ""
    name = name.removesuffix(".py")
    stem = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()
    if not stem:
        raise ValueError(f"cannot make an environment prefix from the program name {prog!r}")
    return stem + "_"


def _check_env_prefix(prefix: str) -> str:
    if not re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)?", prefix):
        raise ValueError(
            f"env_prefix {prefix!r} is not the start of an environment variable name "
            "(letters, digits and '_', not starting with a digit)"
        )
    return prefix


def version_text(prog: str, version: str | None) -> str:
    """What ``--version`` prints: the program, its version when it has one, and the pyprovlib
    it runs on (``my-provisioner 1.2.0 (pyprovlib 0.1.0)``)."""
    own = f"{prog} {version}" if version else prog
    return f"{own} (pyprovlib {__version__})"


@dataclass(frozen=True)
class _EnvBinding:
    dest: str
    flag: str
    names: tuple[str, ...]
    convert: Callable[[str], Any]


class RuntimeArgumentParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose flags may also come from the environment.

    Flags added with :func:`add_flag`, :func:`add_bool_flag` or :func:`add_duration_flag` are
    bound to environment variables named ``env_prefix`` + the flag's name (by default the
    program's own prefix, :func:`env_prefix_for`); the environment is read when arguments are
    parsed, so a flag on the command line wins over the environment, which wins over the
    default. An invalid environment value is reported like an invalid flag value (exit status
    2). ``version`` is the program's version, for ``--version`` and the start-up log line.
    """

    def __init__(
        self,
        *args: Any,
        env_prefix: str | None = None,
        version: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        # Go's flag package has no prefix matching: neither do we (--time is not --timeout).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.env_prefix = _check_env_prefix(
            env_prefix if env_prefix is not None else env_prefix_for(self.prog)
        )
        """The prefix of every flag's environment variable (``MY_PROVISIONER_``)."""
        self.version = version
        """The program's version (None: it has none of its own)."""
        self._env_bindings: list[_EnvBinding] = []
        self._own_group: argparse._ArgumentGroup | None = None
        self.environ: Mapping[str, str] | None = None
        """The environment to read; ``None`` means ``os.environ`` at parse time."""

    def own_group(self) -> argparse._ArgumentGroup:
        """The help section, titled with the program's name, that flags added without a
        ``group`` go to (after the common sections)."""
        if self._own_group is None:
            self._own_group = self.add_argument_group(self.prog)
        return self._own_group

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
        extras = self._accept_feature_gates(extras)
        self._reject_unsupported(extras)
        return parsed, extras

    def _accept_feature_gates(self, extras: list[str]) -> list[str]:
        """``extras`` without the ``--feature-gates`` flags that only switch on what pyprovlib
        always does (:data:`ALWAYS_ON_FEATURE_GATES`); any other gate ends the program with
        one line naming it."""
        kept: list[str] = []
        i = 0
        while i < len(extras):
            arg = extras[i]
            name, has_value, value = arg.partition("=")
            if name not in ("--feature-gates", "-feature-gates"):
                kept.append(arg)
                i += 1
                continue
            if not has_value and i + 1 < len(extras) and not extras[i + 1].startswith("-"):
                value = extras[i + 1]
                i += 1
            i += 1
            self._check_feature_gates(value)
        return kept

    def _check_feature_gates(self, value: str) -> None:
        for item in (part.strip() for part in value.split(",")):
            gate, _, setting = item.partition("=")
            if not item:
                continue
            why = ALWAYS_ON_FEATURE_GATES.get(gate.strip())
            if why is None:
                problem = (
                    f"--feature-gates names {gate.strip()!r}, a feature gate pyprovlib does not "
                    f"have ({', '.join(f'{g}=true' for g in ALWAYS_ON_FEATURE_GATES)} is "
                    "accepted, as always on); remove it"
                )
            else:
                try:
                    on = parse_bool(setting.strip())
                except (argparse.ArgumentTypeError, ValueError):
                    self.exit(
                        2,
                        f"{self.prog}: error: --feature-gates: {item!r} is not "
                        f"{gate.strip()}=true|false\n",
                    )
                if on:
                    continue
                problem = f"--feature-gates={item} cannot be honoured: {why}; remove it"
            self.exit(2, f"{self.prog}: error: {problem}\n")

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


def _env_names(
    parser: RuntimeArgumentParser,
    flag: str,
    env: Sequence[str] | None,
    extra_env: Sequence[str],
) -> tuple[str, ...]:
    names = [env_name(flag, parser.env_prefix)] if env is None else list(env)
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

    ``env`` replaces the default variable name (the parser's ``env_prefix`` + ``NAME``);
    ``extra_env`` adds lower-precedence names (e.g. ``POD_NAMESPACE``). ``--help`` shows the
    default and the variables, in ``group`` (default: the section named after the program,
    :meth:`RuntimeArgumentParser.own_group`). ``type`` converts both command-line and
    environment text. ``aliases`` are other spellings of the same flag (``-v`` for ``--v``).
    """
    names = _env_names(parser, flag, env, extra_env)
    dest = flag.lstrip("-").replace("-", "_")
    shown = default_text if default_text is not None else ("''" if default == "" else str(default))
    target = group if group is not None else parser.own_group()
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
    names = _env_names(parser, flag, env, extra_env)
    dest = flag.lstrip("-").replace("-", "_")
    target = group if group is not None else parser.own_group()
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


def add_version_flag(parser: argparse.ArgumentParser, version: str | None = None) -> None:
    """``--version``: print the program's name, ``version`` (default: the parser's
    ``version``, if it has one) and pyprovlib's version (:func:`version_text`), and exit."""
    if version is None:
        version = getattr(parser, "version", None)
    parser.add_argument(
        "--version",
        action="version",
        version=version_text(parser.prog, version),
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
