"""Storage capacity tracking in the CSI provisioner (``--enable-capacity``): GetCapacity as the
:class:`~pyprovlib.controller.capacity.CapacitySource`, and the wiring external-provisioner's
``cmd/csi-provisioner`` does — the namespace from ``$NAMESPACE``, the owner from ``$POD_NAME``
at ``--capacity-ownerref-level``, a client of its own limited by
``--kube-api-capacity-qps``/``-burst``, and the controller run under the provisioner's Lease.

Differences from upstream, each on purpose:

- A driver without the GET_CAPACITY controller capability is refused at start with a message
  (upstream calls GetCapacity anyway and retries its Unimplemented answers forever).
- The empty segment (a driver without topology keys) is sent without ``accessible_topology``,
  as the CSI spec asks of a driver without VOLUME_ACCESSIBILITY_CONSTRAINTS (upstream sends an
  empty Topology).
- ``$POD_NAMESPACE`` is read when ``$NAMESPACE`` is not set.
- ``--kube-api-capacity-qps``/``-burst`` limit the controller's writes with a token bucket of
  their own, in front of the process's ``--kube-api-qps`` limiter (upstream builds a second
  client whose limit replaces the first); the objects are watched through the process's
  shared informers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyprovlib.controller.capacity import (
    Capacity,
    CapacityController,
    CapacityControllerOptions,
    OwnerLookupError,
    Segment,
    lookup_owner,
)
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.connection import CSIConnection
from pyprovlib.kube.informer import SharedInformerFactory
from pyprovlib.kube.ratelimit import TokenBucket
from pyprovlib.runtime import RuntimeContext, StartupError

__all__ = [
    "CSICapacitySource",
    "CapacitySetup",
    "build_capacity_controller",
    "resolve_capacity",
]

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
    objects and their owner reference (None with ``--capacity-ownerref-level=-1``)."""

    namespace: str
    owner: Mapping[str, Any] | None


async def resolve_capacity(
    ctx: RuntimeContext, environ: Mapping[str, str] | None = None
) -> CapacitySetup | None:
    """With ``--enable-capacity``: the namespace from ``$NAMESPACE`` (or ``$POD_NAMESPACE``) and
    the owner found from ``$POD_NAME`` ``--capacity-ownerref-level`` levels up; None without.
    Raises :class:`~pyprovlib.runtime.StartupError` naming what is missing."""
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
    if level < 0:
        return CapacitySetup(namespace, None)
    pod = env.get(_POD_NAME_ENV, "")
    if not pod:
        raise StartupError(
            "--enable-capacity needs the POD_NAME environment variable to find the owner of "
            "the CSIStorageCapacity objects (valueFrom.fieldRef metadata.name), or "
            "--capacity-ownerref-level=-1 for objects without owner"
        )
    try:
        owner = await lookup_owner(ctx.api_client, namespace, pod, level)
    except OwnerLookupError as err:
        raise StartupError(f"--enable-capacity: {err}") from None
    ctx.log.info(
        "owner of the CSIStorageCapacity objects",
        owner=f"{owner['apiVersion']}/{owner['kind']} {owner['name']}",
        namespace=namespace,
    )
    return CapacitySetup(namespace, owner)


def build_capacity_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory,
    setup: CapacitySetup,
) -> CapacityController:
    """The CapacityController of the driver on ``connection`` from the parsed flags, reading
    from ``informer_factory`` (the caller starts it). Refuses a driver that cannot report
    capacity."""
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
        threads=args.capacity_threads,
        timeout=args.timeout,
        retry_interval_start=args.retry_interval_start,
        retry_interval_max=args.retry_interval_max,
        registry=ctx.registry,
    )
    return CapacityController(
        ctx.api_client,
        connection.driver_name,
        CSICapacitySource(connection, args.timeout),
        options,
        informer_factory=informer_factory,
        write_limiter=TokenBucket(args.kube_api_capacity_qps, args.kube_api_capacity_burst),
    )
