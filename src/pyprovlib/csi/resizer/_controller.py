"""The CSI resizers (kubernetes-csi/external-resizer's ``pkg/resizer``): :class:`CSIResizer`
expands through a driver's ControllerExpandVolume (``csi_resizer.go``), sending the volume
handle, the requested bytes, the volume capability and the controller-expand secrets (the PV's
``csi.controllerExpandSecretRef``, else the class's
``csi.storage.k8s.io/controller-expand-secret-name``/``-namespace`` parameters);
:class:`TrivialResizer` serves drivers that expand on the node only; :func:`choose_resizer`
picks one of the two from the driver's capabilities.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from kubernetes_asyncio.client import ApiClient, V1CSIPersistentVolumeSource, V1PersistentVolume

from pyprovlib._attacher import GrpcCode
from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib._redaction import scrub_text
from pyprovlib._resizer import ExpansionResult, ResizeError, Resizer
from pyprovlib.csi._connection import (
    GO_STATUS_NAMES,
    CSICallError,
    CSIConnection,
    identified_driver,
)
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.attacher._controller import (
    UnsupportedAccessModeError,
    has_capabilities,
    pv_volume_capability,
)
from pyprovlib.csi.provisioner._secrets import CONTROLLER_EXPAND_SECRET, SecretRef, secret_reference
from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._objects import as_mapping
from pyprovlib.kube._resources import SECRETS, STORAGE_CLASSES
from pyprovlib.kube._rest import ResourceClient

__all__ = [
    "CSIResizer",
    "DriverCannotExpandError",
    "TrivialResizer",
    "choose_resizer",
]

log = get_logger(__name__)

_Caps = v1.ControllerServiceCapabilityRpcType
_MASK = "***"
_MIN_MASKED_SECRET = 4


class DriverCannotExpandError(PyprovlibError, RuntimeError):
    """The driver has no Controller service, or can expand volumes neither in the controller
    (EXPAND_VOLUME) nor on the node (the VolumeExpansion plugin capability)."""


def _csi_source(pv: V1PersistentVolume) -> V1CSIPersistentVolumeSource | None:
    source: V1CSIPersistentVolumeSource | None = pv.spec.csi if pv.spec else None
    return source


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

    def can_support(self, pv: V1PersistentVolume) -> bool:
        """CSI volumes of this driver."""
        csi = _csi_source(pv)
        return csi is not None and csi.driver == self.name

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        """Nothing to do here: the node expands the volume to ``new_size``."""
        return ExpansionResult(new_size, True)

    @property
    def supports_control_plane_expansion(self) -> bool:
        """False: the expansion happens on the node."""
        return False


class CSIResizer(Resizer):
    """Expand volumes through a CSI driver's ControllerExpandVolume.

    ``connection`` is an open :class:`~pyprovlib.csi.CSIConnection` of a driver
    with EXPAND_VOLUME; ``api_client`` reads the controller-expand Secret (and, for volumes
    without ``controllerExpandSecretRef``, their StorageClass). ``timeout`` bounds each call
    (default: the connection's). It reads the attributes of the ``V1PersistentVolume`` it is
    given and converts nothing.
    """

    def __init__(
        self,
        connection: CSIConnection,
        api_client: ApiClient,
        *,
        timeout: float | None = None,
        supports_single_node_multi_writer: bool | None = None,
    ) -> None:
        self.name = identified_driver(connection)
        self.connection = connection
        self.timeout = timeout
        self.supports_single_node_multi_writer = has_capabilities(
            connection, _Caps.SINGLE_NODE_MULTI_WRITER, override=supports_single_node_multi_writer
        )
        self._secrets = ResourceClient(api_client, SECRETS)
        self._classes = ResourceClient(api_client, STORAGE_CLASSES)

    def can_support(self, pv: V1PersistentVolume) -> bool:
        """CSI volumes of this driver (upstream's ``CanSupport``)."""
        csi = _csi_source(pv)
        return csi is not None and csi.driver == self.name

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        """ControllerExpandVolume to ``new_size`` bytes; returns the driver's capacity (the
        requested size when the driver reports none) and its node_expansion_required."""
        csi = _csi_source(pv)
        if csi is None:
            raise ResizeError("not a CSI volume", final=False)
        volume_id = csi.volume_handle
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

    def _capability(
        self, pv: V1PersistentVolume, csi: V1CSIPersistentVolumeSource
    ) -> v1.VolumeCapability:
        """The volume capability of the PV (upstream's ``getVolumeCapabilities``)."""
        spec = pv.spec
        try:
            return pv_volume_capability(
                [str(m) for m in spec.access_modes or ()],
                self.supports_single_node_multi_writer,
                block=spec.volume_mode == "Block",
                fs_type=str(csi.fs_type or ""),
                mount_flags=[str(f) for f in spec.mount_options or ()],
            )
        except UnsupportedAccessModeError as err:
            raise ResizeError(err.message, code=GrpcCode.INVALID_ARGUMENT) from None

    async def _expand_secrets(
        self, pv: V1PersistentVolume, csi: V1CSIPersistentVolumeSource
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
        for key, value in as_mapping(secret.get("data")).items():
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
    def _secret_ref(csi: V1CSIPersistentVolumeSource) -> SecretRef | None:
        ref = csi.controller_expand_secret_ref
        name = ref.name if ref is not None else None
        if not name:
            return None
        if not ref.namespace:
            raise ResizeError(f'controllerExpandSecretRef "{name}" names no namespace', final=False)
        return SecretRef(str(name), str(ref.namespace))

    async def _class_secret_ref(self, pv: V1PersistentVolume) -> SecretRef | None:
        """The class's controller-expand secret, for volumes provisioned before their class
        named one (or by a provisioner that did not copy it to the PV)."""
        spec = pv.spec
        class_name = spec.storage_class_name
        if not isinstance(class_name, str) or not class_name:
            return None
        try:
            storage_class = await self._classes.get(class_name)
        except ApiException as err:
            raise ResizeError(
                f"get StorageClass {class_name} failed: {_api_message(err)}", final=False
            ) from None
        parameters = {
            str(k): str(v) for k, v in as_mapping(storage_class.get("parameters")).items()
        }
        claim_ref = spec.claim_ref
        claim = (
            {"metadata": {"name": claim_ref.name, "namespace": claim_ref.namespace}}
            if claim_ref is not None
            else None
        )
        pv_name = str(pv.metadata.name or "") if pv.metadata else ""
        try:
            return secret_reference(CONTROLLER_EXPAND_SECRET, parameters, pv_name, claim)
        except ValueError as err:
            raise ResizeError(str(err), final=False) from None


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
