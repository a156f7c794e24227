"""The Kubernetes resources pyprovlib knows: group, version, kind, plural, scope.

One table shared by the REST client, the informers and the in-memory API server, so a path
is built the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "CONFIGMAPS",
    "CSIDRIVERS",
    "CSINODES",
    "CSI_STORAGE_CAPACITIES",
    "DEPLOYMENTS",
    "EVENTS",
    "EVENTS_V1",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PERSISTENT_VOLUMES",
    "PERSISTENT_VOLUME_CLAIMS",
    "PODS",
    "REPLICA_SETS",
    "RESOURCES",
    "SECRETS",
    "STORAGE_CLASSES",
    "VOLUME_ATTACHMENTS",
    "VOLUME_ATTRIBUTES_CLASSES",
    "VOLUME_SNAPSHOTS",
    "VOLUME_SNAPSHOT_CLASSES",
    "VOLUME_SNAPSHOT_CONTENTS",
    "Resource",
    "resource_for",
]


@dataclass(frozen=True)
class Resource:
    """A REST resource: enough to build its paths and recognise its objects."""

    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = field(default=())
    singular: str = ""
    custom: bool = False
    """Served from a CustomResourceDefinition (e.g. the snapshot CRDs of external-snapshotter):
    the API server validates it against the CRD's schema and refuses strategic merge patches."""

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version_path(self) -> str:
        """``/api/v1`` or ``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The URL path of the collection, an object, or an object's subresource.

        ``namespace`` is required for a namespaced object and ignored (must be None) for a
        cluster-scoped one; a collection of a namespaced resource without a namespace is the
        all-namespaces collection.
        """
        if not self.namespaced and namespace:
            raise ValueError(f"{self.plural} is cluster-scoped; no namespace may be given")
        if self.namespaced and name is not None and not namespace:
            raise ValueError(f"{self.plural} is namespaced; a namespace is needed for {name!r}")
        parts = [self.group_version_path]
        if namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


PERSISTENT_VOLUMES = Resource(
    "",
    "v1",
    "PersistentVolume",
    "persistentvolumes",
    False,
    ("pv",),
    ("status",),
    "persistentvolume",
)
"""core/v1 PersistentVolumes (cluster-scoped; status subresource)."""
PERSISTENT_VOLUME_CLAIMS = Resource(
    "",
    "v1",
    "PersistentVolumeClaim",
    "persistentvolumeclaims",
    True,
    ("pvc",),
    ("status",),
    "persistentvolumeclaim",
)
"""core/v1 PersistentVolumeClaims (namespaced; status subresource)."""
NODES = Resource("", "v1", "Node", "nodes", False, ("no",), ("status",), "node")
"""core/v1 Nodes (cluster-scoped)."""
NAMESPACES = Resource("", "v1", "Namespace", "namespaces", False, ("ns",), ("status",), "namespace")
"""core/v1 Namespaces (cluster-scoped)."""
PODS = Resource("", "v1", "Pod", "pods", True, ("po",), ("status",), "pod")
"""core/v1 Pods (namespaced)."""
SECRETS = Resource("", "v1", "Secret", "secrets", True, (), (), "secret")
"""core/v1 Secrets (namespaced)."""
CONFIGMAPS = Resource("", "v1", "ConfigMap", "configmaps", True, ("cm",), (), "configmap")
"""core/v1 ConfigMaps (namespaced)."""
EVENTS = Resource("", "v1", "Event", "events", True, ("ev",), (), "event")
"""core/v1 Events, what the event recorders write (namespaced)."""
STORAGE_CLASSES = Resource(
    "storage.k8s.io", "v1", "StorageClass", "storageclasses", False, ("sc",), (), "storageclass"
)
"""storage.k8s.io/v1 StorageClasses (cluster-scoped)."""
VOLUME_ATTRIBUTES_CLASSES = Resource(
    "storage.k8s.io",
    "v1",
    "VolumeAttributesClass",
    "volumeattributesclasses",
    False,
    ("vac",),
    (),
    "volumeattributesclass",
)
"""storage.k8s.io/v1 VolumeAttributesClasses: a CSI driver's mutable volume parameters, named by
a claim's ``spec.volumeAttributesClassName`` (cluster-scoped; immutable but for metadata)."""
VOLUME_ATTACHMENTS = Resource(
    "storage.k8s.io",
    "v1",
    "VolumeAttachment",
    "volumeattachments",
    False,
    (),
    ("status",),
    "volumeattachment",
)
"""storage.k8s.io/v1 VolumeAttachments (cluster-scoped; status subresource)."""
CSINODES = Resource("storage.k8s.io", "v1", "CSINode", "csinodes", False, (), (), "csinode")
"""storage.k8s.io/v1 CSINodes (cluster-scoped)."""
CSIDRIVERS = Resource("storage.k8s.io", "v1", "CSIDriver", "csidrivers", False, (), (), "csidriver")
"""storage.k8s.io/v1 CSIDrivers (cluster-scoped)."""
CSI_STORAGE_CAPACITIES = Resource(
    "storage.k8s.io",
    "v1",
    "CSIStorageCapacity",
    "csistoragecapacities",
    True,
    (),
    (),
    "csistoragecapacity",
)
"""storage.k8s.io/v1 CSIStorageCapacities, the capacity a driver reports per storage class and
topology segment, which the scheduler reads for WaitForFirstConsumer claims (namespaced)."""
DEPLOYMENTS = Resource(
    "apps", "v1", "Deployment", "deployments", True, ("deploy",), ("status",), "deployment"
)
"""apps/v1 Deployments (namespaced; status subresource): the usual owner of a sidecar's
CSIStorageCapacity objects."""
REPLICA_SETS = Resource(
    "apps", "v1", "ReplicaSet", "replicasets", True, ("rs",), ("status",), "replicaset"
)
"""apps/v1 ReplicaSets (namespaced; status subresource): between a Deployment and its pods."""
LEASES = Resource("coordination.k8s.io", "v1", "Lease", "leases", True, (), (), "lease")
"""coordination.k8s.io/v1 Leases, used for leader election (namespaced)."""
EVENTS_V1 = Resource("events.k8s.io", "v1", "Event", "events", True, ("ev",), (), "event")
"""events.k8s.io/v1 Events, the newer view of the same Event objects (namespaced)."""
VOLUME_SNAPSHOTS = Resource(
    "snapshot.storage.k8s.io",
    "v1",
    "VolumeSnapshot",
    "volumesnapshots",
    True,
    ("vs",),
    ("status",),
    "volumesnapshot",
    custom=True,
)
"""snapshot.storage.k8s.io/v1 VolumeSnapshots, a user's request for a snapshot (namespaced;
status subresource; a CRD of kubernetes-csi/external-snapshotter)."""
VOLUME_SNAPSHOT_CONTENTS = Resource(
    "snapshot.storage.k8s.io",
    "v1",
    "VolumeSnapshotContent",
    "volumesnapshotcontents",
    False,
    ("vsc", "vscs"),
    ("status",),
    "volumesnapshotcontent",
    custom=True,
)
"""snapshot.storage.k8s.io/v1 VolumeSnapshotContents, the snapshot on the storage system
(cluster-scoped; status subresource; a CRD of kubernetes-csi/external-snapshotter)."""
VOLUME_SNAPSHOT_CLASSES = Resource(
    "snapshot.storage.k8s.io",
    "v1",
    "VolumeSnapshotClass",
    "volumesnapshotclasses",
    False,
    ("vsclass", "vsclasses"),
    (),
    "volumesnapshotclass",
    custom=True,
)
"""snapshot.storage.k8s.io/v1 VolumeSnapshotClasses (cluster-scoped; a CRD of
kubernetes-csi/external-snapshotter)."""

RESOURCES: tuple[Resource, ...] = (
    PERSISTENT_VOLUMES,
    PERSISTENT_VOLUME_CLAIMS,
    NODES,
    NAMESPACES,
    PODS,
    SECRETS,
    CONFIGMAPS,
    EVENTS,
    STORAGE_CLASSES,
    VOLUME_ATTRIBUTES_CLASSES,
    VOLUME_ATTACHMENTS,
    CSINODES,
    CSIDRIVERS,
    CSI_STORAGE_CAPACITIES,
    DEPLOYMENTS,
    REPLICA_SETS,
    LEASES,
    EVENTS_V1,
    VOLUME_SNAPSHOTS,
    VOLUME_SNAPSHOT_CONTENTS,
    VOLUME_SNAPSHOT_CLASSES,
)
"""Every resource pyprovlib knows, in one table (the in-memory API server serves these)."""


def resource_for(api_version: str, kind_or_plural: str) -> Resource:
    """Look a known resource up by apiVersion and kind (or plural).

    Raises ``LookupError`` naming what was asked for when pyprovlib does not know it.
    """
    for r in RESOURCES:
        if r.api_version == api_version and kind_or_plural in (r.kind, r.plural):
            return r
    raise LookupError(f"unknown resource {kind_or_plural!r} in {api_version!r}")
