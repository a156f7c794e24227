"""CSIProvisioner: a :class:`~pyprovlib.Provisioner` that creates and deletes
volumes through a CSI driver's Controller service (external-provisioner's
``pkg/controller/controller.go``: Provision, Delete, checkError, getVolumeCapabilities,
makeVolumeName). Topology, secrets and data sources live in their own modules beside it.

It works on the controller's JSON dicts (:attr:`ProvisionOptions.claim_object`,
:attr:`ProvisionOptions.storage_class_object`) and returns the PV as a dict: no
kubernetes-asyncio model is built on the provision path.

Differences from upstream, each on purpose:

- A claim deleted while its volume was still being created in the background (a CreateVolume
  that timed out or lost its connection) does not leak the volume (upstream issues #486 and
  #1469): the provisioner remembers in-flight volume names and, when the controller retries
  such a claim and finds it gone, finishes the CreateVolume and deletes the volume.
- A volume the driver created smaller than requested is deleted and the attempt FINISHED once
  the delete succeeded (upstream reports IN_BACKGROUND either way).
- A clone of a source claim being deleted is finished when the clone existed before the
  deletion was requested and the source still carries the cloning-protection finalizer (a
  retry after a timed-out CreateVolume, or after a restart); upstream refuses it, so the
  clone and its source wait for each other until one is deleted by hand. The finalizer is
  taken off by the
  :class:`~pyprovlib.csi.provisioner._clone_controller.CloningProtectionController`
  (:meth:`CSIProvisioner.cloning_protection_controller`).
- The snapshot-source protection of a VolumeSnapshot a volume is restored from is released
  when no restore from it is in flight in this process any more.
- A data source of any other kind than PersistentVolumeClaim and VolumeSnapshot is left to a
  volume populator, as upstream does: a Normal ``Provisioning`` event, then IgnoredError.
- A cross-namespace data source (``dataSourceRef.namespace``, the alpha
  CrossNamespaceVolumeDataSource feature with ReferenceGrants) is refused with a final error,
  as upstream does while that feature gate is off (its default).

A claim naming a VolumeAttributesClass is provisioned with the class's parameters as the
CreateVolume request's ``mutable_parameters`` and a PV of that class, as upstream: the driver
must have MODIFY_VOLUME and the class must be for this driver (else a final error); a class that
cannot be read yet (not found) is retried.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn

from grpclib.const import Status
from kubernetes_asyncio.client import ApiClient, V1PersistentVolume
from prometheus_client import CollectorRegistry

from pyprovlib._logging import get_logger
from pyprovlib._provisioner import (
    BlockProvisioner,
    IgnoredError,
    InfeasibleError,
    ObjectDeleter,
    Provisioner,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
)
from pyprovlib.controller._provision.decisions import storage_request_bytes
from pyprovlib.controller._renamed import warn_renamed
from pyprovlib.csi._connection import CSICallError, CSIConnection, identified_driver
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner._clone_controller import CloningProtectionController
from pyprovlib.csi.provisioner._common import CachedReader, ObjectReader, PreparationError
from pyprovlib.csi.provisioner._data_source import (
    DataSources,
    SourceGuard,
    SourceRef,
    claim_data_source,
)
from pyprovlib.csi.provisioner._node_deployment import LocalNode
from pyprovlib.csi.provisioner._options import CSIProvisionerOptions
from pyprovlib.csi.provisioner._request import (
    PV_NAME_KEY,
    PVC_NAME_KEY,
    PVC_NAMESPACE_KEY,
    make_volume_name,
    split_parameters,
    volume_capabilities,
)
from pyprovlib.csi.provisioner._secrets import (
    ANN_DELETION_SECRET_NAME,
    ANN_DELETION_SECRET_NAMESPACE,
    ANN_MODIFY_SECRET_NAME,
    ANN_MODIFY_SECRET_NAMESPACE,
    CONTROLLER_MODIFY_SECRET,
    PROVISIONER_SECRET,
    PV_SECRETS,
    SecretRef,
    read_secret,
    secret_reference,
)
from pyprovlib.csi.provisioner._topology import accessibility_requirements, node_affinity
from pyprovlib.kube._convert import from_model
from pyprovlib.kube._errors import ApiException, is_not_found
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._quantity import Format, Quantity
from pyprovlib.kube._resources import (
    CSINODES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    SECRETS,
    STORAGE_CLASSES,
    VOLUME_ATTACHMENTS,
    VOLUME_ATTRIBUTES_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._workqueue import RateLimiter

if TYPE_CHECKING:
    from pyprovlib.controller._capacity import CapacityController

__all__ = ["PROVISIONER_ID_KEY", "CSIProvisioner", "check_error"]

log = get_logger(__name__)

PROVISIONER_ID_KEY: Final = "storage.kubernetes.io/csiProvisionerIdentity"
"""Volume attribute recording which provisioner instance created the volume."""

ControllerCap = v1.ControllerServiceCapabilityRpcType


def _read_only_many(request: v1.CreateVolumeRequest) -> bool:
    """The claim's only access mode is ReadOnlyMany (upstream: the request has exactly one
    volume capability, MULTI_NODE_READER_ONLY)."""
    caps = request.volume_capabilities
    if len(caps) != 1 or caps[0].access_mode is None:
        return False
    return caps[0].access_mode.mode == v1.VolumeCapabilityAccessModeMode.MULTI_NODE_READER_ONLY


def check_error(err: BaseException, may_reschedule: bool) -> ProvisioningState:
    """The state a failed CreateVolume left the driver in (upstream's ``checkError``)."""
    if not isinstance(err, CSICallError):
        # Not a gRPC status: we cannot know what the driver did.
        return ProvisioningState.IN_BACKGROUND
    if err.status is Status.RESOURCE_EXHAUSTED:
        return ProvisioningState.RESCHEDULE if may_reschedule else ProvisioningState.FINISHED
    if err.status in (
        Status.CANCELLED,
        Status.DEADLINE_EXCEEDED,
        Status.UNAVAILABLE,
        Status.ABORTED,
    ):
        return ProvisioningState.IN_BACKGROUND
    return ProvisioningState.FINISHED


@dataclass
class _InFlight:
    """A CreateVolume that may still be running in the driver."""

    volume_name: str
    claim_namespace: str
    claim_name: str
    request: v1.CreateVolumeRequest
    protected: tuple[SourceGuard, tuple[str, str]] | None


@dataclass
class _Prepared:
    """What :meth:`CSIProvisioner._prepare` resolved once for one attempt, so nothing is
    resolved or validated twice: the request, the secret references (the provisioner's and the
    PV's), the claim's data source and its protection."""

    request: v1.CreateVolumeRequest
    provisioner_secret: SecretRef | None
    pv_secrets: list[tuple[str, SecretRef]]
    data_source: SourceRef | None
    protected: tuple[SourceGuard, tuple[str, str]] | None
    attributes_class: str = ""
    modify_secret: SecretRef | None = None


class CSIProvisioner(Provisioner, BlockProvisioner, ObjectDeleter):
    """Provisions and deletes volumes through a CSI driver (external-provisioner's core).

    ``client`` is a kubernetes-asyncio ApiClient used for Secrets, Nodes, CSINodes, claims,
    PVs, StorageClasses, VolumeAttachments, VolumeSnapshots and VolumeSnapshotContents;
    ``connection`` an opened
    :class:`~pyprovlib.csi.CSIConnection` (its driver name is the provisioner name).
    With ``informer_factory`` (the one the ProvisionController shares, started by the caller)
    StorageClasses, VolumeAttachments, Nodes and CSINodes are read from its caches.
    ``recorder`` (usually the ProvisionController's, which :attr:`recorder` can also be set to
    after construction) receives the events upstream records from the provisioner itself; without
    one they are only logged. With ``local_node`` (``--node-deployment``) the topology code reads
    that node only, as its driver describes it, instead of watching Nodes and CSINodes.
    """

    def __init__(
        self,
        client: ApiClient,
        connection: CSIConnection,
        options: CSIProvisionerOptions | None = None,
        *,
        identity: str | None = None,
        informer_factory: SharedInformerFactory | None = None,
        recorder: EventRecorder | None = None,
        local_node: LocalNode | None = None,
    ) -> None:
        self.driver_name = identified_driver(connection)
        self.client = client
        self.connection = connection
        self.options = options or CSIProvisionerOptions()
        self.recorder = recorder
        self.capacity: CapacityController | None = None
        """With ``--enable-capacity``: told of every volume created or deleted and of failed
        attempts, so the CSIStorageCapacity objects of that topology or class are refreshed
        before the next poll (upstream's ``capacity.NewProvisionWrapper``)."""
        # Upstream's identity: start time in ms, a random number, the driver name.
        self.identity = identity or (
            f"{int(time.time() * 1000)}-{random.randint(0, 9999)}-{self.driver_name}"  # noqa: S311
            + (f"-{local_node.name}" if local_node is not None else "")
        )
        self.local_node = local_node
        self._secrets = ResourceClient(client, SECRETS)
        self._claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        # Read live, as upstream: only claims naming a class need one.
        self._attribute_classes = ResourceClient(client, VOLUME_ATTRIBUTES_CLASSES)
        self._classes = CachedReader(client, STORAGE_CLASSES, informer_factory)
        self._attachments = CachedReader(client, VOLUME_ATTACHMENTS, informer_factory)
        # Topology needs Nodes and CSINodes: watch them only for drivers that have it.
        topology_factory = informer_factory if self.supports_topology else None
        self._nodes: ObjectReader
        self._csinodes: ObjectReader
        if local_node is not None:
            # Deployed on every node: this node as its driver describes it, nothing watched.
            self._nodes, self._csinodes = local_node.readers(self.driver_name)
        else:
            self._nodes = CachedReader(client, NODES, topology_factory)
            self._csinodes = CachedReader(client, CSINODES, topology_factory)
        self._in_flight: dict[str, _InFlight] = {}
        self._log = log.bind(driver=self.driver_name)
        self._data_sources = DataSources(
            client,
            connection,
            CachedReader(client, PERSISTENT_VOLUME_CLAIMS, informer_factory),
            prevent_volume_mode_conversion=self.options.prevent_volume_mode_conversion,
            logger=self._log,
        )

    # -- capabilities ---------------------------------------------------------------------

    def supports_block(self) -> bool:
        """CSI drivers declare block support per request; the driver refuses what it cannot."""
        return True

    @property
    def supports_topology(self) -> bool:
        """The driver has VOLUME_ACCESSIBILITY_CONSTRAINTS."""
        return self.connection.plugin_capabilities.accessibility_constraints

    @property
    def supports_clone(self) -> bool:
        """The driver has CLONE_VOLUME."""
        return self._data_sources.supports_clone

    @property
    def supports_snapshot(self) -> bool:
        """The driver has CREATE_DELETE_SNAPSHOT (needed to restore a VolumeSnapshot)."""
        return self._data_sources.supports_snapshot

    @property
    def in_flight(self) -> frozenset[str]:
        """UIDs of claims whose CreateVolume may still be running in the driver."""
        return frozenset(self._in_flight)

    # -- provision ------------------------------------------------------------------------

    async def provision(self, options: ProvisionOptions) -> Obj:
        """Create the volume with CreateVolume and return its CSI PersistentVolume (as JSON).

        Reads the claim and its class as JSON (``claim_object``, ``storage_class_object``),
        never as models: nothing on this path converts to or from kubernetes-asyncio models.
        """
        capacity = self.capacity
        if capacity is None:
            return await self._provision(options)
        class_name = (options.storage_class_object.get("metadata") or {}).get("name", "")
        try:
            pv = await self._provision(options)
        except Exception as err:
            changed = getattr(err, "state", None) is not ProvisioningState.NO_CHANGE
            capacity.after_provision(class_name, None, changed=changed)
            raise
        capacity.after_provision(class_name, pv)
        return pv

    async def _provision(self, options: ProvisionOptions) -> Obj:
        claim = options.claim_object
        storage_class = options.storage_class_object
        metadata = claim.get("metadata") or {}
        uid = metadata.get("uid", "")
        claim_key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        logger = self._log.bind(claim=claim_key, pv=options.pv_name)

        previous = self._in_flight.get(uid)
        if previous is not None and self.options.clean_up_deleted_claims:
            await self._clean_up_if_claim_deleted(previous, uid, storage_class, logger)

        prepared = await self._prepare(options, claim, storage_class)
        request = prepared.request
        may_reschedule = self.supports_topology and options.selected_node_name is not None
        self._in_flight[uid] = _InFlight(
            request.name,
            metadata.get("namespace", ""),
            metadata.get("name", ""),
            request,
            prepared.protected,
        )
        logger.debug("calling CreateVolume", volume_name=request.name)
        try:
            response = await self.connection.create_volume(request)
        except Exception as err:
            state = check_error(err, may_reschedule)
            if state is not ProvisioningState.IN_BACKGROUND:
                await self._finish(uid)
            # A CSICallError reads as grpc-go's status error, as upstream's events do.
            text = str(err) if isinstance(err, CSICallError) else f"{type(err).__name__}: {err}"
            if isinstance(err, CSICallError) and err.status is Status.INVALID_ARGUMENT:
                # The driver refuses the request as it stands: the controller retries it only
                # after retry_interval_max, or at once when the class is replaced.
                raise InfeasibleError(text) from None
            raise ProvisioningError(text, state) from None
        volume = response.volume
        if volume is None or not volume.volume_id:
            await self._finish(uid)
            raise ProvisioningError(
                f"CSI driver {self.driver_name} returned no volume for CreateVolume",
                ProvisioningState.FINISHED,
            )
        # `is not None`, never a message's truthiness: betterproto2's Message.__bool__ builds
        # every field's default under warnings.catch_warnings(), a few µs per field per call.
        capacity_range = request.capacity_range
        requested = capacity_range.required_bytes if capacity_range is not None else 0
        capacity = volume.capacity_bytes or requested
        if capacity < requested:
            await self._delete_rejected(
                volume.volume_id,
                request,
                f"created volume capacity {capacity} less than requested capacity {requested}",
                uid,
            )
        if prepared.data_source is not None and volume.content_source is None:
            # Upstream's check: a driver that ignored the data source made an empty volume,
            # which must not be handed out as a copy of the source.
            await self._delete_rejected(
                volume.volume_id,
                request,
                f"CSI driver {self.driver_name} created volume {volume.volume_id} without the "
                "requested content source (volume content source missing)",
                uid,
            )
        await self._finish(uid)
        pv = self._build_volume(
            options, claim, storage_class, prepared=prepared, volume=volume, capacity=capacity
        )
        logger.info("volume created", volume_id=volume.volume_id, capacity=capacity)
        return pv

    async def _finish(self, uid: str) -> None:
        entry = self._in_flight.pop(uid, None)
        if entry is not None and entry.protected is not None:
            guard, source = entry.protected
            await guard.release(source, uid)

    async def _delete_created(
        self, volume_id: str, request: v1.CreateVolumeRequest, failure: str
    ) -> None:
        """DeleteVolume a volume created for ``request`` (with its secrets). If the driver
        fails, the volume still exists: raise an ``IN_BACKGROUND`` error saying ``failure``,
        so the claim is retried and the next attempt cleans up again."""
        try:
            await self.connection.delete_volume(
                v1.DeleteVolumeRequest(volume_id=volume_id, secrets=dict(request.secrets))
            )
        except Exception as err:
            raise ProvisioningError(f"{failure}: {err}", ProvisioningState.IN_BACKGROUND) from None

    async def _delete_rejected(
        self,
        volume_id: str,
        request: v1.CreateVolumeRequest,
        message: str,
        uid: str,
    ) -> NoReturn:
        """Delete a volume the driver created but that cannot be used; always raises."""
        await self._delete_created(
            volume_id,
            request,
            f"{message}. Cleanup of volume {volume_id} failed, volume is orphaned",
        )
        await self._finish(uid)
        raise ProvisioningError(f"{message}; the volume was deleted", ProvisioningState.FINISHED)

    async def _clean_up_if_claim_deleted(
        self,
        entry: _InFlight,
        uid: str,
        storage_class: Mapping[str, Any],
        logger: Any,
    ) -> None:
        """A retry of a claim whose volume may be being created: if the claim is gone, finish
        the CreateVolume (idempotent by name) and delete the volume instead of saving a PV."""
        if storage_class.get("reclaimPolicy", "Delete") != "Delete":
            # Retain: a PV is what lets an administrator find the volume; keep creating it.
            return
        try:
            current = await self._claims.get(entry.claim_name, entry.claim_namespace)
        except ApiException as err:
            if not is_not_found(err):
                raise ProvisioningError(
                    f"cannot check whether claim {entry.claim_namespace}/{entry.claim_name} "
                    f"still exists: {err.status} {err.reason}",
                    ProvisioningState.IN_BACKGROUND,
                ) from None
            current = None
        current_meta = (current or {}).get("metadata") or {}
        if current_meta.get("uid") == uid and not current_meta.get("deletionTimestamp"):
            return
        logger.info(
            "claim was deleted while its volume was being created; cleaning up",
            volume_name=entry.volume_name,
        )
        try:
            response = await self.connection.create_volume(entry.request)
        except CSICallError as err:
            state = check_error(err, False)
            if state is ProvisioningState.IN_BACKGROUND:
                raise ProvisioningError(
                    f"claim deleted; waiting for volume {entry.volume_name} to finish creating "
                    f"so it can be deleted: {err}",
                    state,
                ) from None
            # A final error: the driver created nothing under this name.
            await self._finish(uid)
            raise IgnoredError(
                f"claim deleted while provisioning; the driver reports no volume: {err}"
            ) from None
        volume_id = response.volume.volume_id if response.volume is not None else ""
        if volume_id:
            await self._delete_created(
                volume_id, entry.request, f"claim deleted; deleting its volume {volume_id} failed"
            )
        await self._finish(uid)
        logger.info("volume of deleted claim deleted", volume_id=volume_id)
        raise IgnoredError(
            f"claim was deleted while provisioning; volume {volume_id or entry.volume_name} "
            "was deleted"
        )

    async def _prepare(
        self,
        options: ProvisionOptions,
        claim: Mapping[str, Any],
        storage_class: Mapping[str, Any],
    ) -> _Prepared:
        metadata = claim.get("metadata") or {}
        spec = claim.get("spec") or {}
        data_source = claim_data_source(claim)
        if data_source is not None:
            self._data_sources.check(claim, data_source, self.recorder)
        attributes_class = self._attributes_class(claim)
        class_name = (storage_class.get("metadata") or {}).get("name", "")
        parameters: dict[str, str] = dict(storage_class.get("parameters") or {})
        try:
            volume_name = make_volume_name(
                self.options.volume_name_prefix,
                metadata.get("uid", ""),
                self.options.volume_name_uuid_length,
            )
        except ValueError as err:
            raise PreparationError(str(err)) from None

        fs_type, create_parameters = split_parameters(class_name, parameters)
        if self.options.extra_create_metadata:
            create_parameters[PVC_NAME_KEY] = metadata.get("name", "")
            create_parameters[PVC_NAMESPACE_KEY] = metadata.get("namespace", "")
            create_parameters[PV_NAME_KEY] = options.pv_name

        block = spec.get("volumeMode") == "Block"
        if not fs_type and not block:
            fs_type = self.options.default_fstype
        try:
            requested = storage_request_bytes(
                ((spec.get("resources") or {}).get("requests") or {}).get("storage")
            )
            caps = volume_capabilities(
                spec.get("accessModes") or [],
                block=block,
                fs_type=fs_type,
                mount_flags=storage_class.get("mountOptions") or [],
                single_node_multi_writer=(
                    ControllerCap.SINGLE_NODE_MULTI_WRITER
                    in self.connection.controller_capabilities
                ),
            )
        except ValueError as err:
            raise ProvisioningError(f"claim {metadata.get('name')!r}: {err}") from None

        # Secret templates and the PV's secret references are validated before any call.
        provisioner_secret, pv_secrets, modify_secret = _secret_references(
            class_name, parameters, options.pv_name, claim
        )
        secrets = await read_secret(self._secrets, provisioner_secret) if provisioner_secret else {}

        request = v1.CreateVolumeRequest(
            name=volume_name,
            capacity_range=v1.CapacityRange(required_bytes=requested),
            volume_capabilities=caps,
            parameters=create_parameters,
            secrets=secrets,
        )
        if attributes_class:
            request.mutable_parameters = await self._mutable_parameters(claim, attributes_class)

        protected: tuple[SourceGuard, tuple[str, str]] | None = None
        if data_source is not None:
            request.volume_content_source, guard = await self._data_sources.content_source(
                claim, data_source, requested, block
            )
            protected = (guard, data_source.key)

        if self.supports_topology:
            request.accessibility_requirements = await accessibility_requirements(
                self.driver_name,
                (claim.get("metadata") or {}).get("name", ""),
                storage_class.get("allowedTopologies") or [],
                options.selected_node_name,
                nodes=self._nodes,
                csinodes=self._csinodes,
                strict_topology=self.options.strict_topology,
                immediate_topology=self.options.immediate_topology,
            )
        if protected is not None:
            await protected[0].acquire(protected[1], metadata.get("uid", ""))
        return _Prepared(
            request,
            provisioner_secret,
            pv_secrets,
            data_source,
            protected,
            attributes_class=attributes_class,
            modify_secret=modify_secret,
        )

    def _attributes_class(self, claim: Mapping[str, Any]) -> str:
        """The VolumeAttributesClass the claim names ("" for none); a driver that cannot modify
        volumes cannot honour one."""
        name = str((claim.get("spec") or {}).get("volumeAttributesClassName") or "")
        if name and ControllerCap.MODIFY_VOLUME not in self.connection.controller_capabilities:
            claim_name = (claim.get("metadata") or {}).get("name")
            raise ProvisioningError(
                "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME "
                f"capability is not reported (claim {claim_name!r} names class "
                f'"{name}"; remove it, or use a driver that modifies volumes)',
                ProvisioningState.FINISHED,
            )
        return name

    async def _mutable_parameters(self, claim: Mapping[str, Any], name: str) -> dict[str, str]:
        """The parameters of the claim's VolumeAttributesClass ``name``, which must be for
        this driver."""
        try:
            attributes_class = await self._attribute_classes.get(name)
        except ApiException as err:
            raise PreparationError(
                f'cannot read VolumeAttributesClass "{name}" of claim '
                f"{(claim.get('metadata') or {}).get('name')!r}: {err.status} {err.reason}"
            ) from None
        driver = attributes_class.get("driverName")
        if driver != self.driver_name:
            raise ProvisioningError(
                f"VAC {name} referenced in PVC is for driver {driver} which does not match "
                f"driver name {self.driver_name}",
                ProvisioningState.FINISHED,
            )
        return {str(k): str(v) for k, v in (attributes_class.get("parameters") or {}).items()}

    def _build_volume(
        self,
        options: ProvisionOptions,
        claim: Mapping[str, Any],
        storage_class: Mapping[str, Any],
        *,
        prepared: _Prepared,
        volume: v1.Volume,
        capacity: int,
    ) -> Obj:
        spec = claim.get("spec") or {}
        attributes = dict(volume.volume_context)
        attributes[PROVISIONER_ID_KEY] = self.identity
        csi: Obj = {
            "driver": self.driver_name,
            "volumeHandle": volume.volume_id,
            "volumeAttributes": attributes,
        }
        block = spec.get("volumeMode") == "Block"
        if not block:
            mount = prepared.request.volume_capabilities[0].mount
            fs_type = mount.fs_type if mount is not None else ""
            if fs_type:
                csi["fsType"] = fs_type
        for field, ref in prepared.pv_secrets:
            csi[field] = ref.as_dict()
        if self.options.controller_publish_readonly and _read_only_many(prepared.request):
            # The attacher passes it on as ControllerPublishVolume's readonly.
            csi["readOnly"] = True
        annotations: dict[str, str] = {}
        provisioner_secret = prepared.provisioner_secret
        if provisioner_secret is not None:
            annotations[ANN_DELETION_SECRET_NAME] = provisioner_secret.name
            annotations[ANN_DELETION_SECRET_NAMESPACE] = provisioner_secret.namespace
        if prepared.modify_secret is not None:
            annotations[ANN_MODIFY_SECRET_NAME] = prepared.modify_secret.name
            annotations[ANN_MODIFY_SECRET_NAMESPACE] = prepared.modify_secret.namespace
        pv: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": options.pv_name, "annotations": annotations},
            "spec": {
                "accessModes": list(spec.get("accessModes") or []),
                "capacity": {"storage": str(Quantity.from_int(capacity, Format.BINARY_SI))},
                "volumeMode": "Block" if block else "Filesystem",
                "csi": csi,
            },
        }
        if storage_class.get("mountOptions"):
            pv["spec"]["mountOptions"] = list(storage_class["mountOptions"])
        if prepared.attributes_class:
            pv["spec"]["volumeAttributesClassName"] = prepared.attributes_class
        affinity = node_affinity(volume.accessible_topology)
        if affinity is not None:
            pv["spec"]["nodeAffinity"] = affinity
        return pv

    # -- data source protection -----------------------------------------------------------

    def cloning_protection_controller(
        self,
        informer_factory: SharedInformerFactory,
        *,
        workers: int = 1,
        rate_limiter: RateLimiter | None = None,
        registry: CollectorRegistry | None = None,
        threads: int | None = None,
    ) -> CloningProtectionController | None:
        """The controller that takes the cloning-protection finalizer off source claims once
        no clone of them is in flight, over the claim informer of ``informer_factory`` (the
        ProvisionController's); None when the driver cannot clone (no CLONE_VOLUME), as
        upstream. Run it beside the ProvisionController
        (:meth:`~pyprovlib.ProvisionController.run_beside`); while it
        runs, a clone done here hands its source to it instead of removing the finalizer at
        once, so the finalizer stays while another clone of the source is still pending.
        ``threads``, the former name of ``workers``, still works with a DeprecationWarning."""
        if threads is not None:
            warn_renamed("cloning_protection_controller", "threads", "workers")
            workers = threads
        if not self.supports_clone:
            return None
        return CloningProtectionController(
            self._data_sources.clone_guard,
            informer_factory,
            workers=workers,
            rate_limiter=rate_limiter,
            clock=self.connection.clock,
            registry=registry,
        )

    async def sweep_clone_protection(self) -> int:
        """Remove the cloning-protection finalizer from claims that no clone needs any more
        (upstream's CloningProtectionController): a finalizer left by a process that stopped
        mid-clone would otherwise block the source's deletion forever. A source is still
        needed while a clone of it is in flight here, or any claim naming it as dataSource is
        not yet Bound. Returns how many finalizers were removed."""
        return await self._data_sources.sweep_clone_protection()

    async def sweep_snapshot_protection(self) -> int:
        """Remove the snapshot-source protection finalizer from VolumeSnapshots that no
        restore needs any more (upstream's SnapshotFinalizerController): none is in flight here
        and no claim naming the snapshot as its data source is still pending. Does nothing for
        a driver without CREATE_DELETE_SNAPSHOT, or when VolumeSnapshots cannot be listed (the
        snapshot CRDs are not installed, or RBAC does not allow it). Returns how many
        finalizers were removed."""
        return await self._data_sources.sweep_snapshot_protection()

    async def run_clone_protection(self, interval: float = 60.0) -> None:
        """Sweep stale cloning-protection and snapshot-source protection finalizers every
        ``interval`` seconds until cancelled (run it next to the controller), for a program
        that does not run the :meth:`cloning_protection_controller`."""
        await self._run_sweeps(
            (self.sweep_clone_protection, self.sweep_snapshot_protection), interval
        )

    async def run_snapshot_protection(self, interval: float = 60.0) -> None:
        """Sweep stale snapshot-source protection finalizers every ``interval`` seconds until
        cancelled (the sidecars run it beside the ProvisionController, with the
        :meth:`cloning_protection_controller`)."""
        await self._run_sweeps((self.sweep_snapshot_protection,), interval)

    async def _run_sweeps(
        self, sweeps: tuple[Callable[[], Awaitable[int]], ...], interval: float
    ) -> None:
        while True:
            for sweep in sweeps:
                try:
                    await sweep()
                except ApiException as err:
                    self._log.warning(
                        "data source protection sweep failed",
                        sweep=sweep.__name__,
                        error=f"{err.status} {err.reason}",
                    )
            await self.connection.clock.sleep(interval)

    # -- delete ---------------------------------------------------------------------------

    async def delete(self, volume: V1PersistentVolume) -> None:
        """DeleteVolume with the PV's volume handle and the provisioner secret."""
        await self.delete_object(from_model(volume))

    async def delete_object(self, pv: Mapping[str, Any]) -> None:
        """:meth:`delete` on the PV's JSON, as the controller hands it over: no conversion."""
        metadata = pv.get("metadata") or {}
        pv_name = metadata.get("name", "")
        csi = (pv.get("spec") or {}).get("csi") or {}
        if not csi.get("volumeHandle"):
            raise ValueError(f"PV {pv_name} is not a CSI volume (no spec.csi.volumeHandle)")
        if csi.get("driver") != self.driver_name:
            raise IgnoredError(
                f"PV {pv_name} belongs to CSI driver {csi.get('driver')!r}, not {self.driver_name}"
            )
        attachments = await self._attachments.list()
        for attachment in attachments:
            source = (attachment.get("spec") or {}).get("source") or {}
            if source.get("persistentVolumeName") == pv_name:
                node = (attachment.get("spec") or {}).get("nodeName", "")
                raise RuntimeError(
                    f"persistentvolume {pv_name} is still attached to node {node}: "
                    "delete the VolumeAttachment (detach the volume) first"
                )
        ref = await self._deletion_secret(pv)
        secrets = await read_secret(self._secrets, ref) if ref else {}
        logger = self._log.bind(pv=pv_name, volume_id=csi["volumeHandle"])
        logger.info("calling DeleteVolume")
        await self.connection.delete_volume(
            v1.DeleteVolumeRequest(volume_id=csi["volumeHandle"], secrets=secrets)
        )
        logger.info("volume deleted")
        if self.capacity is not None:
            self.capacity.after_delete(pv)

    async def _deletion_secret(self, pv: Mapping[str, Any]) -> SecretRef | None:
        annotations = (pv.get("metadata") or {}).get("annotations") or {}
        name = annotations.get(ANN_DELETION_SECRET_NAME)
        namespace = annotations.get(ANN_DELETION_SECRET_NAMESPACE)
        if name and namespace:
            return SecretRef(name, namespace)
        # Volumes provisioned before the annotations existed: resolve from the class, where
        # only ${pv.name} is available.
        class_name = (pv.get("spec") or {}).get("storageClassName")
        if not class_name:
            return None
        try:
            storage_class = await self._classes.get(class_name)
        except ApiException as err:
            if is_not_found(err):
                self._log.info(
                    "StorageClass of the PV is gone; deleting without secrets",
                    **{"class": class_name},
                )
                return None
            raise
        return secret_reference(
            PROVISIONER_SECRET,
            storage_class.get("parameters") or {},
            (pv.get("metadata") or {}).get("name", ""),
            None,
        )


def _secret_references(
    class_name: str, parameters: Mapping[str, str], pv_name: str, claim: Mapping[str, Any]
) -> tuple[SecretRef | None, list[tuple[str, SecretRef]], SecretRef | None]:
    """The provisioner secret, the PV's secret references (by PV field) and the modify secret
    the class's templates name for ``claim``; a bad template is the class's error."""
    try:
        provisioner_secret = secret_reference(PROVISIONER_SECRET, parameters, pv_name, claim)
        # Resolved here once; the PV built after CreateVolume records them as they are.
        pv_secrets: list[tuple[str, SecretRef]] = []
        for field, params in PV_SECRETS:
            ref = secret_reference(params, parameters, pv_name, claim)
            if ref is not None:
                pv_secrets.append((field, ref))
        modify_secret = secret_reference(CONTROLLER_MODIFY_SECRET, parameters, pv_name, claim)
    except ValueError as err:
        raise PreparationError(f"StorageClass {class_name!r}: {err}") from None
    return provisioner_secret, pv_secrets, modify_secret
