"""Storage capacity tracking in the CSI provisioner (``--enable-capacity``): GetCapacity as the
:class:`~pyprovlib.controller.CapacitySource`, and the wiring external-provisioner's
``cmd/csi-provisioner`` does — the namespace from ``$NAMESPACE``, the owner from ``$POD_NAME``
at ``--capacity-ownerref-level``, an API client of its own limited by
``--kube-api-capacity-qps``/``-burst`` (as upstream, whose capacity controller gets a second
clientset with those limits), and the controller run under the provisioner's Lease.

Differences from upstream, each on purpose:

- A driver without the GET_CAPACITY controller capability is refused at start with a message
  (upstream calls GetCapacity anyway and retries its Unimplemented answers forever).
- The empty segment (a driver without topology keys) is sent without ``accessible_topology``,
  as the CSI spec asks of a driver without VOLUME_ACCESSIBILITY_CONSTRAINTS (upstream sends an
  empty Topology).
- ``$POD_NAMESPACE`` is read when ``$NAMESPACE`` is not set.
- The objects are watched through the process's shared informers (upstream's namespaced
  informer factory runs on the capacity client): the capacity client only writes, and reads
  the owner at start.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyprovlib.controller._capacity import (
    DEFAULT_MANAGED_BY,
    Capacity,
    CapacityController,
    CapacityControllerOptions,
    FixedTopology,
    OwnerLookupError,
    Segment,
    lookup_owner,
)
from pyprovlib.csi._connection import CSIConnection
from pyprovlib.csi._proto.csi import v1
from pyprovlib.kube._config import LimitedApiClient, new_client
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.runtime import RuntimeContext, StartupError

__all__ = [
    "CSICapacitySource",
    "CapacitySetup",
    "build_capacity_controller",
    "capacity_client",
    "managed_by_for_node",
    "resolve_capacity",
]

_LABEL_MAX = 63  # a DNS-1035 label, the longest managed-by value upstream makes

_NAMESPACE_ENV = ("NAMESPACE", "POD_NAMESPACE")
_POD_NAME_ENV = "POD_NAME"


class CSICapacitySource:
    """GetCapacity with a class's parameters and a segment, each call bounded by ``timeout``
    seconds (``--timeout``). No volume capabilities are sent: upstream assumes capacity does
    not depend on them."""

    def __init__(self, connection: CSIConnection, timeout: float) -> None:
        self.connection = connection
        self.timeout = timeout

    async def get_capacity(self, parameters: Mapping[str, str], segment: Segment) -> Capacity:
        request = v1.GetCapacityRequest(parameters=dict(parameters))
        if segment:
            request.accessible_topology = v1.Topology(segments=dict(segment))
        response: v1.GetCapacityResponse = await self.connection.call(
            "/csi.v1.Controller/GetCapacity", request, call_timeout=self.timeout
        )
        return Capacity(response.available_capacity, response.maximum_volume_size)


@dataclass(frozen=True)
class CapacitySetup:
    """What ``--enable-capacity`` resolved before the controller is built: the namespace of the
    objects, their owner reference (None with ``--capacity-ownerref-level=-1``) and the
    controller's own API client, limited by ``--kube-api-capacity-qps``/``-burst``. Whoever
    runs the controller closes the client (:meth:`close`)."""

    namespace: str
    owner: Mapping[str, Any] | None
    client: LimitedApiClient

    async def close(self) -> None:
        """Close the capacity controller's API client."""
        await self.client.close()


async def capacity_client(ctx: RuntimeContext) -> LimitedApiClient:
    """The capacity controller's API client: the process's configuration, with a limiter of
    its own at ``--kube-api-capacity-qps``/``-burst`` (upstream's second clientset), so that
    capacity writes never spend the provisioner's ``--kube-api-qps`` budget nor wait for it."""
    args = ctx.args
    qps: float = args.kube_api_capacity_qps
    burst: int = args.kube_api_capacity_burst
    if 0 < qps < math.inf and burst < 1:
        raise StartupError(
            "--kube-api-capacity-burst must be at least 1 when --kube-api-capacity-qps is set "
            f"(got {burst} with {qps}); give a burst, or --kube-api-capacity-qps=0 for no limit"
        )
    settings = dataclasses.replace(ctx.options.client_settings(), qps=qps, burst=burst)
    return await new_client(settings, limiter=TokenBucket(qps, burst))


async def resolve_capacity(
    ctx: RuntimeContext, environ: Mapping[str, str] | None = None
) -> CapacitySetup | None:
    """With ``--enable-capacity``: the namespace from ``$NAMESPACE`` (or ``$POD_NAMESPACE``),
    the controller's own client (:func:`capacity_client`) and the owner found with it from
    ``$POD_NAME`` ``--capacity-ownerref-level`` levels up; None without. Raises
    :class:`~pyprovlib.runtime.StartupError` naming what is missing."""
    args = ctx.args
    if not getattr(args, "enable_capacity", False):
        return None
    env = os.environ if environ is None else environ
    namespace = next((env[name] for name in _NAMESPACE_ENV if env.get(name)), "")
    if not namespace:
        raise StartupError(
            "--enable-capacity needs the NAMESPACE environment variable (the namespace of the "
            "CSIStorageCapacity objects, usually the pod's: valueFrom.fieldRef "
            "metadata.namespace)"
        )
    level: int = args.capacity_ownerref_level
    pod = env.get(_POD_NAME_ENV, "")
    if level >= 0 and not pod:
        raise StartupError(
            "--enable-capacity needs the POD_NAME environment variable to find the owner of "
            "the CSIStorageCapacity objects (valueFrom.fieldRef metadata.name), or "
            "--capacity-ownerref-level=-1 for objects without owner"
        )
    client = await capacity_client(ctx)
    if level < 0:
        return CapacitySetup(namespace, None, client)
    try:
        owner = await lookup_owner(client, namespace, pod, level)
    except OwnerLookupError as err:
        await client.close()
        raise StartupError(f"--enable-capacity: {err}") from None
    except BaseException:
        await client.close()
        raise
    ctx.log.info(
        "owner of the CSIStorageCapacity objects",
        owner=f"{owner['apiVersion']}/{owner['kind']} {owner['name']}",
        namespace=namespace,
    )
    return CapacitySetup(namespace, owner, client)


def _fnv32a(text: str) -> str:
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{value:08x}"


def managed_by_for_node(node: str, base: str = DEFAULT_MANAGED_BY) -> str:
    """The ``csi.storage.k8s.io/managed-by`` value of the instance on ``node`` with
    ``--node-deployment`` (as upstream's ``getNameWithMaxLength``): ``<base>-<node>`` when that
    fits in 63 characters; else the base cut short, an 8-digit FNV-1a hash and the node name
    (``<base…>-<hash of base>-<node>``), or, for a node name too long for that, the base cut
    short and the hash of the whole name. Each instance then owns only its own objects."""
    name = f"{base}-{node}" if base else node
    if len(name) <= _LABEL_MAX:
        return name
    base_length = _LABEL_MAX - 10 - len(node)
    if base_length <= 0:
        prefix = base[: max(0, _LABEL_MAX - 9)]
        short = f"{prefix}-{_fnv32a(name)}" if prefix else _fnv32a(name)
        return short[:_LABEL_MAX]
    return f"{base[:base_length]}-{_fnv32a(base)}-{node}"


def build_capacity_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory,
    setup: CapacitySetup,
    *,
    node: str | None = None,
    node_segment: Mapping[str, str] | None = None,
) -> CapacityController:
    """The CapacityController of the driver on ``connection`` from the parsed flags, writing
    with ``setup.client`` and reading from ``informer_factory`` (the caller starts it).
    Refuses a driver that cannot report capacity.

    With ``node`` (``--node-deployment``), as upstream: the objects are for that node's
    topology segment only (``node_segment``, from NodeGetInfo; a fixed topology instead of
    watching nodes) and carry a managed-by label of that node's own
    (:func:`managed_by_for_node`), so instances on different nodes never update or delete
    each other's objects. The owner reference is found as without it (``$POD_NAME`` at
    ``--capacity-ownerref-level``)."""
    if v1.ControllerServiceCapabilityRpcType.GET_CAPACITY not in connection.controller_capabilities:
        raise StartupError(
            f"--enable-capacity: CSI driver {connection.driver_name} does not report the "
            "GET_CAPACITY controller capability, so it cannot report storage capacity; "
            "remove --enable-capacity"
        )
    args = ctx.args
    options = CapacityControllerOptions(
        namespace=setup.namespace,
        owner=setup.owner,
        poll_interval=args.capacity_poll_interval,
        immediate_binding=args.capacity_for_immediate_binding,
        workers=args.capacity_threads,
        timeout=args.timeout,
        retry_interval_start=args.retry_interval_start,
        retry_interval_max=args.retry_interval_max,
        registry=ctx.registry,
        managed_by=DEFAULT_MANAGED_BY if node is None else managed_by_for_node(node),
    )
    topology = None
    if node is not None:
        segment: Segment = tuple(sorted((node_segment or {}).items()))
        ctx.log.info(
            "CSIStorageCapacity for a fixed topology segment",
            node=node,
            segment=dict(segment),
            managed_by=options.managed_by,
        )
        topology = FixedTopology(segment)
    return CapacityController(
        setup.client,
        connection.driver_name,
        CSICapacitySource(connection, args.timeout),
        options,
        informer_factory=informer_factory,
        topology=topology,
    )
