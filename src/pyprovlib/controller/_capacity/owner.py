"""The owner of an instance's CSIStorageCapacity objects: its Pod, or what controls the Pod,
``levels`` steps up the chain of controlling owner references (external-provisioner's
``pkg/owner``: 0 the Pod itself, 1 its StatefulSet, DaemonSet or ReplicaSet, 2 the Deployment
of that ReplicaSet).

Each step GETs the object it starts from, so RBAC must allow ``get`` on Pods and, for two
levels or more, on every kind between (ReplicaSets for a Deployment). The last step needs no
GET: the Pod's (or ReplicaSet's) own reference names the owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient

from pyprovlib._errors import PyprovlibError
from pyprovlib.kube._config import request_json
from pyprovlib.kube._errors import ApiException, api_error_text
from pyprovlib.kube._objects import Obj, meta
from pyprovlib.kube._resources import resource_for

__all__ = ["OwnerLookupError", "lookup_owner"]


class OwnerLookupError(PyprovlibError, LookupError):
    """The owner of the CSIStorageCapacity objects cannot be found; the message names the
    object and what to change."""


def _group_version_path(api_version: str) -> str:
    return f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"


async def _plural(client: ApiClient, api_version: str, kind: str) -> str:
    """The resource name of ``kind`` in ``api_version``: from pyprovlib's table, else from the
    API server's discovery (an owner of a kind pyprovlib does not know, a custom resource)."""
    try:
        return resource_for(api_version, kind).plural
    except LookupError:
        pass
    path = _group_version_path(api_version)
    try:
        listing = await request_json(client, "GET", path)
    except ApiException as err:
        raise OwnerLookupError(
            f"cannot discover the resource of kind {kind} in {api_version}: {api_error_text(err)}"
        ) from None
    for entry in listing.get("resources") or []:
        if entry.get("kind") == kind and "/" not in str(entry.get("name", "")):
            return str(entry["name"])
    raise OwnerLookupError(f"the API server serves no kind {kind} in {api_version}")


async def _get(client: ApiClient, api_version: str, kind: str, namespace: str, name: str) -> Obj:
    plural = await _plural(client, api_version, kind)
    path = f"{_group_version_path(api_version)}/namespaces/{namespace}/{plural}/{name}"
    try:
        return await request_json(client, "GET", path)
    except ApiException as err:
        what = f"{kind} {namespace}/{name}"
        if err.status == 403:
            raise OwnerLookupError(
                f"cannot get {what} to find the owner of the CSIStorageCapacity objects: "
                f"{api_error_text(err)}; grant get on {plural} in namespace {namespace} "
                "(see the example RBAC), or lower --capacity-ownerref-level"
            ) from None
        raise OwnerLookupError(
            f"cannot get {what} to find the owner of the CSIStorageCapacity objects: "
            f"{api_error_text(err)}"
        ) from None


def _reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
    }


def _controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


async def lookup_owner(
    client: ApiClient,
    namespace: str,
    name: str,
    levels: int,
    *,
    api_version: str = "v1",
    kind: str = "Pod",
) -> dict[str, Any]:
    """The ownerReference (``apiVersion``, ``kind``, ``name``, ``uid``, ``controller: true``)
    of the object ``levels`` controlling owners above ``kind`` ``namespace/name`` (a Pod by
    default). Raises :class:`OwnerLookupError` naming the object when one cannot be read or
    has no controlling owner."""
    if levels < 0:
        raise ValueError(f"levels must not be negative, got {levels}")
    obj = await _get(client, api_version, kind, namespace, name)
    if levels == 0:
        return _reference(api_version, kind, name, str(meta(obj).get("uid", "")))
    owner = _controller_of(obj)
    if owner is None:
        raise OwnerLookupError(
            f"{api_version}/{kind} {name!r} in namespace {namespace!r} has no controlling owner, "
            "cannot unwind the ownership further: lower --capacity-ownerref-level"
        )
    owner_version = str(owner.get("apiVersion", ""))
    owner_kind = str(owner.get("kind", ""))
    owner_name = str(owner.get("name", ""))
    if levels == 1:
        # The reference names the owner: no GET of it, so no RBAC for its kind is needed.
        return _reference(owner_version, owner_kind, owner_name, str(owner.get("uid", "")))
    return await lookup_owner(
        client, namespace, owner_name, levels - 1, api_version=owner_version, kind=owner_kind
    )
