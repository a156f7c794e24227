"""Volumes created from a data source (upstream's clone and snapshot-restore paths): which
sources a claim may name and what the driver must support for them, the VolumeContentSource
sent with CreateVolume, and the finalizers protecting a source claim (cloning protection) or
VolumeSnapshot (snapshot-source protection) while a volume is created from it: added here
before CreateVolume; removed by the
:class:`~pyprovlib.csi.provisioner._clone_controller.CloningProtectionController` (clone
sources, upstream's ``clone_controller.go``) or once the restore is done, with sweeps that
remove stale ones (upstream's SnapshotFinalizerController)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from pyprovlib._provisioner import IgnoredError, ProvisioningError
from pyprovlib.controller._provision.protection import FINALIZER_PROVISIONING
from pyprovlib.csi._connection import CSIConnection
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner._common import CachedReader, PreparationError
from pyprovlib.kube._errors import ApiException, is_conflict, is_not_found
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._quantity import parse_storage_size
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    VOLUME_SNAPSHOT_CONTENTS,
    VOLUME_SNAPSHOTS,
)
from pyprovlib.kube._rest import ResourceClient

__all__ = [
    "ANN_ALLOW_VOLUME_MODE_CHANGE",
    "CLONE_FINALIZER",
    "SNAPSHOT_API_GROUP",
    "SNAPSHOT_FINALIZER",
    "SNAPSHOT_KIND",
    "DataSources",
    "SourceGuard",
    "SourceRef",
    "claim_data_source",
    "clone_holds_source",
    "clone_source_key",
    "clones_in_flight",
    "requested_before_deletion",
]

ControllerCap = v1.ControllerServiceCapabilityRpcType

CLONE_FINALIZER: Final = "provisioner.storage.kubernetes.io/cloning-protection"
"""Finalizer on a clone's source claim while the clone is being provisioned."""
SNAPSHOT_FINALIZER: Final = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"
"""Finalizer on a VolumeSnapshot while a volume is being restored from it."""
SNAPSHOT_API_GROUP: Final = "snapshot.storage.k8s.io"
"""The API group of VolumeSnapshots, as a claim's ``dataSource.apiGroup`` names it."""
SNAPSHOT_KIND: Final = "VolumeSnapshot"
"""The kind of a claim's data source that restores a snapshot."""
ANN_ALLOW_VOLUME_MODE_CHANGE: Final = "snapshot.storage.kubernetes.io/allow-volume-mode-change"
"""VolumeSnapshotContent annotation that, set to true, lets a claim restore the snapshot with a
volumeMode other than its source volume's (see ``prevent_volume_mode_conversion``)."""


def parse_go_bool(text: str) -> bool | None:
    """Go's strconv.ParseBool: 1/t/T/TRUE/true/True or 0/f/F/FALSE/false/False, else None."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


@dataclass(frozen=True)
class SourceRef:
    """A claim's data source, from ``dataSource`` or else ``dataSourceRef`` (upstream's
    ``dataSource``): kind, API group ('' for the core group), name and namespace."""

    kind: str
    api_group: str
    name: str
    namespace: str

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name)."""
        return (self.namespace, self.name)

    def describe(self) -> str:
        """``Kind namespace/name`` for messages."""
        return f"{self.kind} {self.namespace}/{self.name}"


def claim_data_source(claim: Mapping[str, Any]) -> SourceRef | None:
    """The claim's data source: ``spec.dataSource``, else ``spec.dataSourceRef`` (whose
    namespace defaults to the claim's); None when it names neither."""
    metadata = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    own_namespace = metadata.get("namespace", "")
    source = spec.get("dataSource")
    if isinstance(source, Mapping):
        namespace = own_namespace
    else:
        source = spec.get("dataSourceRef")
        if not isinstance(source, Mapping):
            return None
        namespace = source.get("namespace") or own_namespace
    return SourceRef(
        kind=str(source.get("kind") or ""),
        api_group=str(source.get("apiGroup") or ""),
        name=str(source.get("name") or ""),
        namespace=str(namespace),
    )


def pending_sources(claims: Iterable[Mapping[str, Any]], kind: str) -> set[tuple[str, str]]:
    """(namespace, name) of the data sources of ``kind`` that a not yet Bound claim names."""
    sources: set[tuple[str, str]] = set()
    for claim in claims:
        metadata = claim.get("metadata") or {}
        source = claim_data_source(claim)
        if source is None or source.kind != kind:
            continue
        if kind == "PersistentVolumeClaim" and source.api_group:
            continue
        if kind == SNAPSHOT_KIND and source.api_group not in ("", SNAPSHOT_API_GROUP):
            continue
        if (claim.get("status") or {}).get("phase") == "Bound" or metadata.get("deletionTimestamp"):
            continue
        sources.add(source.key)
    return sources


def clone_source_key(claim: Mapping[str, Any]) -> str | None:
    """``namespace/name`` of the claim that ``claim`` is a clone of (its data source is a
    PersistentVolumeClaim of the core group), None when it is no clone."""
    source = claim_data_source(claim)
    if source is None or source.kind != "PersistentVolumeClaim" or source.api_group:
        return None
    return f"{source.namespace}/{source.name}"


def _timestamp(value: object) -> datetime | None:
    """An RFC 3339 time of the API (``2024-05-01T10:00:00Z``), None when absent or not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def requested_before_deletion(claim: Mapping[str, Any], source: Mapping[str, Any]) -> bool:
    """Whether ``claim`` existed when the deletion of ``source`` was requested: no deletion
    requested, or the claim was created no later than it (the API's times have whole seconds:
    a claim created in the same second counts as earlier). A clone that existed then is one the
    cloning-protection finalizer protects; one created after it is refused."""
    deleted = _timestamp((source.get("metadata") or {}).get("deletionTimestamp"))
    if deleted is None:
        return True
    created = _timestamp((claim.get("metadata") or {}).get("creationTimestamp"))
    return created is None or created <= deleted


def clone_holds_source(claim: Mapping[str, Any], source: Mapping[str, Any]) -> bool:
    """Whether ``claim`` is a clone of the claim ``source`` still in flight, so ``source`` must
    keep its cloning-protection finalizer (upstream: the clone is Pending). In flight: ``claim``
    names ``source`` as its data source and is Pending (not Bound, nor Lost); if it is being
    deleted, only while it still carries the provisioning-protection finalizer (its volume may
    still be being created: the provisioner finishes and deletes it before letting the claim
    go); and if ``source`` is being deleted, only when ``claim`` existed when that deletion was
    requested (a newer clone is refused, so it must not hold the source forever)."""
    source_meta = source.get("metadata") or {}
    if clone_source_key(claim) != f"{source_meta.get('namespace')}/{source_meta.get('name')}":
        return False
    if (claim.get("status") or {}).get("phase") not in (None, "", "Pending"):
        return False
    metadata = claim.get("metadata") or {}
    if metadata.get("deletionTimestamp") and FINALIZER_PROVISIONING not in (
        metadata.get("finalizers") or []
    ):
        return False
    return requested_before_deletion(claim, source)


async def clones_in_flight(claims: ResourceClient, source: Mapping[str, Any]) -> list[str]:
    """Names of the clones of the claim ``source`` in flight (:func:`clone_holds_source`) as
    the API server lists them now (``claims`` is a client of PersistentVolumeClaims): a cache
    may not show a clone created a moment ago, so this is asked before the cloning-protection
    finalizer is removed."""
    namespace = (source.get("metadata") or {}).get("namespace", "")
    fresh = (await claims.list(namespace)).get("items") or []
    return [
        (c.get("metadata") or {}).get("name", "") for c in fresh if clone_holds_source(c, source)
    ]


async def _read(
    client: ResourceClient, name: str, namespace: str | None = None, *, failure: str
) -> Obj:
    """GET ``name`` through ``client``; an API error becomes a PreparationError saying
    ``failure`` and the status (provisioning is retried)."""
    try:
        return await client.get(name, namespace)
    except ApiException as err:
        raise PreparationError(f"{failure}: {err.status} {err.reason}") from None


class SourceGuard:
    """A finalizer held on data sources (clone source claims, VolumeSnapshots) while volumes
    are being created from them: added before the first CreateVolume from a source; when no
    CreateVolume from it is in flight in this process any more, removed, or — while
    :attr:`on_released` is set (a
    :class:`~pyprovlib.csi.provisioner._clone_controller.CloningProtectionController` runs) —
    handed to that callback, which decides."""

    def __init__(self, rest: ResourceClient, finalizer: str, what: str, logger: Any) -> None:
        self.rest = rest
        self.finalizer = finalizer
        self.what = what
        self.holders: dict[tuple[str, str], set[str]] = {}
        self.lock = asyncio.Lock()
        self.on_released: Callable[[tuple[str, str]], None] | None = None
        """Called with a source no CreateVolume of this process uses any more, instead of
        removing its finalizer (which stays while other claims still need the source)."""
        self._log = logger

    async def acquire(self, source: tuple[str, str], uid: str) -> None:
        """Hold ``source`` for the claim ``uid`` (raises PreparationError when the finalizer
        cannot be added)."""
        async with self.lock:
            holders = self.holders.setdefault(source, set())
            first = not holders
            holders.add(uid)
            if first:
                try:
                    await self.set_finalizer(source, present=True)
                except ApiException as err:
                    holders.discard(uid)
                    if not holders:
                        del self.holders[source]
                    raise PreparationError(
                        f"cannot protect {self._describe(source)} with the "
                        f"{self.finalizer} finalizer: {err.status} {err.reason}"
                    ) from None

    async def release(self, source: tuple[str, str], uid: str) -> None:
        """Let go of ``source`` for ``uid``; the last holder removes the finalizer."""
        async with self.lock:
            holders = self.holders.get(source)
            if holders is None:
                return
            holders.discard(uid)
            if holders:
                return
            del self.holders[source]
            if self.on_released is not None:
                self.on_released(source)
                return
            await self._remove_finalizer(source, "cannot remove a data source protection finalizer")

    async def remove_unheld(self, source: tuple[str, str]) -> bool:
        """Remove the finalizer from ``source`` unless a CreateVolume of this process holds it
        (checked under the lock :meth:`acquire` holds while adding it, so a clone starting
        meanwhile keeps it). Returns whether it was removed (or already absent); API errors
        are raised."""
        async with self.lock:
            if source in self.holders:
                return False
            await self.set_finalizer(source, present=False)
            return True

    async def _remove_finalizer(self, source: tuple[str, str], failure: str) -> bool:
        """Remove the finalizer from ``source``; when the API server refuses, log ``failure``
        and return False. Left in place, the finalizer only delays the source's deletion
        (until the sweep removes it); the warning says so."""
        try:
            await self.set_finalizer(source, present=False)
        except ApiException as err:
            self._log.warning(
                failure,
                finalizer=self.finalizer,
                source=self._describe(source),
                error=f"{err.status} {err.reason}",
            )
            return False
        return True

    def _describe(self, source: tuple[str, str]) -> str:
        return f"{self.what} {source[0]}/{source[1]}"

    async def set_finalizer(self, source: tuple[str, str], *, present: bool) -> None:
        """Add or remove the finalizer (read-modify-write, retried on conflicts)."""
        namespace, name = source
        for _attempt in range(5):
            try:
                obj = await self.rest.get(name, namespace)
            except ApiException as err:
                if not present and is_not_found(err):
                    return
                raise
            metadata = obj.setdefault("metadata", {})
            finalizers = list(metadata.get("finalizers") or [])
            if (self.finalizer in finalizers) == present:
                return
            if present:
                finalizers.append(self.finalizer)
            else:
                finalizers = [f for f in finalizers if f != self.finalizer]
            metadata["finalizers"] = finalizers
            try:
                await self.rest.replace(obj)
                return
            except ApiException as err:
                if present and is_not_found(err):
                    raise
                if not present and is_not_found(err):
                    return
                if not is_conflict(err):
                    raise
        raise ApiException(status=409, reason=f"Conflict: the {self.what} kept changing")

    async def sweep(
        self,
        objects: Iterable[Obj],
        still_needed: Callable[[tuple[str, str]], Awaitable[bool]],
    ) -> int:
        """Remove the finalizer from ``objects`` that no volume being created needs any more:
        neither held here nor named by a pending claim. ``still_needed(key)`` re-checks a
        candidate against the API server (a cache may not show a claim created a moment ago).
        Returns how many finalizers were removed."""
        removed = 0
        for obj in objects:
            metadata = obj.get("metadata") or {}
            if self.finalizer not in (metadata.get("finalizers") or []):
                continue
            key = (metadata.get("namespace", ""), metadata.get("name", ""))
            if key in self.holders or await still_needed(key):
                continue
            async with self.lock:
                if key in self.holders:
                    continue  # a restore or clone started meanwhile
                if not await self._remove_finalizer(
                    key, "cannot remove a stale data source protection finalizer"
                ):
                    continue
            removed += 1
            self._log.info(
                "removed a stale data source protection finalizer",
                finalizer=self.finalizer,
                source=self._describe(key),
            )
        return removed


class DataSources:
    """A CSIProvisioner's data-source handling: checks a claim's source, builds the
    VolumeContentSource for CreateVolume, and holds and sweeps the protection finalizers
    (:attr:`clone_guard` on source claims, :attr:`snapshot_guard` on VolumeSnapshots)."""

    def __init__(
        self,
        client: ApiClient,
        connection: CSIConnection,
        claim_cache: CachedReader,
        *,
        prevent_volume_mode_conversion: bool,
        logger: Any,
    ) -> None:
        self.connection = connection
        self.driver_name = connection.driver_name
        self.prevent_volume_mode_conversion = prevent_volume_mode_conversion
        self._claim_cache = claim_cache
        self._claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        self._volumes = ResourceClient(client, PERSISTENT_VOLUMES)
        self._snapshots = ResourceClient(client, VOLUME_SNAPSHOTS)
        self._snapshot_contents = ResourceClient(client, VOLUME_SNAPSHOT_CONTENTS)
        self._log = logger
        self.clone_guard = SourceGuard(self._claims, CLONE_FINALIZER, "clone source claim", logger)
        self.snapshot_guard = SourceGuard(
            self._snapshots, SNAPSHOT_FINALIZER, "VolumeSnapshot", logger
        )

    @property
    def supports_clone(self) -> bool:
        """The driver has CLONE_VOLUME."""
        return ControllerCap.CLONE_VOLUME in self.connection.controller_capabilities

    @property
    def supports_snapshot(self) -> bool:
        """The driver has CREATE_DELETE_SNAPSHOT (needed to restore a VolumeSnapshot)."""
        return ControllerCap.CREATE_DELETE_SNAPSHOT in self.connection.controller_capabilities

    def check(
        self, claim: Mapping[str, Any], source: SourceRef, recorder: EventRecorder | None
    ) -> None:
        """What upstream checks before anything else (final errors): a name, the claim's own
        namespace, the right API group, and the driver capability the source needs."""
        metadata = claim.get("metadata") or {}
        claim_key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        if not source.name:
            raise ProvisioningError(
                f"claim {claim_key}: its data source {source.kind or '(no kind)'} has no name; "
                "set spec.dataSource.name"
            )
        if source.namespace != metadata.get("namespace"):
            raise ProvisioningError(
                f"claim {claim_key} names {source.describe()} as its data source "
                "(dataSourceRef.namespace): cross-namespace data sources (the "
                "CrossNamespaceVolumeDataSource feature with ReferenceGrants) are not "
                f"supported by this provisioner; use a source in namespace "
                f"{metadata.get('namespace')}"
            )
        if source.kind == SNAPSHOT_KIND:
            if source.api_group != SNAPSHOT_API_GROUP:
                raise ProvisioningError(
                    f"claim {claim_key}: data source VolumeSnapshot {source.name!r} must have "
                    f"apiGroup {SNAPSHOT_API_GROUP}, not {source.api_group or 'the core group'}"
                )
            if not self.supports_snapshot:
                raise ProvisioningError(
                    f"CSI driver {self.driver_name} does not support snapshot restore: "
                    "controller CREATE_DELETE_SNAPSHOT capability is not reported, so claim "
                    f"{claim_key} cannot be restored from {source.describe()}; use a "
                    "StorageClass whose driver supports snapshots, or remove the data source"
                )
        elif source.kind == "PersistentVolumeClaim" and not source.api_group:
            if not self.supports_clone:
                raise ProvisioningError(
                    f"CSI driver {self.driver_name} does not support clone operations: "
                    "controller CLONE_VOLUME capability is not reported, so claim "
                    f"{claim_key} cannot be cloned from {source.describe()}"
                )
        else:
            # Upstream: any other kind is a volume populator's (AnyVolumeDataSource); the
            # populator creates the volume and binds it, so there is nothing to do here.
            if recorder is not None:
                recorder.event(
                    {**claim, "kind": "PersistentVolumeClaim", "apiVersion": "v1"},
                    "Normal",
                    "Provisioning",
                    "Assuming an external populator will provision the volume",
                )
            raise IgnoredError(
                f"data source {source.api_group or 'core'}/{source.kind} {source.name!r} is not "
                "handled by the provisioner, assuming an external populator will provision it"
            )

    async def content_source(
        self, claim: Mapping[str, Any], data_source: SourceRef, requested: int, block: bool
    ) -> tuple[v1.VolumeContentSource, SourceGuard]:
        if data_source.kind == SNAPSHOT_KIND:
            content = await self._snapshot_source(claim, data_source, requested)
            return content, self.snapshot_guard
        return await self._clone_source(claim, data_source, requested, block), self.clone_guard

    async def _clone_source(
        self, claim: Mapping[str, Any], data_source: SourceRef, requested: int, block: bool
    ) -> v1.VolumeContentSource:
        namespace, name = data_source.key
        source = await _read(
            self._claims,
            name,
            namespace,
            failure=f"error getting clone source claim {namespace}/{name}",
        )
        source_meta = source.get("metadata") or {}
        source_spec = source.get("spec") or {}
        if source_meta.get("deletionTimestamp") and not (
            CLONE_FINALIZER in (source_meta.get("finalizers") or [])
            and requested_before_deletion(claim, source)
        ):
            # With our finalizer on it, a clone that existed when the deletion was requested
            # is one the finalizer protects: finish it (after a restart, a timed-out
            # CreateVolume). Upstream refuses every clone of a source being deleted, so such
            # a clone and its source wait for each other until one is deleted by hand.
            claim_meta = claim.get("metadata") or {}
            raise PreparationError(
                f"clone source claim {namespace}/{name} is being deleted: clone claim "
                f"{claim_meta.get('namespace')}/{claim_meta.get('name')} was created after its "
                "deletion was requested; clone another claim, or delete this clone"
            )
        if (source.get("status") or {}).get("phase") != "Bound":
            raise PreparationError(f"clone source claim {namespace}/{name} is not bound")
        claim_class = (claim.get("spec") or {}).get("storageClassName")
        if source_spec.get("storageClassName") != claim_class:
            raise PreparationError(
                "the source claim and the clone must be in the same storage class: source is "
                f"in {source_spec.get('storageClassName')!r}, clone in {claim_class!r}"
            )
        source_block = source_spec.get("volumeMode") == "Block"
        if source_block != block:
            raise PreparationError(
                f"clone source claim {namespace}/{name} has a different volumeMode"
            )
        source_size = ((source.get("status") or {}).get("capacity") or {}).get("storage") or (
            (source_spec.get("resources") or {}).get("requests") or {}
        ).get("storage")
        try:
            source_bytes = parse_storage_size(source_size, what="source claim size")
        except ValueError as err:
            raise PreparationError(str(err)) from None
        if requested < source_bytes:
            raise PreparationError(
                "the clone's request must be greater than or equal in size to the source "
                f"claim: requested {requested} but source is {source_bytes}"
            )
        volume_name = source_spec.get("volumeName", "")
        source_pv = await _read(
            self._volumes,
            volume_name,
            failure=f"error getting the PV {volume_name!r} of clone source claim "
            f"{namespace}/{name}",
        )
        claim_ref = (source_pv.get("spec") or {}).get("claimRef") or {}
        if claim_ref.get("uid") != source_meta.get("uid"):
            raise PreparationError(
                f"the PV {volume_name!r} is not bound to clone source claim {namespace}/{name}"
            )
        csi = (source_pv.get("spec") or {}).get("csi") or {}
        if csi.get("driver") != self.driver_name:
            raise PreparationError(
                f"the clone source's PV {volume_name!r} belongs to another CSI driver"
                f" ({csi.get('driver')!r})"
            )
        return v1.VolumeContentSource(
            volume=v1.VolumeContentSourceVolumeSource(volume_id=csi.get("volumeHandle", ""))
        )

    async def _snapshot_source(
        self, claim: Mapping[str, Any], data_source: SourceRef, requested: int
    ) -> v1.VolumeContentSource:
        """Upstream's ``getSnapshotSource``: the VolumeSnapshot and its VolumeSnapshotContent
        must point at each other, belong to this driver, be ready, have a snapshot handle, fit
        in the claim and (with ``prevent_volume_mode_conversion``) keep the volume mode."""
        namespace, name = data_source.key
        what = f"VolumeSnapshot {namespace}/{name}"
        claim_meta = claim.get("metadata") or {}
        claim_key = f"{claim_meta.get('namespace')}/{claim_meta.get('name')}"
        try:
            snapshot = await self._snapshots.get(name, namespace)
        except ApiException as err:
            if is_not_found(err):
                raise PreparationError(
                    f"{what} not found: create it, or fix the data source of claim "
                    f"{claim_key}; provisioning is retried until it exists"
                ) from None
            raise PreparationError(f"error getting {what}: {err.status} {err.reason}") from None
        snap_meta = snapshot.get("metadata") or {}
        if snap_meta.get("deletionTimestamp") and SNAPSHOT_FINALIZER not in (
            snap_meta.get("finalizers") or []
        ):
            # With our finalizer on it, a restore from it started before the deletion: finish
            # it. Without, this is a new restore from a snapshot that is going away.
            raise PreparationError(
                f"{what} is being deleted: restore claim {claim_key} from another snapshot"
            )
        status = snapshot.get("status") or {}
        content_name = status.get("boundVolumeSnapshotContentName")
        if not content_name:
            raise PreparationError(
                f"{what} is not bound to a VolumeSnapshotContent yet; provisioning is retried "
                "until the snapshot controller binds it"
            )
        content = await _read(
            self._snapshot_contents,
            content_name,
            failure=f"{what} is not bound: error getting its VolumeSnapshotContent {content_name}",
        )
        content_spec = content.get("spec") or {}
        ref = content_spec.get("volumeSnapshotRef") or {}
        if (ref.get("uid"), ref.get("namespace"), ref.get("name")) != (
            snap_meta.get("uid"),
            namespace,
            name,
        ):
            raise PreparationError(
                f"{what} is not bound: its VolumeSnapshotContent {content_name} points at "
                f"another snapshot ({ref.get('namespace')}/{ref.get('name')}, uid "
                f"{ref.get('uid')}); a snapshot is usable once it and its content point at "
                "each other"
            )
        driver = content_spec.get("driver")
        if driver != self.driver_name:
            raise PreparationError(
                f"{what} was taken by CSI driver {driver!r} (VolumeSnapshotContent "
                f"{content_name}), not {self.driver_name}: restore it with a StorageClass of "
                "that driver"
            )
        if status.get("readyToUse") is not True:
            raise PreparationError(
                f"{what} is not ready to use yet; provisioning is retried until it is"
            )
        handle = (content.get("status") or {}).get("snapshotHandle")
        if not handle:
            raise PreparationError(
                f"the snapshot handle of {what} is not available yet (VolumeSnapshotContent "
                f"{content_name} has no status.snapshotHandle)"
            )
        restore_size = status.get("restoreSize")
        if restore_size is not None:
            try:
                restore_bytes = parse_storage_size(
                    str(restore_size) if isinstance(restore_size, int) else restore_size,
                    what=f"restoreSize of {what}",
                )
            except ValueError as err:
                raise PreparationError(str(err)) from None
            if requested < restore_bytes:
                raise PreparationError(
                    f"requested volume size {requested} is less than the size {restore_bytes} "
                    f"of the source {what}: claim {claim_key} must request at least "
                    f"{restore_size}"
                )
            # A larger volume is fine: the driver expands what it restores.
        if self.prevent_volume_mode_conversion:
            self._check_volume_mode(claim, claim_key, what, content)
        return v1.VolumeContentSource(
            snapshot=v1.VolumeContentSourceSnapshotSource(snapshot_id=handle)
        )

    @staticmethod
    def _check_volume_mode(
        claim: Mapping[str, Any], claim_key: str, what: str, content: Obj
    ) -> None:
        """A restore may change the volume mode only when the content allows it."""
        source_mode = (content.get("spec") or {}).get("sourceVolumeMode")
        claim_mode = (claim.get("spec") or {}).get("volumeMode")
        if not source_mode or not claim_mode or source_mode == claim_mode:
            return
        content_name = (content.get("metadata") or {}).get("name", "")
        refusal = (
            f"claim {claim_key} (volumeMode {claim_mode}) would change the volume mode of the "
            f"source volume ({source_mode}) of {what} but does not have permission to do so: "
        )
        fix = (
            f"; annotate VolumeSnapshotContent {content_name} with "
            f'{ANN_ALLOW_VOLUME_MODE_CHANGE}="true" to allow it, or request volumeMode '
            f"{source_mode}"
        )
        annotations = (content.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(ANN_ALLOW_VOLUME_MODE_CHANGE)
        if value is None:
            raise PreparationError(
                f"{refusal}annotation {ANN_ALLOW_VOLUME_MODE_CHANGE} is not present on "
                f"VolumeSnapshotContent {content_name}{fix}"
            )
        allowed = parse_go_bool(value)
        if allowed is None:
            raise PreparationError(
                f"{refusal}annotation {ANN_ALLOW_VOLUME_MODE_CHANGE} on VolumeSnapshotContent "
                f"{content_name} is {value!r}, not a boolean{fix}"
            )
        if not allowed:
            raise PreparationError(
                f"{refusal}{ANN_ALLOW_VOLUME_MODE_CHANGE} is set to false on "
                f"VolumeSnapshotContent {content_name}{fix}"
            )

    async def sweep_clone_protection(self) -> int:
        """Does the work of :meth:`CSIProvisioner.sweep_clone_protection
        <pyprovlib.csi.provisioner._controller.CSIProvisioner.sweep_clone_protection>`
        (documented there)."""
        claims = await self._claim_cache.list()
        sources: dict[tuple[str, str], Obj] = {}
        clones: dict[str, list[Obj]] = {}
        for claim in claims:
            metadata = claim.get("metadata") or {}
            sources[(metadata.get("namespace", ""), metadata.get("name", ""))] = claim
            key = clone_source_key(claim)
            if key is not None:
                clones.setdefault(key, []).append(claim)

        async def still_needed(key: tuple[str, str]) -> bool:
            source = sources[key]
            cached = clones.get(f"{key[0]}/{key[1]}", [])
            return any(clone_holds_source(c, source) for c in cached) or bool(
                await clones_in_flight(self._claims, source)
            )

        return await self.clone_guard.sweep(claims, still_needed)

    async def sweep_snapshot_protection(self) -> int:
        """Does the work of :meth:`CSIProvisioner.sweep_snapshot_protection
        <pyprovlib.csi.provisioner._controller.CSIProvisioner.sweep_snapshot_protection>`
        (documented there)."""
        if not self.supports_snapshot:
            return 0
        try:
            snapshots = (await self._snapshots.list()).get("items") or []
        except ApiException as err:
            if err.status in (403, 404):
                self._log.debug(
                    "cannot list VolumeSnapshots; snapshot-source protection sweep skipped",
                    error=f"{err.status} {err.reason}",
                )
                return 0
            raise
        if not any(
            SNAPSHOT_FINALIZER in ((o.get("metadata") or {}).get("finalizers") or [])
            for o in snapshots
        ):
            return 0
        pending = pending_sources(await self._claim_cache.list(), SNAPSHOT_KIND)

        async def still_needed(key: tuple[str, str]) -> bool:
            if key in pending:
                return True
            fresh = (await self._claims.list(key[0])).get("items") or []
            return key in pending_sources(fresh, SNAPSHOT_KIND)

        return await self.snapshot_guard.sweep(snapshots, still_needed)
