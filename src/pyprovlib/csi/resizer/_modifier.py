"""The CSI modifier (kubernetes-csi/external-resizer's ``pkg/modifier``): :class:`CSIModifier`
changes a volume's mutable parameters through a driver's ControllerModifyVolume, sending the
volume handle, the parameters and the controller-modify secrets (the Secret named by the PV's
``volume.kubernetes.io/controller-modify-secret-name``/``-namespace`` annotations, which the
provisioner records from its class, else the PV's ``csi.controllerExpandSecretRef``);
:func:`choose_modifier` picks it, or a :class:`~pyprovlib.NotModifiable` for a driver
without MODIFY_VOLUME.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubernetes_asyncio.client import ApiClient, V1CSIPersistentVolumeSource, V1PersistentVolume

from pyprovlib._logging import get_logger
from pyprovlib._modifier import Modifier, ModifyError, NotModifiable
from pyprovlib._provisioner import ProvisioningError
from pyprovlib.csi._connection import CSICallError, CSIConnection, identified_driver
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner._secrets import (
    ANN_MODIFY_SECRET_NAME,
    ANN_MODIFY_SECRET_NAMESPACE,
    SecretRef,
    read_secret,
)
from pyprovlib.csi.resizer._controller import _mask
from pyprovlib.kube._resources import SECRETS
from pyprovlib.kube._rest import ResourceClient

__all__ = [
    "ANN_MODIFY_SECRET_NAME",
    "ANN_MODIFY_SECRET_NAMESPACE",
    "CSIModifier",
    "choose_modifier",
]

log = get_logger(__name__)

_Caps = v1.ControllerServiceCapabilityRpcType


def _csi_source(pv: V1PersistentVolume) -> V1CSIPersistentVolumeSource | None:
    source: V1CSIPersistentVolumeSource | None = pv.spec.csi if pv.spec else None
    return source


class CSIModifier(Modifier):
    """Modify volumes through a CSI driver's ControllerModifyVolume.

    ``connection`` is an open :class:`~pyprovlib.csi.CSIConnection` of a driver
    with MODIFY_VOLUME; ``api_client`` reads the controller-modify Secret. ``timeout`` bounds
    each call (default: the connection's). It reads the attributes of the
    ``V1PersistentVolume`` it is given and converts nothing.
    """

    def __init__(
        self, connection: CSIConnection, api_client: ApiClient, *, timeout: float | None = None
    ) -> None:
        self.name = identified_driver(connection)
        self.connection = connection
        self.timeout = timeout
        self._secrets = ResourceClient(api_client, SECRETS)

    def can_support(self, pv: V1PersistentVolume) -> bool:
        """CSI volumes of this driver."""
        csi = _csi_source(pv)
        return csi is not None and csi.driver == self.name

    async def modify(self, pv: V1PersistentVolume, parameters: Mapping[str, str]) -> None:
        """ControllerModifyVolume with ``parameters`` as the mutable parameters."""
        csi = _csi_source(pv)
        name = str(pv.metadata.name or "") if pv.metadata else ""
        if csi is None:
            raise ModifyError(
                f"volume {name} is not a CSI volume; only CSI volumes can be modified"
            )
        if not csi.volume_handle:
            raise ModifyError(f"volume {name} has an empty volume handle")
        secrets = await self._modify_secrets(pv, csi)
        request = v1.ControllerModifyVolumeRequest(
            volume_id=str(csi.volume_handle),
            secrets=dict(secrets),
            mutable_parameters=dict(parameters),
        )
        try:
            await self.connection.call(
                "/csi.v1.Controller/ControllerModifyVolume", request, call_timeout=self.timeout
            )
        except CSICallError as err:
            # grpc-go's status error text, which is what upstream reports in events.
            raise ModifyError(
                _mask(str(err), secrets),
                code=int(err.status.value),
                detail=_mask(err.message, secrets),
            ) from None

    async def _modify_secrets(
        self, pv: V1PersistentVolume, csi: V1CSIPersistentVolumeSource
    ) -> dict[str, str]:
        """upstream's ``getModifyCredentials``: the annotations' Secret, else the
        controller-expand one, else none."""
        annotations = (pv.metadata.annotations if pv.metadata else None) or {}
        name = annotations.get(ANN_MODIFY_SECRET_NAME)
        namespace = annotations.get(ANN_MODIFY_SECRET_NAMESPACE)
        if not name or not namespace:
            ref = csi.controller_expand_secret_ref
            if ref is None or not ref.name:
                return {}
            name, namespace = ref.name, ref.namespace
        if not namespace:
            raise ModifyError(f'controllerExpandSecretRef "{name}" names no namespace')
        try:
            return await read_secret(self._secrets, SecretRef(str(name), str(namespace)))
        except ProvisioningError as err:  # read_secret's, naming the Secret, never a value
            raise ModifyError(str(err)) from None


def choose_modifier(connection: CSIConnection, api_client: ApiClient) -> Modifier:
    """external-resizer's ``NewModifierFromClient``: the CSI modifier for a driver with
    MODIFY_VOLUME; otherwise a modifier that only tells the users who ask for another class
    that the driver cannot (upstream's newest modify controller does the same)."""
    if _Caps.MODIFY_VOLUME in connection.controller_capabilities:
        return CSIModifier(connection, api_client)
    log.info("the CSI driver cannot modify volumes", driver=connection.driver_name)
    return NotModifiable(
        connection.driver_name,
        f"CSI driver {connection.driver_name} does not support modifying volumes (no "
        "MODIFY_VOLUME controller capability)",
    )
