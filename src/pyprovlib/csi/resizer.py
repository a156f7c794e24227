"""The CSI resizer and the external-resizer sidecar (``python -m pyprovlib.csi.resizer``).

:class:`CSIResizer` is a :class:`~pyprovlib.resizer.Resizer` over a CSI driver's
ControllerExpandVolume (kubernetes-csi/external-resizer's ``pkg/resizer/csi_resizer.go``):
it sends the volume handle, the requested bytes, the volume capability and the
controller-expand secrets (the PV's ``csi.controllerExpandSecretRef``, else the class's
``csi.storage.k8s.io/controller-expand-secret-name``/``-namespace`` parameters).
:class:`TrivialResizer` serves drivers that expand on the node only. The sidecar connects to
the driver, picks one of the two from its capabilities (refusing to start when the driver can
expand neither way) and runs a :class:`~pyprovlib.controller.resize.ResizeController`.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client import ApiClient
from prometheus_client import REGISTRY

from pyprovlib._logging import get_logger
from pyprovlib.attacher import GrpcCode
from pyprovlib.controller.resize import ResizeController
from pyprovlib.controller.resize_options import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RESYNC,
    DEFAULT_RETRY_INTERVAL_MAX,
    DEFAULT_RETRY_INTERVAL_START,
    DEFAULT_RETRY_PERIOD,
    DEFAULT_TIMEOUT,
    DEFAULT_WORKERS,
    ResizeControllerOptions,
    lease_name,
)
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._sidecar_controller import SidecarController, check_csi_address
from pyprovlib.csi.attacher import UnsupportedAccessModeError, csi_access_mode
from pyprovlib.csi.connection import (
    GO_STATUS_NAMES,
    ConnectionOptions,
    CSICallError,
    CSIConnection,
    CSIMetrics,
    default_csi_metrics,
)
from pyprovlib.csi.provisioner import CONTROLLER_EXPAND_SECRET, SecretRef, secret_reference
from pyprovlib.errors import PyprovlibError
from pyprovlib.kube.errors import ApiException
from pyprovlib.kube.informer import SharedInformerFactory
from pyprovlib.kube.resources import SECRETS, STORAGE_CLASSES
from pyprovlib.kube.rest import ResourceClient
from pyprovlib.redaction import scrub_text
from pyprovlib.resizer import ExpansionResult, ResizeError, Resizer
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_bool_flag,
    add_duration_flag,
    add_flag,
    common_parser,
    run,
)

__all__ = [
    "DEFAULT_CSI_ADDRESS",
    "CSIResizer",
    "DriverCannotExpandError",
    "ResizerSidecar",
    "TrivialResizer",
    "build",
    "build_controller",
    "choose_resizer",
    "main",
    "parser",
]

log = get_logger(__name__)

DEFAULT_CSI_ADDRESS = "/run/csi/socket"
"""external-resizer's ``--csi-address`` default."""

_Caps = v1.ControllerServiceCapabilityRpcType
_MASK = "***"
_MIN_MASKED_SECRET = 4


class DriverCannotExpandError(PyprovlibError, RuntimeError):
    """The driver has no Controller service, or can expand volumes neither in the controller
    (EXPAND_VOLUME) nor on the node (the VolumeExpansion plugin capability)."""


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _csi_source(pv: Mapping[str, Any]) -> Mapping[str, Any] | None:
    csi = _dict(pv.get("spec")).get("csi")
    return csi if isinstance(csi, Mapping) else None


def _mask(text: str, secrets: Mapping[str, str]) -> str:
    for value in sorted(secrets.values(), key=len, reverse=True):
        if len(value) >= _MIN_MASKED_SECRET:
            text = text.replace(value, _MASK)
    return scrub_text(text)


def _api_message(err: ApiException) -> str:
    return f"{err.status} {err.reason}".strip()


class TrivialResizer(Resizer):
    """For drivers that expand on the node only (upstream's ``trivialResizer``): the
    controller part of an expansion is only bookkeeping, the node grows the volume."""

    def __init__(self, name: str) -> None:
        self.name = name

    def can_support(self, pv: Mapping[str, Any]) -> bool:
        """CSI volumes of this driver."""
        csi = _csi_source(pv)
        return csi is not None and csi.get("driver") == self.name

    async def expand(self, pv: Mapping[str, Any], new_size: int) -> ExpansionResult:
        """Nothing to do here: the node expands the volume to ``new_size``."""
        return ExpansionResult(new_size, True)

    @property
    def supports_control_plane_expansion(self) -> bool:
        """False: the expansion happens on the node."""
        return False


class CSIResizer(Resizer):
    """Expand volumes through a CSI driver's ControllerExpandVolume.

    ``connection`` is an open :class:`~pyprovlib.csi.connection.CSIConnection` of a driver
    with EXPAND_VOLUME; ``api_client`` reads the controller-expand Secret (and, for volumes
    without ``controllerExpandSecretRef``, their StorageClass). ``timeout`` bounds each call
    (default: the connection's).
    """

    def __init__(
        self,
        connection: CSIConnection,
        api_client: ApiClient,
        *,
        timeout: float | None = None,
        supports_single_node_multi_writer: bool | None = None,
    ) -> None:
        if not connection.driver_name:
            raise ValueError("the CSI connection has not identified its driver")
        self.connection = connection
        self.name = connection.driver_name
        self.timeout = timeout
        self.supports_single_node_multi_writer = (
            _Caps.SINGLE_NODE_MULTI_WRITER in connection.controller_capabilities
            if supports_single_node_multi_writer is None
            else supports_single_node_multi_writer
        )
        self._secrets = ResourceClient(api_client, SECRETS)
        self._classes = ResourceClient(api_client, STORAGE_CLASSES)

    def can_support(self, pv: Mapping[str, Any]) -> bool:
        """CSI volumes of this driver (upstream's ``CanSupport``)."""
        csi = _csi_source(pv)
        return csi is not None and csi.get("driver") == self.name

    async def expand(self, pv: Mapping[str, Any], new_size: int) -> ExpansionResult:
        """ControllerExpandVolume to ``new_size`` bytes; returns the driver's capacity (the
        requested size when the driver reports none) and its node_expansion_required."""
        csi = _csi_source(pv)
        if csi is None:
            raise ResizeError("not a CSI volume", final=False)
        volume_id = csi.get("volumeHandle")
        if not isinstance(volume_id, str) or not volume_id:
            raise ResizeError("empty volume handle", final=False)
        secrets = await self._expand_secrets(pv, csi)
        request = v1.ControllerExpandVolumeRequest(
            volume_id=volume_id,
            capacity_range=v1.CapacityRange(required_bytes=new_size),
            secrets=dict(secrets),
            volume_capability=self._capability(pv, csi),
        )
        try:
            response: v1.ControllerExpandVolumeResponse = await self.connection.call(
                "/csi.v1.Controller/ControllerExpandVolume", request, call_timeout=self.timeout
            )
        except CSICallError as err:
            # grpc-go's status error text, which is what upstream reports.
            message = f"rpc error: code = {GO_STATUS_NAMES[err.status]} desc = {err.message}"
            raise ResizeError(_mask(message, secrets), code=int(err.status.value)) from None
        size = response.capacity_bytes or new_size
        return ExpansionResult(size, response.node_expansion_required)

    def _capability(self, pv: Mapping[str, Any], csi: Mapping[str, Any]) -> v1.VolumeCapability:
        """The volume capability of the PV (upstream's ``getVolumeCapabilities``)."""
        spec = _dict(pv.get("spec"))
        try:
            mode = csi_access_mode(
                [str(m) for m in spec.get("accessModes") or ()],
                self.supports_single_node_multi_writer,
            )
        except UnsupportedAccessModeError as err:
            raise ResizeError(err.message, code=GrpcCode.INVALID_ARGUMENT) from None
        access_mode = v1.VolumeCapabilityAccessMode(mode=mode)
        if spec.get("volumeMode") == "Block":
            return v1.VolumeCapability(
                block=v1.VolumeCapabilityBlockVolume(), access_mode=access_mode
            )
        return v1.VolumeCapability(
            mount=v1.VolumeCapabilityMountVolume(
                fs_type=str(csi.get("fsType") or ""),
                mount_flags=[str(f) for f in spec.get("mountOptions") or ()],
            ),
            access_mode=access_mode,
        )

    async def _expand_secrets(
        self, pv: Mapping[str, Any], csi: Mapping[str, Any]
    ) -> dict[str, str]:
        ref = self._secret_ref(csi)
        if ref is None:
            ref = await self._class_secret_ref(pv)
        if ref is None:
            return {}
        try:
            secret = await self._secrets.get(ref.name, ref.namespace)
        except ApiException as err:
            raise ResizeError(
                f"error getting secret {ref.name} in namespace {ref.namespace}: "
                f"{_api_message(err)}",
                final=False,
            ) from None
        result: dict[str, str] = {}
        for key, value in _dict(secret.get("data")).items():
            try:
                result[str(key)] = base64.b64decode(str(value), validate=True).decode(
                    "utf-8", "surrogateescape"
                )
            except (binascii.Error, ValueError):
                raise ResizeError(
                    f'secret "{ref.namespace}/{ref.name}" has undecodable data under key {key!r}',
                    final=False,
                ) from None
        return result

    @staticmethod
    def _secret_ref(csi: Mapping[str, Any]) -> SecretRef | None:
        ref = _dict(csi.get("controllerExpandSecretRef"))
        name, namespace = ref.get("name"), ref.get("namespace")
        if not name:
            return None
        if not namespace:
            raise ResizeError(f'controllerExpandSecretRef "{name}" names no namespace', final=False)
        return SecretRef(str(name), str(namespace))

    async def _class_secret_ref(self, pv: Mapping[str, Any]) -> SecretRef | None:
        """The class's controller-expand secret, for volumes provisioned before their class
        named one (or by a provisioner that did not copy it to the PV)."""
        spec = _dict(pv.get("spec"))
        class_name = spec.get("storageClassName")
        if not isinstance(class_name, str) or not class_name:
            return None
        try:
            storage_class = await self._classes.get(class_name)
        except ApiException as err:
            raise ResizeError(
                f"get StorageClass {class_name} failed: {_api_message(err)}", final=False
            ) from None
        parameters = {str(k): str(v) for k, v in _dict(storage_class.get("parameters")).items()}
        claim_ref = _dict(spec.get("claimRef"))
        claim = (
            {"metadata": {"name": claim_ref.get("name"), "namespace": claim_ref.get("namespace")}}
            if claim_ref
            else None
        )
        pv_name = str(_dict(pv.get("metadata")).get("name") or "")
        try:
            return secret_reference(CONTROLLER_EXPAND_SECRET, parameters, pv_name, claim)
        except ValueError as err:
            raise ResizeError(str(err), final=False) from None


# -- the sidecar ---------------------------------------------------------------------------------


def parser() -> RuntimeArgumentParser:
    """The sidecar's flags: the common ones plus external-resizer's, with its defaults."""
    p = common_parser(
        "csi-resizer",
        "Expands CSI volumes: watches PersistentVolumeClaims whose storage request grew and "
        "calls the driver's ControllerExpandVolume (external-resizer).",
        defaults={
            "worker_threads": DEFAULT_WORKERS,
            "leader_election_lease_duration": DEFAULT_LEASE_DURATION,
            "leader_election_renew_deadline": DEFAULT_RENEW_DEADLINE,
            "leader_election_retry_period": DEFAULT_RETRY_PERIOD,
        },
    )
    group = p.add_argument_group("resizer")
    add_flag(
        p,
        "--csi-address",
        default=DEFAULT_CSI_ADDRESS,
        help="address of the CSI driver socket",
        metavar="ADDRESS",
        group=group,
    )
    add_duration_flag(
        p,
        "--resync-period",
        default=DEFAULT_RESYNC,
        help="resync period for cache",
        group=group,
    )
    add_duration_flag(
        p,
        "--timeout",
        default=DEFAULT_TIMEOUT,
        help="timeout of every call to the CSI driver",
        group=group,
    )
    add_duration_flag(
        p,
        "--retry-interval-start",
        default=DEFAULT_RETRY_INTERVAL_START,
        help="initial retry interval of failed volume resize; it doubles with each failure, "
        "up to --retry-interval-max",
        group=group,
    )
    add_duration_flag(
        p,
        "--retry-interval-max",
        default=DEFAULT_RETRY_INTERVAL_MAX,
        help="maximum retry interval of failed volume resize",
        group=group,
    )
    add_bool_flag(
        p,
        "--handle-volume-inuse-error",
        default=True,
        help="after the driver refused to expand a volume in use, wait until no pod uses it",
        group=group,
    )
    group.add_argument(
        "--workers",
        dest="worker_threads",
        type=_positive,
        default=argparse.SUPPRESS,
        metavar="N",
        help="external-resizer's name of --worker-threads: concurrency to process multiple "
        "resize requests",
    )
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class ResizerSidecar(SidecarController[ResizeController]):
    """The external-resizer sidecar's controller: a :class:`ResizeController` run beside the CSI
    connection it depends on (a lost connection ends :meth:`run`, as upstream exits)."""


def choose_resizer(connection: CSIConnection, api_client: ApiClient) -> Resizer:
    """external-resizer's ``NewResizerFromClient``: the CSI resizer for a driver with
    EXPAND_VOLUME, the trivial one for a driver that expands on the node only; raises
    :class:`DriverCannotExpandError` otherwise."""
    driver = connection.driver_name
    if not connection.plugin_capabilities.controller_service:
        raise DriverCannotExpandError(f"CSI driver {driver} does not support controller service")
    if _Caps.EXPAND_VOLUME in connection.controller_capabilities:
        return CSIResizer(connection, api_client)
    if connection.plugin_capabilities.volume_expansion:
        log.info(
            "the CSI driver supports node resize only; using the trivial resizer", driver=driver
        )
        return TrivialResizer(driver)
    raise DriverCannotExpandError(
        f"CSI driver {driver} neither supports controller resize (EXPAND_VOLUME) nor node "
        "resize (the VolumeExpansion plugin capability)"
    )


def build_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
) -> ResizeController:
    """The ResizeController from the parsed flags, on an open ``connection``
    (:func:`choose_resizer` picks the resizer). Informers come from ``informer_factory`` when
    given (the caller starts it). Shared by this sidecar and ``python -m pyprovlib.csi``."""
    args = ctx.args
    resizer = choose_resizer(connection, ctx.api_client)
    if isinstance(resizer, CSIResizer):
        # --timeout per call: the connection may be shared with controllers whose differs.
        resizer.timeout = args.timeout
    options = ctx.options
    return ResizeController(
        ctx.api_client,
        resizer,
        ResizeControllerOptions(
            resync_period=args.resync_period,
            timeout=args.timeout,
            workers=options.worker_threads,
            retry_interval_start=args.retry_interval_start,
            retry_interval_max=args.retry_interval_max,
            handle_volume_in_use_error=args.handle_volume_inuse_error,
            lease=lease_name(resizer.name),
            **options.leader_election_fields(),
            registry=ctx.registry,
        ),
        informer_factory=informer_factory,
    )


async def build(ctx: RuntimeContext) -> ResizerSidecar:
    """Connect to the driver and build the sidecar from the parsed flags (external-resizer's
    ``main``)."""
    args = ctx.args
    metrics: CSIMetrics = (
        default_csi_metrics() if ctx.registry is REGISTRY else CSIMetrics(ctx.registry)
    )
    check_csi_address(args.csi_address)
    connection = await CSIConnection.open(
        args.csi_address,
        ConnectionOptions(timeout=args.timeout),
        metrics=metrics,
    )
    try:
        controller = build_controller(ctx, connection)
    except BaseException:
        connection.close()
        raise
    ctx.log.info(
        "CSI resizer",
        driver=connection.driver_name,
        resizer=type(controller.resizer).__name__,
        csi_address=args.csi_address,
    )
    return ResizerSidecar(connection, controller)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyprovlib.csi.resizer``: the external-resizer sidecar."""
    return run(build, argv=argv, parser=parser())


if __name__ == "__main__":
    sys.exit(main())
