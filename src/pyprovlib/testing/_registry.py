"""The REST semantics of kube-apiserver's generic registry over :class:`Storage`: create,
get, list, update, patch and delete with their metadata bookkeeping, optimistic concurrency,
finalizers, preconditions, status subresources and namespace lifecycle.

Everything here is synchronous (hence atomic on the event loop) and raises
:class:`~pyprovlib.testing._status.ApiError` for what the real server refuses. Methods may
change the request bodies they are given and return objects that may be the stored ones:
serialise them, never mutate them (stored objects are replaced, never changed in place,
which is what lets a write's response and its watch lines share one encoding).
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyprovlib.kube import _resources as R
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import Resource
from pyprovlib.testing import _patch
from pyprovlib.testing._events import core_to_v1, v1_to_core, validate_event
from pyprovlib.testing._selectors import (
    FieldSelector,
    LabelSelector,
    single_name,
)
from pyprovlib.testing._status import (
    ApiError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    invalid,
    not_found,
    status_success,
    unsupported_media_type,
)
from pyprovlib.testing._storage import Key, Storage, copy_json
from pyprovlib.testing._validation import (
    default_on_create,
    default_on_update,
    type_check,
    validate_create,
    validate_status_update,
    validate_update,
)

__all__ = ["DeleteOptions", "ListResult", "Registry"]

_STATUS_SUBRESOURCE = frozenset(
    {
        R.PERSISTENT_VOLUME_CLAIMS,
        R.PERSISTENT_VOLUMES,
        R.NODES,
        R.NAMESPACES,
        R.PODS,
        R.VOLUME_ATTACHMENTS,
        R.VOLUME_SNAPSHOTS,
        R.VOLUME_SNAPSHOT_CONTENTS,
        R.DEPLOYMENTS,
        R.REPLICA_SETS,
    }
)
# Status subresources whose strategy copies only the spec from the stored object, so an update
# of /status changes metadata (labels, annotations, finalizers, ...) too; the others (volume
# attachments: ResetObjectMetaForStatus; custom resources) keep the stored metadata.
_STATUS_TAKES_METADATA = frozenset(
    {R.PERSISTENT_VOLUME_CLAIMS, R.PERSISTENT_VOLUMES, R.NODES, R.NAMESPACES, R.PODS}
)
# Registries whose strategy says AllowCreateOnUpdate.
_CREATE_ON_UPDATE = frozenset({R.EVENTS, R.EVENTS_V1, R.LEASES})
# Registries that answer a completed DELETE with the object rather than a Status.
_RETURN_DELETED = frozenset(
    {
        R.PODS,
        R.NAMESPACES,
        R.PERSISTENT_VOLUME_CLAIMS,
        R.PERSISTENT_VOLUMES,
        R.STORAGE_CLASSES,
        R.VOLUME_ATTRIBUTES_CLASSES,
        R.VOLUME_ATTACHMENTS,
        R.CSINODES,
        R.CSIDRIVERS,
    }
)
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
_OMIT_EMPTY_META = ("labels", "annotations", "finalizers", "ownerReferences", "generateName")
_OMIT_EMPTY_TOP = ("data", "binaryData", "stringData", "parameters", "mountOptions")
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# NamespaceLifecycle admission refuses to delete these.
IMMORTAL_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})

PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)


@dataclass
class DeleteOptions:
    """The parts of DeleteOptions the registry honours."""

    uid: str | None = None
    resource_version: str | None = None
    dry_run: bool = False
    propagation_policy: str | None = None
    grace_period_seconds: int | None = None


@dataclass
class ListResult:
    """One page of a LIST."""

    items: list[Obj]
    resource_version: str
    continue_token: str
    remaining: int | None
    keys: list[Key] = field(default_factory=list)
    """The storage key of each item."""

    @property
    def keyed_items(self) -> list[tuple[Key, Obj]]:
        """(storage key, item) pairs."""
        return list(zip(self.keys, self.items, strict=True))


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class Registry:
    """CRUD with the real server's semantics on top of a :class:`Storage`."""

    def __init__(self, storage: Storage, clock: Clock) -> None:
        self.storage = storage
        self.clock = clock
        # Alpha feature gates turned on (kube-apiserver's --feature-gates); off by default.
        self.feature_gates: set[str] = set()
        for name in SYSTEM_NAMESPACES:
            self.create(R.NAMESPACES, None, {"metadata": {"name": name}})

    # --- helpers -----------------------------------------------------------------------------

    def timestamp(self) -> str:
        """RFC 3339, second precision, UTC — as metav1.Time serialises."""
        return self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")

    @staticmethod
    def typed(resource: Resource, obj: Obj) -> Obj:
        """``obj`` with apiVersion and kind first, as responses carry them, and without the
        empty ``omitempty`` maps and lists the real server's Go types drop."""
        out: Obj = {"kind": resource.kind, "apiVersion": resource.api_version}
        out.update((k, v) for k, v in obj.items() if k not in ("kind", "apiVersion"))
        meta = out.get("metadata")
        if isinstance(meta, dict):
            for key in _OMIT_EMPTY_META:
                if key in meta and not meta[key]:
                    del meta[key]
        for key in _OMIT_EMPTY_TOP:
            if key in out and not out[key] and out[key] is not False:
                del out[key]
        status = out.get("status")
        if not resource.custom and isinstance(status, dict) and status.get("conditions") == []:
            # Every built-in status's conditions are omitempty: a strategic merge patch that
            # deletes the last one leaves none, not an empty list.
            out["status"] = {k: v for k, v in status.items() if k != "conditions"}
        return out

    def _require(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        obj = self.storage.get(resource, namespace, name)
        if obj is None:
            raise not_found(resource, name)
        return obj

    def _check_namespace_for_create(self, resource: Resource, namespace: str, name: str) -> None:
        ns = self.storage.get(R.NAMESPACES, None, namespace)
        if ns is None:
            raise not_found(R.NAMESPACES, namespace)
        if ns["metadata"].get("deletionTimestamp"):
            err = forbidden(
                resource,
                name,
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated",
            )
            assert err.details is not None
            err.details["causes"] = [
                {
                    "reason": "NamespaceTerminating",
                    "message": f"namespace {namespace} is being terminated",
                    "field": "metadata.namespace",
                }
            ]
            raise err

    def _check_body_identity(self, resource: Resource, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise bad_request(
                f'{resource.kind} in version "{resource.version}" cannot be handled as a '
                f"{resource.kind}: json: cannot unmarshal into Go value of type "
                f"{resource.group or 'core'}.{resource.kind}"
            )
        kind = body.get("kind")
        api_version = body.get("apiVersion")
        if (kind not in (None, "", resource.kind)) or (
            api_version not in (None, "", resource.api_version)
        ):
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({resource.api_version})"
                if api_version not in (None, "", resource.api_version)
                else f'{resource.kind} in version "{resource.version}" cannot be handled as a '
                f'{resource.kind}: no kind "{kind}" is registered for version '
                f'"{resource.api_version}"'
            )
        meta = body.get("metadata")
        if meta is None:
            body["metadata"] = meta = {}
        type_check(resource, body)
        body_ns = meta.get("namespace")
        if resource.namespaced:
            if body_ns and namespace and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            if namespace:
                meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return body

    # --- create ------------------------------------------------------------------------------

    def create(
        self, resource: Resource, namespace: str | None, body: Any, *, dry_run: bool = False
    ) -> Obj:
        """POST: stamp metadata, default, validate, store; returns the stored object (do not
        mutate it)."""
        if resource is R.EVENTS_V1:
            body = v1_to_core(self._check_body_identity(resource, namespace, body))
            return core_to_v1(self._create(R.EVENTS, namespace, body, dry_run, R.EVENTS_V1))
        return self._create(resource, namespace, body, dry_run, resource)

    def _create(
        self, resource: Resource, namespace: str | None, body: Any, dry_run: bool, view: Resource
    ) -> Obj:
        # Not to protect the caller (the body is ours), but so that nothing is stored that
        # cannot be copied again: a body nested too deeply fails here, as a 400.
        obj = copy_json(self._check_body_identity(resource, namespace, body))
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            for _ in range(8):
                suffix = "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
                candidate = f"{meta['generateName']}{suffix}"
                if self.storage.get(resource, namespace, candidate) is None:
                    meta["name"] = candidate
                    break
        name = meta.get("name") or ""
        for transient in (
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ):
            meta.pop(transient, None)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion can not be set for Create requests")
        default_on_create(resource, obj, self.feature_gates)
        causes = validate_create(resource, obj)
        if resource is R.EVENTS:
            causes += validate_event(view, obj)
        if causes:
            raise invalid(view, name, causes)
        if resource.namespaced:
            self._check_namespace_for_create(resource, namespace or "", name)
        if self.storage.get(resource, namespace, name) is not None:
            raise already_exists(resource, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.timestamp()
        meta["generation"] = 1
        if dry_run:
            meta["resourceVersion"] = ""
            return self.typed(resource, obj)
        rv = self.storage.next_rv()
        meta["resourceVersion"] = str(rv)
        obj = self.typed(resource, obj)
        self.storage.put(resource, obj, rv, "ADDED")
        return obj

    # --- read --------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        """GET one object (the stored one: do not mutate it)."""
        if resource is R.EVENTS_V1:
            return core_to_v1(self._require(R.EVENTS, namespace, name))
        return self._require(resource, namespace, name)

    def list_page(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        labels: LabelSelector,
        fields: FieldSelector,
        field_text: str | None,
        limit: int,
        token: str | None,
    ) -> ListResult:
        """LIST with selectors and pagination (items are the stored dicts: serialise, don't
        mutate)."""
        after: tuple[str, str] | None = None
        if token:
            after, token_rv = _decode_continue(token)
            try:
                self.storage.check_rv(token_rv)
            except ApiError as e:
                raise ApiError(
                    410,
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter, or use "
                    "the continue token in this response to retrieve the remainder of the "
                    "results. Continuing with the provided token results in an inconsistent "
                    "list - objects that were created, modified, or deleted between the time "
                    "the first chunk was returned and now may show up in the list.",
                    "Expired",
                ) from e
            list_rv = token_rv
        else:
            list_rv = self.storage.rv
        items: list[Obj] = []
        keys: list[Key] = []
        convert = core_to_v1 if resource is R.EVENTS_V1 else None
        if convert is not None:
            resource = R.EVENTS
        name = single_name(fields, field_text)
        if name is not None:
            candidates: Any = []
            if namespace or not resource.namespaced:
                obj = self.storage.get(resource, namespace, name)
                candidates = [((namespace or "", name), obj)] if obj is not None else []
            else:
                candidates = self.storage.iter_from(resource, None, after)
        else:
            candidates = self.storage.iter_from(resource, namespace, after)
        last_key: tuple[str, str] | None = None
        more = False
        for key, stored in candidates:
            obj = convert(stored) if convert is not None else stored
            if not (labels.matches(obj) and fields.matches(obj)):
                continue
            if limit and len(items) >= limit:
                more = True
                break
            items.append(obj)
            keys.append(key)
            last_key = key
        continue_token = ""
        remaining: int | None = None
        if more and last_key is not None:
            continue_token = _encode_continue(last_key, list_rv)
            if not labels.requirements and not fields.terms:
                remaining = self._remaining(resource, namespace, last_key)
        return ListResult(
            items, str(self.storage.rv if not token else list_rv), continue_token, remaining, keys
        )

    def _remaining(self, resource: Resource, namespace: str | None, last: tuple[str, str]) -> int:
        return self.storage.count_after(resource, namespace, last)

    # --- update ------------------------------------------------------------------------------

    def update(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """PUT; returns (object, created) — created only for create-on-update registries."""
        body = self._check_body_identity(resource, namespace, body)
        if resource is R.EVENTS_V1:
            obj, created = self.update(
                R.EVENTS,
                namespace,
                name,
                v1_to_core(body),
                subresource=subresource,
                dry_run=dry_run,
            )
            return core_to_v1(obj), created
        body_name = body["metadata"].get("name")
        if not body_name:
            # the name on the URL stands for a body that leaves it out
            body["metadata"]["name"] = body_name = name
        if body_name != name:
            raise bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        old = self.storage.get(resource, namespace, name)
        if old is None:
            if resource in _CREATE_ON_UPDATE and subresource is None:
                return self.create(resource, namespace, body, dry_run=dry_run), True
            raise not_found(resource, name)
        # copied for the same reason as in create
        return self._apply_update(resource, old, copy_json(body), subresource, dry_run), False

    def _apply_update(
        self, resource: Resource, old: Obj, new: Obj, subresource: str | None, dry_run: bool
    ) -> Obj:
        """An update (PUT, or a patch's result) of ``old`` to ``new``: checked, merged as the
        resource's update strategy merges it, validated, then stored."""
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        _check_update_preconditions(resource, meta, old["metadata"])
        if subresource == "status":
            new = self._merge_status_update(resource, old, new, meta)
        else:
            self._merge_main_update(resource, old, new, meta)
        return self._commit_update(resource, old, self.typed(resource, new), dry_run)

    def _merge_status_update(self, resource: Resource, old: Obj, new: Obj, meta: Obj) -> Obj:
        """A ``/status`` update: the request's status on the stored object."""
        name, old_meta = old["metadata"]["name"], old["metadata"]
        merged = copy_json(old)
        if "status" in new:
            merged["status"] = new["status"]
        else:
            merged.pop("status", None)
        if resource not in _STATUS_TAKES_METADATA:
            # status updates change status only (metav1.ResetObjectMetaForStatus; a custom
            # resource's status strategy copies the whole stored object but its status)
            causes = validate_status_update(resource, old, merged)
            if causes:
                raise invalid(resource, name, causes)
            return merged
        # The core registries' status strategies copy only the spec from the stored object:
        # labels, annotations, finalizers and owner references come from the request as in any
        # update (verified against kube-apiserver v1.36).
        merged["metadata"] = meta
        if resource is R.PODS:
            # the pods/status strategy keeps the stored owner references (old kubelets
            # corrupted them)
            _keep_stored(meta, old_meta, "ownerReferences")
        _keep_system_metadata(meta, old_meta, name)
        if resource is R.NAMESPACES:
            _label_namespace(meta, name)
        causes = validate_status_update(resource, old, merged)
        causes += _finalizers_added_while_deleting(meta, old_meta)
        if causes:
            raise invalid(resource, name, causes)
        return merged

    def _merge_main_update(self, resource: Resource, old: Obj, new: Obj, meta: Obj) -> None:
        """An update of the main resource, in place: the stored status kept where a status
        subresource owns it, system metadata kept, defaults, validation, generation."""
        name, old_meta = old["metadata"]["name"], old["metadata"]
        if resource in _STATUS_SUBRESOURCE:
            _keep_stored(new, old, "status")
        _keep_system_metadata(meta, old_meta, name)
        if resource is R.NAMESPACES:
            new["spec"] = copy_json(old.get("spec", {}))
            _label_namespace(meta, name)
        default_on_update(resource, new, old, self.feature_gates)
        causes = validate_update(resource, old, new)
        causes += _finalizers_added_while_deleting(meta, old_meta)
        if causes:
            raise invalid(resource, name, causes)
        if _spec_part(new) != _spec_part(old):
            meta["generation"] = int(old_meta.get("generation") or 1) + 1

    def _commit_update(self, resource: Resource, old: Obj, new: Obj, dry_run: bool) -> Obj:
        """Store ``new`` (unless nothing changed or ``dry_run``): a new resourceVersion and a
        MODIFIED event, or the object's removal when its last finalizer went while deleting."""
        old_meta = old["metadata"]
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if not new["metadata"].get("finalizers"):
            new["metadata"].pop("finalizers", None)
        if new == old:
            return old
        if dry_run:
            return new
        if (
            resource is not R.NAMESPACES
            and old_meta.get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
        ):
            # the last finalizer went: the object goes
            self._remove(resource, new)
            return new
        rv_new = self.storage.next_rv()
        new["metadata"]["resourceVersion"] = str(rv_new)
        self.storage.put(resource, new, rv_new, "MODIFIED")
        if resource is R.NAMESPACES and old_meta.get("deletionTimestamp"):
            self._maybe_remove_namespace(old_meta["name"])
        return new

    # --- patch -------------------------------------------------------------------------------

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        content_type: str,
        raw: bytes,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PATCH by content type, then the update path (a patch never creates)."""
        if content_type not in PATCH_TYPES:
            raise unsupported_media_type(content_type)
        if content_type == "application/apply-patch+yaml":
            raise unsupported_media_type(content_type)
        if resource.custom and content_type == "application/strategic-merge-patch+json":
            # custom resources have no patch strategies: the CRD handler refuses the type
            raise ApiError(
                415,
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
                "UnsupportedMediaType",
            )
        try:
            patch = json.loads(raw) if raw else None
        except ValueError as e:
            raise bad_request(f"error decoding patch: {e}") from e
        view = resource
        if resource is R.EVENTS_V1:
            resource = R.EVENTS
        old = self._require(resource, namespace, name)
        shown = core_to_v1(old) if view is R.EVENTS_V1 else old
        if content_type == "application/json-patch+json":
            new = _patch.apply_json_patch(shown, patch)
        elif content_type == "application/merge-patch+json":
            if patch is None:
                raise bad_request("Invalid JSON Patch")
            if not isinstance(patch, dict):
                raise bad_request(
                    f"error decoding patch: json: cannot unmarshal {_patch.go_json_kind(patch)} "
                    "into Go value of type map[string]interface {}"
                )
            # a copy: the result shares nothing with the stored (and historic) object
            new = _patch.apply_merge_patch(shown, patch)
        else:
            new = _patch.apply_strategic_merge_patch(shown, patch)
        if not isinstance(new, dict):
            raise bad_request("the patch did not result in an object")
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        if resource.namespaced and meta.get("namespace") != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        kind, api_version = new.get("kind"), new.get("apiVersion")
        if kind != view.kind or api_version != view.api_version:
            raise bad_request("the kind or apiVersion of the object may not be changed by a patch")
        if meta.get("resourceVersion") in (None, ""):
            # a patch that drops resourceVersion is unconditional
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        type_check(view, new)
        if view is R.EVENTS_V1:
            return core_to_v1(
                self._apply_update(resource, old, v1_to_core(new), subresource, dry_run)
            )
        return self._apply_update(resource, old, new, subresource, dry_run)

    # --- delete ------------------------------------------------------------------------------

    def delete(
        self, resource: Resource, namespace: str | None, name: str, options: DeleteOptions
    ) -> Obj:
        """DELETE; returns the response body (the object or a Status)."""
        if resource is R.EVENTS_V1:
            body = self.delete(R.EVENTS, namespace, name, options)
            if body.get("kind") == "Status":
                return status_success(R.EVENTS_V1, name, body["details"]["uid"])
            return core_to_v1(body)
        obj = self._require(resource, namespace, name)
        meta = obj["metadata"]
        if resource is R.NAMESPACES and name in IMMORTAL_NAMESPACES:
            raise forbidden(resource, name, "this namespace may not be deleted")
        if options.uid and options.uid != meta["uid"]:
            raise conflict(
                resource,
                name,
                f"Precondition failed: UID in precondition: {options.uid}, UID in object meta: "
                f"{meta['uid']}",
            )
        if options.resource_version and options.resource_version != meta["resourceVersion"]:
            raise conflict(
                resource,
                name,
                "Precondition failed: ResourceVersion in precondition: "
                f"{options.resource_version}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        if options.propagation_policy not in (None, "", "Orphan", "Background", "Foreground"):
            raise invalid(
                resource,
                name,
                [
                    (
                        "FieldValueNotSupported",
                        f'Unsupported value: "{options.propagation_policy}": supported values: '
                        '"Foreground", "Background", "Orphan"',
                        "propagationPolicy",
                    )
                ],
            )
        pending = bool(meta.get("finalizers")) or resource is R.NAMESPACES
        if not pending:
            if options.dry_run:
                return self._deleted_body(resource, obj)
            final = copy_json(obj)
            self._remove(resource, final)
            return self._deleted_body(resource, final)
        if meta.get("deletionTimestamp"):
            return obj
        new = copy_json(obj)
        new["metadata"]["deletionTimestamp"] = self.timestamp()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new["metadata"]["generation"] = int(meta.get("generation") or 1) + 1
        if resource is R.NAMESPACES:
            new["status"] = {"phase": "Terminating"}
        if options.dry_run:
            return new
        rv = self.storage.next_rv()
        new["metadata"]["resourceVersion"] = str(rv)
        self.storage.put(resource, new, rv, "MODIFIED")
        if resource is R.NAMESPACES:
            self._finalize_namespace(name)
        return new

    def _deleted_body(self, resource: Resource, obj: Obj) -> Obj:
        if resource in _RETURN_DELETED:
            return obj
        return status_success(resource, obj["metadata"]["name"], obj["metadata"]["uid"])

    def _remove(self, resource: Resource, final: Obj) -> None:
        rv = self.storage.next_rv()
        final["metadata"]["resourceVersion"] = str(rv)
        self.storage.remove(resource, final, rv)
        ns = final["metadata"].get("namespace")
        if resource.namespaced and ns:
            ns_obj = self.storage.get(R.NAMESPACES, None, ns)
            if ns_obj is not None and ns_obj["metadata"].get("deletionTimestamp"):
                self._maybe_remove_namespace(ns)

    def _finalize_namespace(self, name: str) -> None:
        """Delete everything in a Terminating namespace (honouring finalizers)."""
        for resource, obj in self.storage.in_namespace(name):
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            self.delete(resource, name, meta["name"], DeleteOptions())
        self._maybe_remove_namespace(name)

    def _maybe_remove_namespace(self, name: str) -> None:
        ns = self.storage.get(R.NAMESPACES, None, name)
        if ns is None or ns["metadata"].get("finalizers"):
            return
        if not self.storage.namespace_empty(name):
            return
        final = copy_json(ns)
        final["spec"] = {}
        rv = self.storage.next_rv()
        final["metadata"]["resourceVersion"] = str(rv)
        self.storage.remove(R.NAMESPACES, final, rv)

    def delete_collection(
        self,
        resource: Resource,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        options: DeleteOptions,
    ) -> list[Obj]:
        """DELETE on a collection; returns the deleted (or now terminating) objects."""
        convert = core_to_v1 if resource is R.EVENTS_V1 else _same
        stored = R.EVENTS if resource is R.EVENTS_V1 else resource
        targets = [
            shown
            for _k, o in self.storage.iter_from(stored, namespace, None)
            if labels.matches(shown := convert(o)) and fields.matches(shown)
        ]
        out = []
        for obj in targets:
            meta = obj["metadata"]
            body = self.delete(
                resource,
                meta.get("namespace"),
                meta["name"],
                DeleteOptions(
                    dry_run=options.dry_run, propagation_policy=options.propagation_policy
                ),
            )
            out.append(body if body.get("kind") != "Status" else obj)
        return out


def _same(obj: Obj) -> Obj:
    return obj


def _go_strings(items: list[str]) -> str:
    return "[]string{" + ", ".join(f'"{i}"' for i in items) + "}"


def _encode_continue(key: tuple[str, str], rv: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [key[0], key[1]]})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[tuple[str, str], int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        start = data["start"]
        return (str(start[0]), str(start[1])), int(data["rv"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion "
            "(version meta.k8s.io/v1)"
        ) from e


def _check_update_preconditions(resource: Resource, meta: Obj, old_meta: Obj) -> None:
    """An update's resourceVersion and uid must be the stored ones (409), its namespace the
    URL's (400)."""
    name = old_meta["name"]
    rv = meta.get("resourceVersion")
    if rv and rv != old_meta["resourceVersion"]:
        raise conflict(resource, name, _MODIFIED)
    if meta.get("uid") and meta["uid"] != old_meta["uid"]:
        raise conflict(
            resource,
            name,
            f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
            f"{old_meta['uid']}",
        )
    if meta.get("namespace", old_meta.get("namespace")) != old_meta.get("namespace"):
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


def _keep_stored(target: Obj, stored: Obj, key: str) -> None:
    """``target[key]`` as stored: a copy of ``stored[key]``, or absent when it is."""
    if key in stored:
        target[key] = copy_json(stored[key])
    else:
        target.pop(key, None)


def _label_namespace(meta: Obj, name: str) -> None:
    """The label every namespace carries: kubernetes.io/metadata.name=<name>."""
    labels = meta.get("labels") or {}
    labels["kubernetes.io/metadata.name"] = name
    meta["labels"] = labels


def _keep_system_metadata(meta: dict[str, Any], old_meta: dict[str, Any], name: str) -> None:
    """What rest.BeforeUpdate keeps from the stored object whatever an update says."""
    for keep in (
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
    ):
        if keep in old_meta:
            meta[keep] = old_meta[keep]
        else:
            meta.pop(keep, None)
    meta["name"] = name
    _keep_managed_fields(meta, old_meta)


def _keep_managed_fields(meta: dict[str, Any], old_meta: dict[str, Any]) -> None:
    """The field manager's rule for an update's ``managedFields``: a client that leaves them
    out (or sends an empty list) does not know them, so the stored ones stay; ``[{}]`` is
    the documented way to clear them; anything else replaces them."""
    sent = meta.get("managedFields")
    if sent == [{}]:
        meta.pop("managedFields", None)
    elif not sent:
        if "managedFields" in old_meta:
            meta["managedFields"] = copy_json(old_meta["managedFields"])
        else:
            meta.pop("managedFields", None)


def _finalizers_added_while_deleting(
    meta: dict[str, Any], old_meta: dict[str, Any]
) -> list[tuple[str, str, str]]:
    if not old_meta.get("deletionTimestamp"):
        return []
    added = [f for f in meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
    if not added:
        return []
    return [
        (
            "FieldValueForbidden",
            "Forbidden: no new finalizers can be added if the object is being "
            f"deleted, found new finalizers {_go_strings(added)}",
            "metadata.finalizers",
        )
    ]
