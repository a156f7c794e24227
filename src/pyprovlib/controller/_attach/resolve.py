"""Reading VolumeAttachments for the attach controller: the helpers over their JSON, and the
:class:`VolumeResolver` that turns one into what an :class:`~pyprovlib.Attacher` call
needs — the volume (from its PersistentVolume or inline spec), the node's driver ID (from its
CSINode, or the ID remembered on the VA) and the controllerPublish secret (external-attacher's
``csi_handler.go`` and ``util.go``).
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from pyprovlib._attacher import AttachError, AttachVolume
from pyprovlib._redaction import scrub_text
from pyprovlib.kube._errors import ApiException, api_error_text
from pyprovlib.kube._objects import (
    Obj,
    annotations_of,
    is_deleting,
    mapping_field,
    meta,
    spec_of,
    status_of,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import Store

__all__ = [
    "NODE_ID_ANNOTATION",
    "ResolvedSource",
    "VolumeResolver",
    "api_error_text",
    "attacher_of",
    "is_attached",
    "is_deleting",
    "mask_secrets",
    "pv_index",
    "pv_name_of",
    "should_enqueue_va_change",
    "source_of",
    "spec_of",
    "status_of",
]

NODE_ID_ANNOTATION: Final = "csi.alpha.kubernetes.io/node-id"
"""Where the node ID used to attach is remembered on the VolumeAttachment, so a detach works
even when the node's CSINode is gone."""

_MASK: Final = "***"
# Secret values shorter than this are not masked in messages: replacing every "a" would make
# the message useless while hiding nothing worth hiding.
_MIN_MASKED_SECRET: Final = 4


def source_of(va: Mapping[str, Any]) -> Mapping[str, Any]:
    """The VolumeAttachment's ``spec.source``."""
    return mapping_field(spec_of(va), "source")


def attacher_of(va: Mapping[str, Any]) -> str:
    """The VolumeAttachment's ``spec.attacher``: the driver that must attach it."""
    return str(spec_of(va).get("attacher") or "")


def pv_name_of(va: Mapping[str, Any]) -> str | None:
    """The VolumeAttachment's PersistentVolume name; None for an inline volume."""
    name = source_of(va).get("persistentVolumeName")
    return name if isinstance(name, str) and name else None


def is_attached(va: Mapping[str, Any]) -> bool:
    """Whether the VolumeAttachment's ``status.attached`` is true."""
    return status_of(va).get("attached") is True


def pv_index(va: Obj) -> list[str]:
    """The VolumeAttachment cache's index function by PersistentVolume name."""
    name = pv_name_of(va)
    return [name] if name else []


def should_enqueue_va_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """external-attacher's ``shouldEnqueueVAChange``: ignore an update that only changed
    ``status.attachError``/``detachError`` (and managed fields) — the controller wrote them a
    moment ago, and processing the VA again at once would defeat the retry backoff. A resync
    (same resourceVersion) is always processed."""
    if meta(old).get("resourceVersion") == meta(new).get("resourceVersion"):
        return True
    error_keys = ("attachError", "detachError")
    if not any(k in status_of(o) for o in (old, new) for k in error_keys):
        return True
    sanitized = copy.deepcopy(dict(new))
    sanitized_meta = dict(meta(sanitized))
    for key in ("resourceVersion", "managedFields"):
        if key in meta(old):
            sanitized_meta[key] = meta(old)[key]
        else:
            sanitized_meta.pop(key, None)
    sanitized["metadata"] = sanitized_meta
    status = dict(status_of(sanitized))
    for key in error_keys:
        if key in status_of(old):
            status[key] = status_of(old)[key]
        else:
            status.pop(key, None)
    if status or "status" in old:
        sanitized["status"] = status
    return sanitized != old


def mask_secrets(text: str, secrets: Mapping[str, str]) -> str:
    """Hide the values of ``secrets`` (and anything that looks like a credential) in ``text``,
    so a backend echoing a secret never leaks it into a status, a log or an exception."""
    for value in sorted(secrets.values(), key=len, reverse=True):
        if len(value) >= _MIN_MASKED_SECRET:
            text = text.replace(value, _MASK)
    return scrub_text(text)


class ResolvedSource:
    """The source of a VolumeAttachment: its PV (None for an inline volume), the PV spec (or
    inline spec) and its ``csi`` section, all JSON from the cache."""

    __slots__ = ("csi", "pv", "spec")

    def __init__(self, pv: Obj | None, spec: Mapping[str, Any], csi: Mapping[str, Any]) -> None:
        self.pv = pv
        self.spec = spec
        self.csi = csi


@dataclass(eq=False)
class VolumeResolver:
    """Resolves VolumeAttachments of the driver ``driver_name`` from the PersistentVolume and
    CSINode caches (``pvs``, ``csinodes``), reading Secrets through ``secrets``."""

    driver_name: str
    default_fs_type: str
    _: KW_ONLY
    pvs: Store
    csinodes: Store
    secrets: ResourceClient

    def resolve(self, va: Mapping[str, Any]) -> ResolvedSource:
        source = source_of(va)
        pv_name = pv_name_of(va)
        inline = source.get("inlineVolumeSpec")
        if pv_name is not None:
            if inline:
                raise AttachError(
                    "both InlineCSIVolumeSource and PersistentVolumeName specified in VA source"
                )
            pv = self.pvs.get_by_key(pv_name)
            if pv is None:
                raise AttachError(f'persistentvolume "{pv_name}" not found')
            csi = spec_of(pv).get("csi")
            if not isinstance(csi, Mapping):
                raise AttachError("pv spec contained non-csi source that was not migrated")
            return ResolvedSource(pv, spec_of(pv), csi)
        if isinstance(inline, Mapping):
            csi = inline.get("csi")
            if not isinstance(csi, Mapping):
                raise AttachError("inline volume spec contains nil CSI source")
            return ResolvedSource(None, inline, csi)
        raise AttachError(
            "neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source"
        )

    def volume(
        self, va: Mapping[str, Any], resolved: ResolvedSource, secrets: Mapping[str, str]
    ) -> AttachVolume:
        spec, csi = resolved.spec, resolved.csi
        handle = csi.get("volumeHandle")
        if not isinstance(handle, str) or not handle:
            raise AttachError("the CSI volume source has no volumeHandle")
        attributes = csi.get("volumeAttributes")
        mode = spec.get("volumeMode") or "Filesystem"
        fs_type = "" if mode == "Block" else str(csi.get("fsType") or self.default_fs_type)
        return AttachVolume(
            volume_id=handle,
            driver=str(csi.get("driver") or self.driver_name),
            pv_name=pv_name_of(va),
            volume_attributes=dict(attributes) if isinstance(attributes, Mapping) else {},
            fs_type=fs_type,
            volume_mode=str(mode),
            access_modes=tuple(str(m) for m in spec.get("accessModes") or ()),
            mount_options=tuple(str(m) for m in spec.get("mountOptions") or ()),
            secrets=secrets,
            spec_object=spec,
        )

    async def controller_publish_secrets(self, csi: Mapping[str, Any]) -> dict[str, str]:
        ref = csi.get("controllerPublishSecretRef")
        if not isinstance(ref, Mapping) or not ref.get("name"):
            return {}
        namespace, name = str(ref.get("namespace") or ""), str(ref["name"])
        if not namespace:
            raise AttachError(f'controllerPublishSecretRef "{name}" names no namespace')
        try:
            secret = await self.secrets.get(name, namespace)
        except ApiException as err:
            raise AttachError(
                f'failed to load secret "{namespace}/{name}": {api_error_text(err)}'
            ) from None
        data = secret.get("data") or {}
        result: dict[str, str] = {}
        for key, value in data.items():
            try:
                result[str(key)] = base64.b64decode(str(value), validate=True).decode(
                    "utf-8", "surrogateescape"
                )
            except (binascii.Error, ValueError):
                raise AttachError(
                    f'secret "{namespace}/{name}" has undecodable data under key {key!r}'
                ) from None
        return result

    def node_id(self, va: Mapping[str, Any], use_annotation: bool) -> str:
        """The driver's ID of the VA's node, from the node's CSINode; for a detach (or the
        reconciler) the ID remembered on the VA is the fallback (upstream's ``getNodeID``)."""
        node_name = str(spec_of(va).get("nodeName") or "")
        csinode = self.csinodes.get_by_key(node_name)
        if csinode is None:
            error = f'csinode.storage.k8s.io "{node_name}" not found'
        else:
            for driver in spec_of(csinode).get("drivers") or ():
                if isinstance(driver, Mapping) and driver.get("name") == self.driver_name:
                    return str(driver.get("nodeID") or "")
            error = f"CSINode {node_name} does not contain driver {self.driver_name}"
        if use_annotation:
            remembered = annotations_of(va).get(NODE_ID_ANNOTATION)
            if remembered:
                return str(remembered)
        raise AttachError(error)
