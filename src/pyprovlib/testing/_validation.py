"""Defaulting, validation and immutability rules of kube-apiserver for the resources it serves.

Only what storage controllers and kubectl observe: the defaults they read back, the required
fields whose absence a real cluster answers with 422 Invalid, and the fields a real cluster
refuses to change.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pyprovlib.controller._provision import ANN_BETA_STORAGE_CLASS
from pyprovlib.kube import _resources as R
from pyprovlib.kube._objects import is_dns1123_label, is_dns1123_subdomain
from pyprovlib.kube._quantity import parse_quantity
from pyprovlib.kube._resources import Resource
from pyprovlib.testing._causes import (
    Cause,
    forbidden,
    invalid_object,
    invalid_value,
    required,
    unsupported,
)
from pyprovlib.testing._crd_validation import crd_immutable_causes, crd_schema_causes
from pyprovlib.testing._labels import SUBDOMAIN_MSG, label_selector_causes, selector_matches
from pyprovlib.testing._typecheck import PV_SOURCES, type_check
from pyprovlib.testing._vac_validation import (
    pv_vac_causes,
    pv_vac_update_causes,
    pvc_vac_causes,
    pvc_vac_update_causes,
    vac_causes,
    vac_update_causes,
)

__all__ = [
    "Cause",
    "default_on_create",
    "default_on_update",
    "type_check",
    "validate_create",
    "validate_name",
    "validate_status_update",
    "validate_update",
]


_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def validate_name(resource: Resource, name: str) -> list[Cause]:
    """DNS-1123 label for namespaces, DNS-1123 subdomain for everything else."""
    if resource is R.NAMESPACES:
        if not is_dns1123_label(name):
            return [invalid_value("metadata.name", name, _LABEL_MSG)]
        return []
    if not is_dns1123_subdomain(name):
        return [invalid_value("metadata.name", name, SUBDOMAIN_MSG)]
    return []


def _meta_causes(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    meta = obj.get("metadata") or {}
    causes: list[Cause] = []
    name = meta.get("name") or ""
    if not name:
        causes.append(required("metadata.name", "name or generateName is required"))
    else:
        causes.extend(validate_name(resource, name))
    causes.extend(_owner_causes(meta.get("ownerReferences")))
    return causes


def _owner_causes(refs: Any) -> list[Cause]:
    """ValidateOwnerReferences: at most one reference is the controller."""
    if not isinstance(refs, list):
        return []
    controllers = [r for r in refs if isinstance(r, dict) and r.get("controller") is True]
    if len(controllers) < 2:
        return []
    first, second = (f"{r.get('kind')}/{r.get('name')}" for r in controllers[:2])
    return [
        invalid_object(
            "metadata.ownerReferences",
            refs,
            'Only one reference can have Controller set to true. Found "true" in references '
            f"for {first} and {second}",
        )
    ]


def _positive_quantity(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value > 0
    try:
        return isinstance(value, str) and parse_quantity(value).sign() > 0
    except ValueError:
        return False


CROSS_NAMESPACE_VOLUME_DATA_SOURCE = "CrossNamespaceVolumeDataSource"
"""The alpha feature gate letting a claim's dataSourceRef name another namespace (off by
default in kube-apiserver, and in :class:`~pyprovlib.testing.ApiServer`)."""


def default_on_create(
    resource: Resource, obj: dict[str, Any], gates: Collection[str] = frozenset()
) -> None:
    """Defaults and status resets the real registries apply when an object is created;
    ``gates``: the enabled alpha feature gates."""
    spec = obj.get("spec")
    if resource is R.PERSISTENT_VOLUME_CLAIMS:
        if isinstance(spec, dict):
            spec.setdefault("volumeMode", "Filesystem")
            _prepare_data_sources(spec, None, gates)
        obj["status"] = {"phase": "Pending"}
    elif resource is R.PERSISTENT_VOLUMES:
        if isinstance(spec, dict):
            spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
            spec.setdefault("volumeMode", "Filesystem")
        obj["status"] = {"phase": "Pending"}
    elif resource is R.STORAGE_CLASSES:
        obj.setdefault("reclaimPolicy", "Delete")
        obj.setdefault("volumeBindingMode", "Immediate")
    elif resource is R.NAMESPACES:
        meta = obj.setdefault("metadata", {})
        labels = meta.get("labels") or {}
        labels["kubernetes.io/metadata.name"] = meta.get("name", "")
        meta["labels"] = labels
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
    elif resource is R.PODS:
        if isinstance(spec, dict):
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("securityContext", {})
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif resource is R.SECRETS:
        obj.setdefault("type", "Opaque")
    elif resource is R.VOLUME_ATTACHMENTS:
        obj["status"] = {"attached": False}
    elif resource is R.CSIDRIVERS and isinstance(spec, dict):
        spec.setdefault("attachRequired", True)
        spec.setdefault("podInfoOnMount", False)
        spec.setdefault("requiresRepublish", False)
        spec.setdefault("storageCapacity", False)
        spec.setdefault("seLinuxMount", False)
        spec.setdefault("fsGroupPolicy", "ReadWriteOnceWithFSType")
        spec.setdefault("volumeLifecycleModes", ["Persistent"])
    elif resource is R.NODES:
        obj.setdefault("spec", {})
        obj.setdefault("status", {})
    elif resource in (R.VOLUME_SNAPSHOTS, R.VOLUME_SNAPSHOT_CONTENTS):
        # A CRD with the status subresource ignores the status of a create.
        obj.pop("status", None)
    elif resource is R.CSI_STORAGE_CAPACITIES:
        _canonical_quantities(obj, ("capacity", "maximumVolumeSize"))
    elif resource in (R.DEPLOYMENTS, R.REPLICA_SETS) and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        if resource is R.DEPLOYMENTS:
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault(
                "strategy",
                {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
                },
            )
        template = spec.get("template")
        pod_spec = template.get("spec") if isinstance(template, dict) else None
        if isinstance(pod_spec, dict):
            _default_pod_template(pod_spec)
        obj["status"] = {} if resource is R.DEPLOYMENTS else {"replicas": 0}


def _canonical_quantities(obj: dict[str, Any], fields: tuple[str, ...]) -> None:
    """resource.Quantity's decoding: a valid quantity (a JSON string or number) is kept in its
    canonical form (``0.5Gi`` is stored as ``512Mi``); what does not parse is left for the
    type check to refuse."""
    for field in fields:
        value = obj.get(field)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            continue
        try:
            obj[field] = parse_quantity(str(value)).canonical()
        except ValueError:
            continue


def _default_pod_template(spec: dict[str, Any]) -> None:
    """The pod defaults a workload's template gets (SetDefaults_PodSpec, SetDefaults_Container)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        image = str(container.get("image") or "")
        tag = image.rsplit("/", 1)[-1].partition(":")[2] if "@" not in image else "digest"
        container.setdefault(
            "imagePullPolicy", "Always" if tag in ("", "latest") else "IfNotPresent"
        )
        container.setdefault("resources", {})
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")


def default_on_update(
    resource: Resource,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    gates: Collection[str] = frozenset(),
) -> None:
    """What the registries' PrepareForUpdate fills in before an update is validated."""
    spec = obj.get("spec")
    if resource is R.CSI_STORAGE_CAPACITIES:
        _canonical_quantities(obj, ("capacity", "maximumVolumeSize"))
    if resource is R.PERSISTENT_VOLUME_CLAIMS and isinstance(spec, dict):
        old_spec = (old or {}).get("spec")
        _prepare_data_sources(spec, old_spec if isinstance(old_spec, dict) else {}, gates)


def _prepare_data_sources(
    spec: dict[str, Any], old_spec: dict[str, Any] | None, gates: Collection[str]
) -> None:
    """The claim strategy's PrepareForCreate/PrepareForUpdate for data sources, in upstream's
    order (pkg/api/persistentvolumeclaim): DropDisabledFields, then
    EnforceDataSourceBackwardsCompatibility, then NormalizeDataSources."""
    ref = spec.get("dataSourceRef")
    if (
        CROSS_NAMESPACE_VOLUME_DATA_SOURCE not in gates
        and isinstance(ref, dict)
        and ref.get("namespace")
    ):
        old_ref = (old_spec or {}).get("dataSourceRef")
        if not (isinstance(old_ref, dict) and old_ref.get("namespace")):
            del spec["dataSourceRef"]
    _enforce_data_source_backwards_compatibility(spec, old_spec)
    _normalize_data_sources(spec)
    # apiGroup has no omitempty in TypedLocalObjectReference / TypedObjectReference: a core
    # group reference comes back with "apiGroup": null.
    for key in ("dataSource", "dataSourceRef"):
        value = spec.get(key)
        if isinstance(value, dict):
            value.setdefault("apiGroup", None)


def _enforce_data_source_backwards_compatibility(
    spec: dict[str, Any], old_spec: dict[str, Any] | None
) -> None:
    """EnforceDataSourceBackwardsCompatibility (KEP 1495): on a create, or an update of a claim
    that had no data source, a ``dataSource`` given without ``dataSourceRef`` that is neither a
    claim (core group) nor a snapshot.storage.k8s.io VolumeSnapshot is dropped, as before
    dataSourceRef existed — any other source must come through dataSourceRef."""
    if old_spec is not None and (
        old_spec.get("dataSource") is not None or old_spec.get("dataSourceRef") is not None
    ):
        return
    if spec.get("dataSourceRef") is not None:
        return
    source = spec.get("dataSource")
    if not isinstance(source, dict):
        return  # absent, or for validation to refuse
    group = source.get("apiGroup") or ""
    if (source.get("kind"), group) in (
        ("PersistentVolumeClaim", ""),
        ("VolumeSnapshot", "snapshot.storage.k8s.io"),
    ):
        return
    del spec["dataSource"]


def _normalize_data_sources(spec: dict[str, Any]) -> None:
    """The claim's dataSource and dataSourceRef mirror each other (NormalizeDataSources):
    either one given alone fills the other, except a cross-namespace dataSourceRef."""
    source = spec.get("dataSource")
    ref = spec.get("dataSourceRef")
    if isinstance(source, dict) and ref is None:
        spec["dataSourceRef"] = {k: source.get(k) for k in ("apiGroup", "kind", "name")}
    elif isinstance(ref, dict) and source is None and not ref.get("namespace"):
        spec["dataSource"] = {k: ref.get(k) for k in ("apiGroup", "kind", "name")}


def _data_source_causes(spec: dict[str, Any]) -> list[Cause]:
    """validateDataSource / validateDataSourceRef of a claim's spec."""
    causes: list[Cause] = []
    for key in ("dataSource", "dataSourceRef"):
        ref = spec.get(key)
        if not isinstance(ref, dict):
            continue
        if not ref.get("name"):
            causes.append(required(f"spec.{key}.name"))
        if not ref.get("kind"):
            causes.append(required(f"spec.{key}.kind"))
        elif not ref.get("apiGroup") and ref["kind"] != "PersistentVolumeClaim":
            causes.append(
                invalid_value(
                    f"spec.{key}",
                    ref["kind"],
                    "must be 'PersistentVolumeClaim' when referencing the default apiGroup",
                )
            )
        group = ref.get("apiGroup")
        if group and not is_dns1123_subdomain(group):
            causes.append(invalid_value(f"spec.{key}.apiGroup", group, SUBDOMAIN_MSG))
        if key == "dataSourceRef" and ref.get("namespace"):
            for msg in validate_name(R.NAMESPACES, ref["namespace"]):
                causes.append((msg[0], msg[1], "spec.dataSourceRef.namespace"))
    source = spec.get("dataSource")
    ref = spec.get("dataSourceRef")
    if isinstance(source, dict) and isinstance(ref, dict) and not ref.get("namespace"):
        same = all(source.get(k) == ref.get(k) for k in ("apiGroup", "kind", "name"))
        if not same:
            # field.Invalid(fldPath, fldPath.Child("dataSource"), ...): upstream passes the
            # path as the value, which prints as {}
            causes.append(
                ("FieldValueInvalid", "Invalid value: {}: must match dataSourceRef", "spec")
            )
    return causes


def validate_status_update(
    resource: Resource, old: dict[str, Any], new: dict[str, Any]
) -> list[Cause]:
    """A write to the status subresource: a custom resource's status is checked against the
    CRD's schema (the built-in registries' status rules are not modelled)."""
    if not resource.custom:
        return []
    return crd_schema_causes(resource, new, status=True)


def _has_storage_request(spec: dict[str, Any]) -> bool:
    requests = (spec.get("resources") or {}).get("requests") or {}
    return isinstance(requests, dict) and bool(requests.get("storage"))


_ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")


def _access_mode_causes(spec: dict[str, Any]) -> list[Cause]:
    """ValidatePersistentVolume(Claim)Spec: known modes, ReadWriteOncePod alone."""
    causes: list[Cause] = []
    modes = spec.get("accessModes") or []
    if not isinstance(modes, list):
        return causes
    for mode in modes:
        if mode not in _ACCESS_MODES:
            causes.append(unsupported("spec.accessModes", str(mode), list(_ACCESS_MODES)))
    if "ReadWriteOncePod" in modes and any(
        m in _ACCESS_MODES and m != "ReadWriteOncePod" for m in modes
    ):
        causes.append(
            forbidden("spec.accessModes", "may not use ReadWriteOncePod with other access modes")
        )
    return causes


def _spec_causes(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    if resource is R.PERSISTENT_VOLUME_CLAIMS:
        causes.extend(_claim_spec_causes(spec))
    elif resource.custom:
        causes.extend(crd_schema_causes(resource, obj, status=False))
    elif resource is R.PERSISTENT_VOLUMES:
        causes.extend(_volume_spec_causes(spec))
    elif resource is R.STORAGE_CLASSES:
        causes.extend(_storage_class_causes(obj))
    elif resource is R.VOLUME_ATTRIBUTES_CLASSES:
        causes.extend(vac_causes(obj))
    elif resource is R.VOLUME_ATTACHMENTS:
        causes.extend(_attachment_spec_causes(spec))
    elif resource is R.LEASES:
        causes.extend(_lease_spec_causes(spec))
    elif resource is R.PODS and not spec.get("containers"):
        causes.append(required("spec.containers"))
    elif resource is R.CSI_STORAGE_CAPACITIES:
        causes.extend(_capacity_causes(obj))
    elif resource in (R.DEPLOYMENTS, R.REPLICA_SETS):
        causes.extend(_workload_causes(spec))
    elif resource is R.CSINODES and not isinstance(spec.get("drivers"), list):
        causes.append(required("spec.drivers"))
    return causes


def _claim_spec_causes(spec: dict[str, Any]) -> list[Cause]:
    """A claim's spec (ValidatePersistentVolumeClaimSpec)."""
    causes: list[Cause] = []
    if not spec.get("accessModes"):
        causes.append(required("spec.accessModes", "at least 1 access mode is required"))
    causes.extend(_access_mode_causes(spec))
    if not _has_storage_request(spec):
        causes.append(required("spec.resources[storage]"))
    else:
        storage = spec["resources"]["requests"]["storage"]
        if not _positive_quantity(storage):
            # ValidatePersistentVolumeClaimSpec: ValidatePositiveQuantityValue
            causes.append(
                invalid_value("spec.resources[storage]", storage, "must be greater than zero")
            )
    mode = spec.get("volumeMode")
    if mode not in (None, "Filesystem", "Block"):
        causes.append(unsupported("spec.volumeMode", mode, ["Block", "Filesystem"]))
    causes.extend(_data_source_causes(spec))
    causes.extend(pvc_vac_causes(spec))
    return causes


def _volume_spec_causes(spec: dict[str, Any]) -> list[Cause]:
    """A PV's spec (ValidatePersistentVolumeSpec)."""
    causes: list[Cause] = []
    capacity = spec.get("capacity") or {}
    if not capacity:
        causes.append(required("spec.capacity"))
    if "storage" not in capacity or len(capacity) > 1:
        causes.append(unsupported("spec.capacity", ",".join(capacity), ["storage"]))
    if not spec.get("accessModes"):
        causes.append(required("spec.accessModes"))
    causes.extend(_access_mode_causes(spec))
    sources = [s for s in PV_SOURCES if spec.get(s) is not None]
    if not sources:
        causes.append(required("spec", "must specify a volume type"))
    elif len(sources) > 1:
        causes.append(forbidden("spec." + sources[1], "may not specify more than 1 volume type"))
    policy = spec.get("persistentVolumeReclaimPolicy")
    if policy not in (None, "Retain", "Delete", "Recycle"):
        causes.append(
            unsupported(
                "spec.persistentVolumeReclaimPolicy", policy, ["Delete", "Recycle", "Retain"]
            )
        )
    causes.extend(pv_vac_causes(spec))
    return causes


def _storage_class_causes(obj: dict[str, Any]) -> list[Cause]:
    """A StorageClass (ValidateStorageClass)."""
    causes: list[Cause] = []
    if not obj.get("provisioner"):
        causes.append(required("provisioner"))
    policy = obj.get("reclaimPolicy")
    if policy not in (None, "Retain", "Delete"):
        causes.append(unsupported("reclaimPolicy", policy, ["Delete", "Retain"]))
    mode = obj.get("volumeBindingMode")
    if mode not in (None, "Immediate", "WaitForFirstConsumer"):
        causes.append(unsupported("volumeBindingMode", mode, ["Immediate", "WaitForFirstConsumer"]))
    return causes


def _attachment_spec_causes(spec: dict[str, Any]) -> list[Cause]:
    """A VolumeAttachment's spec (upstream's validateVolumeAttachmentSpec)."""
    causes: list[Cause] = []
    if not spec.get("attacher"):
        causes.append(required("spec.attacher"))
    if not spec.get("nodeName"):
        causes.append(required("spec.nodeName"))
    source = spec.get("source") or {}
    count = sum(1 for k in ("persistentVolumeName", "inlineVolumeSpec") if source.get(k))
    if count != 1:
        causes.append(
            required(
                "spec.source",
                "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
            )
        )
    return causes


def _lease_spec_causes(spec: dict[str, Any]) -> list[Cause]:
    """A Lease's spec (ValidateLeaseSpec)."""
    causes: list[Cause] = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        causes.append(
            invalid_value("spec.leaseDurationSeconds", duration, "must be greater than 0")
        )
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        causes.append(
            invalid_value(
                "spec.leaseTransitions", transitions, "must be greater than or equal to 0"
            )
        )
    return causes


def _capacity_causes(obj: dict[str, Any]) -> list[Cause]:
    """A CSIStorageCapacity (ValidateCSIStorageCapacity)."""
    causes: list[Cause] = []
    causes.extend(label_selector_causes("nodeTopology", obj.get("nodeTopology")))
    class_name = obj.get("storageClassName") or ""
    if not is_dns1123_subdomain(class_name):
        causes.append(invalid_value("storageClassName", class_name, SUBDOMAIN_MSG))
    capacity = obj.get("capacity")
    if isinstance(capacity, str) and _negative_quantity(capacity):
        causes.append(invalid_value("capacity", capacity, "must be greater than or equal to 0"))
    return causes


def _negative_quantity(text: str) -> bool:
    try:
        return parse_quantity(text).sign() < 0
    except ValueError:
        return False


def _workload_causes(spec: dict[str, Any]) -> list[Cause]:
    """ValidateDeploymentSpec / ValidateReplicaSetSpec: a non-empty selector matching the
    template's labels, and a template with containers."""
    causes: list[Cause] = []
    selector = spec.get("selector")
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    assert isinstance(template, dict)
    labels = (template.get("metadata") or {}).get("labels")
    if selector is None:
        causes.append(required("spec.selector"))
    elif isinstance(selector, dict):
        causes.extend(label_selector_causes("spec.selector", selector))
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            # Worded so for ReplicaSets too (ValidateReplicaSetSpec shares the text).
            causes.append(
                invalid_object(
                    "spec.selector", selector, "empty selector is invalid for deployment"
                )
            )
    # LabelSelectorAsSelector: no selector matches nothing, an empty one everything.
    empty = isinstance(selector, dict) and not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    )
    if not empty and not (isinstance(selector, dict) and selector_matches(selector, labels or {})):
        causes.append(
            invalid_object(
                "spec.template.metadata.labels",
                labels,
                "`selector` does not match template `labels`",
            )
        )
    pod_spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    assert isinstance(pod_spec, dict)
    if not pod_spec.get("containers"):
        causes.append(required("spec.template.spec.containers"))
    return causes


def validate_create(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    """What a real cluster's create validation would reject, as Status causes."""
    return _meta_causes(resource, obj) + _spec_causes(resource, obj)


def validate_update(resource: Resource, old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """Create-time rules plus the immutability rules of update."""
    causes = _meta_causes(resource, new) + _spec_causes(resource, new)
    old_spec = old.get("spec") or {}
    new_spec = new.get("spec") or {}
    if resource.custom:
        causes += crd_immutable_causes(resource, old, new)
    if resource is R.PERSISTENT_VOLUME_CLAIMS:
        a = _pvc_comparable(old_spec, old, new_spec)
        b = _pvc_comparable(new_spec, old, old_spec)
        if a != b:
            causes.append(
                forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and "
                    "volumeAttributesClassName for bound claims",
                )
            )
        causes += pvc_vac_update_causes(old, new)
    elif resource is R.PERSISTENT_VOLUMES:
        causes += pv_vac_update_causes(old_spec, new_spec)
        for s in PV_SOURCES:
            if old_spec.get(s) != new_spec.get(s):
                causes.append(
                    forbidden(
                        "spec.persistentvolumesource",
                        "spec.persistentvolumesource is immutable after creation",
                    )
                )
                break
    elif resource is R.STORAGE_CLASSES:
        for field in ("parameters", "provisioner", "reclaimPolicy"):
            if old.get(field) != new.get(field):
                causes.append(forbidden(field, f"updates to {field} are forbidden."))
        if old.get("volumeBindingMode") != new.get("volumeBindingMode"):
            causes.append(
                invalid_value(
                    "volumeBindingMode", new.get("volumeBindingMode"), "field is immutable"
                )
            )
    elif resource is R.VOLUME_ATTACHMENTS and old_spec != new_spec:
        causes.append(invalid_value("spec", "...", "field is immutable"))
    elif resource is R.CSI_STORAGE_CAPACITIES:
        # ValidateCSIStorageCapacityUpdate: what the object is about cannot change.
        if old.get("nodeTopology") != new.get("nodeTopology"):
            causes.append(
                invalid_object("nodeTopology", new.get("nodeTopology"), "field is immutable")
            )
        if old.get("storageClassName") != new.get("storageClassName"):
            causes.append(
                invalid_value("storageClassName", new.get("storageClassName"), "field is immutable")
            )
    elif resource is R.VOLUME_ATTRIBUTES_CLASSES:
        causes += vac_update_causes(old, new)
    return causes


def _pvc_comparable(
    spec: dict[str, Any], old: dict[str, Any], other: dict[str, Any]
) -> dict[str, Any]:
    """The part of a claim's spec that may not change on update."""
    bound = (old.get("status") or {}).get("phase") == "Bound"
    # a bound claim may be resized and given another VolumeAttributesClass
    out = {k: v for k, v in spec.items() if k != "resources"}
    if bound or out.get("volumeAttributesClassName") is None:
        out.pop("volumeAttributesClassName", None)
    resources = dict(spec.get("resources") or {})
    if bound:
        resources.pop("requests", None)
    out["resources"] = resources
    if not other.get("volumeName") or not spec.get("volumeName"):
        # binding sets volumeName once
        out.pop("volumeName", None)
    old_spec = old.get("spec") or {}
    beta = ((old.get("metadata") or {}).get("annotations") or {}).get(ANN_BETA_STORAGE_CLASS)
    if old_spec.get("storageClassName") is None:
        new_class = spec.get("storageClassName") or other.get("storageClassName")
        if new_class and (beta is None or beta == new_class):
            # a retroactive default StorageClass may be set on a claim that had none
            out.pop("storageClassName", None)
    return out
