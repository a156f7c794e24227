"""The three CSI sidecars in one process, ``python -m pyprovlib.csi``: the provisioner, attacher
and resizer controllers over one CSI connection, one shared informer factory (one LIST+WATCH
per resource) and one leader-election Lease. Not in upstream, where each sidecar is its own
container with its own connection, informers and Lease.

Flags are the union of the three sidecars' (``python -m pyprovlib.csi.provisioner``,
``.attacher``, ``.resizer``), read by each sidecar's own parser: a flag given on the command
line (or in the environment) applies to every enabled controller that has it, and a flag not
given keeps each controller's own sidecar default (``--timeout``: provisioner 10s, attacher
15s, resizer 10s). ``--controllers`` picks the controllers to run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import textwrap
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient
from prometheus_client import REGISTRY

from pyprovlib._logging import get_logger
from pyprovlib.controller._attach import sanitize_driver_name
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.csi._connection import (
    ConnectionOptions,
    CSIConnection,
    CSIMetrics,
    default_csi_metrics,
)
from pyprovlib.csi._controller_group import ControllerGroup, GroupOptions
from pyprovlib.csi._sidecar_controller import check_csi_address
from pyprovlib.csi.attacher import _main as attacher
from pyprovlib.csi.attacher._options import parser as attacher_parser
from pyprovlib.csi.provisioner._capacity import CapacitySetup, resolve_capacity
from pyprovlib.csi.provisioner._main import (
    DriverUnsupportedError,
    build_controller,
    find_local_node,
)
from pyprovlib.csi.provisioner._node_deployment import NodeDeploymentError
from pyprovlib.csi.provisioner._options import build_parser as provisioner_parser
from pyprovlib.csi.resizer import _main as resizer
from pyprovlib.csi.resizer._controller import DriverCannotExpandError
from pyprovlib.csi.resizer._options import parser as resizer_parser
from pyprovlib.kube._config import new_client
from pyprovlib.kube._informer import SharedInformerFactory, strip_managed_fields
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.runtime import (
    CommonOptions,
    Controller,
    RuntimeArgumentParser,
    RuntimeContext,
    add_flag,
    run,
)
from pyprovlib.runtime._flag_parser import ENV_PREFIX, add_version_flag
from pyprovlib.runtime._flag_values import format_duration

__all__ = [
    "CONTROLLERS",
    "LEASE_NAME_PREFIX",
    "CSIControllers",
    "CombinedArgumentParser",
    "build",
    "build_parser",
    "lease_name",
    "main",
]

PROG: Final = "python -m pyprovlib.csi"
USAGE: Final = f"{PROG} [--controllers LIST] [flags of the three sidecars]"

CONTROLLERS: Final = ("provisioner", "attacher", "resizer")
"""The controllers ``--controllers`` can name, in the order they are built."""

LEASE_NAME_PREFIX: Final = "pyprovlib-csi-"
"""The one Lease is ``pyprovlib-csi-<sanitized driver name>``: none of the three sidecars'
Lease names, so a process running all three never passes for a lone sidecar (or the
reverse) while both run during a migration."""

log = get_logger(__name__)


def lease_name(driver: str) -> str:
    """The leader election Lease of the combined process for ``driver``."""
    return LEASE_NAME_PREFIX + sanitize_driver_name(driver)


def _sidecar_parsers() -> dict[str, RuntimeArgumentParser]:
    # Each sidecar's own parser, unchanged: the one place its flags and defaults are defined.
    return {
        "provisioner": provisioner_parser(),
        "attacher": attacher_parser(),
        "resizer": resizer_parser(),
    }


def _controllers(text: str) -> tuple[str, ...]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in CONTROLLERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown controller {unknown[0]!r}: choose from {', '.join(CONTROLLERS)}"
        )
    if not names:
        raise argparse.ArgumentTypeError(
            f"name at least one controller of {', '.join(CONTROLLERS)}"
        )
    return tuple(name for name in CONTROLLERS if name in names)


def _show(value: object) -> str:
    if isinstance(value, float):
        return format_duration(value)  # the only float flags that differ are durations
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _differing_defaults(parsers: Mapping[str, RuntimeArgumentParser]) -> list[str]:
    """One line per flag that several sidecars have with different defaults."""
    dests: dict[str, None] = {}
    for parser in parsers.values():
        dests.update(dict.fromkeys(parser.env_bindings))
    lines = []
    for dest in dests:
        defaults = {
            name: parser.get_default(dest)
            for name, parser in parsers.items()
            if dest in parser.env_bindings
        }
        if len(defaults) > 1 and len({repr(v) for v in defaults.values()}) > 1:
            shown = ", ".join(f"{name} {_show(value)}" for name, value in defaults.items())
            lines.append(f"  --{dest.replace('_', '-')}: {shown}")
    return lines


def _sections(help_text: str) -> list[tuple[str, str]]:
    """The titled sections of an argparse help text (``title:`` then its lines), in order."""
    sections = []
    for chunk in help_text.split("\n\n"):
        first, _, _rest = chunk.partition("\n")
        if first.endswith(":") and not first.startswith((" ", "usage:")):
            sections.append((first[:-1], chunk.rstrip("\n")))
    return sections


class CombinedArgumentParser(RuntimeArgumentParser):
    """The union of the three sidecars' flags plus ``--controllers``.

    Each sidecar's own parser reads the command line (and the environment), ignoring the
    flags it does not have, so every controller gets exactly the values its sidecar would
    have; an argument that none of them (nor ``--controllers``) takes is a usage error. The
    namespace holds ``controllers`` (the enabled ones, in :data:`CONTROLLERS` order),
    ``sidecar_args`` (each sidecar's namespace) and, for the process-wide flags (API client,
    HTTP endpoint, logging, the one Lease), the values of the first enabled controller's
    sidecar. ``--help`` lists the sidecars' flags, a shared flag once per sidecar whose
    default differs.
    """

    def __init__(self) -> None:
        self.sidecars = _sidecar_parsers()
        for parser in self.sidecars.values():
            # Its errors name this program and show this usage.
            parser.prog = PROG
            parser.usage = USAGE
        differing = _differing_defaults(self.sidecars)
        super().__init__(
            prog=PROG,
            usage=USAGE,
            env_prefix=ENV_PREFIX,
            description="Runs the CSI provisioner, attacher and resizer controllers in one "
            "process, over one CSI connection, one set of informers and one leader-election "
            "Lease (instead of the three sidecars external-provisioner, external-attacher and "
            "external-resizer).",
            epilog=textwrap.fill(
                "Every flag of the three sidecars is accepted. A flag that is given applies to "
                "every enabled controller that has it; one that is not keeps each controller's "
                "own sidecar default. Process-wide flags (Kubernetes API, HTTP endpoint, "
                f"logging, leader election: one Lease, {LEASE_NAME_PREFIX}<driver>) take the "
                "first enabled controller's. Flags whose defaults differ:",
                width=79,
            )
            + "\n"
            + "\n".join(differing),
            allow_abbrev=False,
        )
        add_version_flag(self)
        group = self.add_argument_group("one process")
        add_flag(
            self,
            "--controllers",
            default=CONTROLLERS,
            type=_controllers,
            help="comma-separated controllers to run, of " + ", ".join(CONTROLLERS),
            metavar="LIST",
            default_text=",".join(CONTROLLERS),
            group=group,
        )

    def format_help(self) -> str:
        """This program's own help, with the sidecars' flag sections before the epilog."""
        own = super().format_help()
        epilog = self.epilog or ""
        head = own[: own.rindex(epilog)] if epilog and epilog in own else own
        shown: set[str] = set()
        parts = [head.rstrip("\n")]
        for parser in self.sidecars.values():
            for title, text in _sections(parser.format_help()):
                if title in shown or title in ("options", "positional arguments"):
                    continue
                shown.add(title)
                parts.append(text)
        parts.append(epilog)
        return "\n\n".join(parts) + "\n"

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        ns, leftover = super().parse_known_args(argv, namespace)
        unknown: Counter[str] = Counter(leftover)
        per_sidecar: dict[str, argparse.Namespace] = {}
        for name, parser in self.sidecars.items():
            # The other sidecars' flags (and --controllers) are unknown to this one: ignored.
            per_sidecar[name], extras = parser.parse_known_args(argv)
            unknown &= Counter(extras)
        if unknown:
            # Taken by none of the parsers: reported in their order on the command line.
            return ns, [arg for arg in leftover if unknown[arg] > 0]
        enabled: tuple[str, ...] = ns.controllers
        for key, value in vars(per_sidecar[enabled[0]]).items():
            setattr(ns, key, value)
        ns.controllers = enabled
        ns.sidecar_args = per_sidecar
        return ns, []


def build_parser() -> CombinedArgumentParser:
    """The parser of ``python -m pyprovlib.csi``."""
    return CombinedArgumentParser()


class CSIControllers(ControllerGroup):
    """The enabled controllers, each built without leader election, run together under one
    Lease (when ``options.leader_election``) over one connection and one informer factory;
    the runtime's Controller.

    While leading (or always, without leader election) it starts the shared informers, runs
    ``background`` tasks beside the controllers (none from :func:`build`: the provisioner's
    cloning-protection controller and sweep run beside its own workers) and runs the
    controllers as a :class:`~pyprovlib.runtime.CompositeController`. A lost connection
    (with ``exit_on_connection_loss``) or Lease ends :meth:`run` with an error, so the process
    exits and is restarted, as each sidecar would.

    Readiness: a standby (leader election on, another replica seen holding the Lease) is ready
    — it runs and can take over; the leader is ready once every controller's caches synced.
    """

    def __init__(
        self,
        client: ApiClient,
        connection: CSIConnection,
        informer_factory: SharedInformerFactory,
        controllers: Mapping[str, Controller],
        options: GroupOptions,
        *,
        lease: str,
        background: Sequence[Callable[[], Awaitable[None]]] = (),
        clients: Sequence[ApiClient] = (),
    ) -> None:
        super().__init__(
            client,
            informer_factory,
            controllers,
            options,
            role="CSI controllers",
            lease=lease,
            log=log.bind(driver=connection.driver_name),
            background=background,
        )
        self.connection = connection
        # The controllers' own API clients (one API budget each, as each sidecar has):
        # closed when run() ends.
        self._clients = tuple(clients)

    async def run(self) -> None:
        """Run until stopped, the connection is lost, or the Lease is lost."""
        with self._running():
            self._log.info(
                "starting CSI controllers",
                controllers=list(self.controllers),
                lease=self.lease if self._lifecycle_options.leader_election else None,
            )
            failure: BaseException | None = None
            try:
                async with asyncio.TaskGroup() as tg:
                    monitor = tg.create_task(self.connection.monitor(), name="csi-monitor")
                    try:
                        await self._run_elected()
                    except Exception as err:  # re-raised as is below, not as a group
                        failure = err
                    monitor.cancel()
            except BaseExceptionGroup as group:
                # The monitor failed (the connection is lost): that is the error to report.
                failure = failure or group.exceptions[0]
            finally:
                self.connection.close()
                for client in self._clients:
                    await client.close()
            if failure is not None:
                raise failure
        self._log.info("CSI controllers stopped")

    def healthy(self) -> bool:
        """False when a controller failed, the Lease was lost or the connection is lost."""
        return super().healthy() and not self.connection.lost


def _view(ctx: RuntimeContext, args: argparse.Namespace) -> RuntimeContext:
    """``ctx`` as one sidecar's factory would see it: its flags, and no leader election of its
    own (the combined process holds the one Lease)."""
    options = dataclasses.replace(CommonOptions.from_namespace(args), leader_election=False)
    return dataclasses.replace(ctx, args=args, options=options)


async def build(ctx: RuntimeContext) -> CSIControllers:
    """Connect to the driver once (waiting for it, as every sidecar does), then build the
    enabled controllers on that connection and one informer factory."""
    enabled: tuple[str, ...] = ctx.args.controllers
    sidecar_args: dict[str, argparse.Namespace] = ctx.args.sidecar_args
    if sidecar_args["provisioner"].node_deployment and enabled != ("provisioner",):
        # Unelected on every node, the attacher and the resizer would each act on every object.
        raise NodeDeploymentError(
            "--node-deployment runs on every node without leader election: use "
            "--controllers=provisioner there, and run the attacher and resizer elsewhere "
            "with leader election"
        )
    primary = sidecar_args[enabled[0]]
    # --enable-capacity: $NAMESPACE, the capacity controller's own client (its writes have
    # the --kube-api-capacity-qps/-burst budget, as in the sidecar) and the owner, before
    # waiting for the driver.
    capacity = (
        await resolve_capacity(_view(ctx, sidecar_args["provisioner"]))
        if "provisioner" in enabled
        else None
    )
    clients: list[ApiClient] = [] if capacity is None else [capacity.client]
    try:
        connection = await _connect(ctx, primary, sidecar_args["provisioner"])
    except BaseException:
        for opened in clients:
            await opened.close()
        raise
    try:
        # One factory: one resync period for every handler, the shortest asked for.
        resyncs = {
            "provisioner": ProvisionControllerOptions().resync_period,
            "attacher": sidecar_args["attacher"].resync,
            "resizer": sidecar_args["resizer"].resync_period,
        }
        resync = min(resyncs[name] for name in enabled)
        factory = SharedInformerFactory(
            ctx.api_client, resync_period=resync, transform=strip_managed_fields
        )
        controllers: dict[str, Controller] = {}
        for name in enabled:
            view = _view(ctx, sidecar_args[name])
            # Each controller writes with the API budget its sidecar has (--kube-api-qps and
            # --kube-api-burst apply to each of the three Go sidecars): a client and a limiter
            # of its own. The shared informers and the Lease keep the runtime's client.
            view = dataclasses.replace(view, api_client=await _own_client(view, clients))
            try:
                controllers.update(
                    await _build_sidecar(
                        name, view, ctx, connection, factory, capacity=capacity, clients=clients
                    )
                )
            except (DriverUnsupportedError, DriverCannotExpandError) as err:
                others = ",".join(n for n in enabled if n != name)
                hint = f"--controllers={others}" if others else "another driver"
                raise type(err)(f"{err}; without the {name}: {hint}") from None
        combined = CSIControllers(
            ctx.api_client,
            connection,
            factory,
            controllers,
            GroupOptions(resync_period=resync, **ctx.options.leader_election_fields()),
            lease=lease_name(connection.driver_name),
            clients=clients,
        )
    except BaseException:
        connection.close()
        for opened in clients:
            await opened.close()
        raise
    ctx.log.info(
        "CSI controllers in one process",
        driver=connection.driver_name,
        controllers=list(enabled),
        csi_address=primary.csi_address,
        resync=format_duration(resync),
    )
    return combined


async def _connect(
    ctx: RuntimeContext, primary: argparse.Namespace, provisioner_args: argparse.Namespace
) -> CSIConnection:
    """The one connection to the driver, with the first enabled sidecar's address and timeout."""
    metrics: CSIMetrics = (
        default_csi_metrics() if ctx.registry is REGISTRY else CSIMetrics(ctx.registry)
    )
    connection_options = ConnectionOptions(
        # The connection's default call timeout; the attacher and resizer pass their own.
        timeout=primary.timeout,
        exit_on_connection_loss=provisioner_args.exit_on_connection_loss,
    )
    check_csi_address(primary.csi_address)
    return await CSIConnection.open(primary.csi_address, connection_options, metrics=metrics)


async def _build_sidecar(
    name: str,
    view: RuntimeContext,
    ctx: RuntimeContext,
    connection: CSIConnection,
    factory: SharedInformerFactory,
    *,
    capacity: CapacitySetup | None,
    clients: list[ApiClient],
) -> dict[str, Controller]:
    """The controllers of the sidecar ``name``, as its own process builds them, on the shared
    connection and informer factory."""
    if name == "provisioner":
        # With its cloning-protection controller, snapshot-protection sweep and
        # (--enable-capacity) capacity controller beside it, under this process's Lease (none
        # with --node-deployment).
        node = await find_local_node(view, connection, leader_election=ctx.options.leader_election)
        controller, _, _ = build_controller(view, connection, factory, node=node, capacity=capacity)
        return {name: controller}
    if name == "attacher":
        return {name: attacher.build_controller(view, connection, factory)}
    # The resize and modify controllers, as the resizer sidecar has them; the modify controller
    # with a client and budget of its own too.
    modify_view = dataclasses.replace(view, api_client=await _own_client(view, clients))
    return resizer.build_controllers(view, connection, factory, modify_ctx=modify_view)


async def _own_client(view: RuntimeContext, clients: list[ApiClient]) -> ApiClient:
    """A client with a limiter of its own at ``view``'s --kube-api-qps/--kube-api-burst,
    added to ``clients`` (closed with the process's controllers)."""
    settings = view.options.client_settings()
    client = await new_client(settings, limiter=TokenBucket(settings.qps, settings.burst))
    clients.append(client)
    return client


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyprovlib.csi``: the provisioner, attacher and resizer in one process."""
    return run(build, argv=argv, parser=build_parser())
