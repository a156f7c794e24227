"""The NFS provisioner: each volume is a subdirectory of one NFS export
(nfs-subdir-external-provisioner style).

The export is mounted into the provisioner's container (default ``/persistentvolumes``); a
volume is the directory ``${namespace}-${pvcName}-${pvName}`` there, or the class's
``pathPattern`` expanded from the claim's metadata, and the PV is an ``nfs`` volume pointing
at the same directory on the server. Every expanded path is checked to stay inside the export,
and created or removed without following symlinks.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import (
    ApiClient,
    StorageV1Api,
    V1NFSVolumeSource,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1PersistentVolumeSpec,
    V1StorageClass,
)

from pyprovlib._logging import get_logger
from pyprovlib._provisioner import (
    IgnoredError,
    ObjectDeleter,
    Provisioner,
    ProvisioningError,
    ProvisionOptions,
)
from pyprovlib.examples._paths import (
    UnsafePathError,
    archive_beneath,
    make_directory_beneath,
    remove_beneath,
    split_relative_path,
    validate_base_path,
)
from pyprovlib.examples._storage_class import (
    class_parameters,
    read_class_of_volume,
    reject_unknown_parameters,
)
from pyprovlib.kube._convert import from_model
from pyprovlib.kube._informer import SharedInformer

__all__ = [
    "DEFAULT_DIR_MODE",
    "DEFAULT_MOUNT_PATH",
    "DEFAULT_PROVISIONER_NAME",
    "NFSParameters",
    "NFSProvisioner",
    "expand_path_pattern",
    "parse_parameters",
]

DEFAULT_PROVISIONER_NAME = "pyprovlib.io/nfs"
"""The provisioner name StorageClasses name in ``provisioner:`` unless ``--provisioner-name``
says otherwise."""

DEFAULT_MOUNT_PATH = "/persistentvolumes"
"""Where the export is mounted inside the provisioner's container."""

DEFAULT_DIR_MODE = 0o777
"""Permissions of a new volume directory, as upstream creates them."""

PARAM_PATH_PATTERN = "pathPattern"
PARAM_ON_DELETE = "onDelete"
PARAM_ARCHIVE_ON_DELETE = "archiveOnDelete"
_KNOWN_PARAMETERS = frozenset({PARAM_PATH_PATTERN, PARAM_ON_DELETE, PARAM_ARCHIVE_ON_DELETE})

# Upstream's pattern language: ${.PVC.namespace}, ${.PVC.name}, ${.PVC.labels.KEY},
# ${.PVC.annotations.KEY}.
_PATTERN = re.compile(r"\$\{\.PVC\.(?:(labels|annotations)\.(.*?)|(.*?))\}")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

log = get_logger("pyprovlib.examples.nfs")


@dataclass(frozen=True)
class NFSParameters:
    """A StorageClass's parameters, validated."""

    path_pattern: str | None = None
    """The subdirectory template, or None for ``${namespace}-${pvcName}-${pvName}``."""

    on_delete: str | None = None
    """``delete`` or ``retain``; when set, it wins over ``archive_on_delete``."""

    archive_on_delete: bool = True
    """Rename the directory to ``archived-<dir>`` instead of removing it (upstream default)."""

    def action(self) -> str:
        """What happens to the directory when its PV is deleted: delete, retain or archive."""
        if self.on_delete is not None:
            return self.on_delete
        return "archive" if self.archive_on_delete else "delete"


def _parse_bool(value: str) -> bool | None:
    # Go's strconv.ParseBool, which upstream uses for archiveOnDelete.
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return None


def parse_parameters(storage_class: V1StorageClass) -> NFSParameters:
    """Validate a StorageClass's parameters; :class:`ProvisioningError` says what to fix."""
    name, params = class_parameters(storage_class, _KNOWN_PARAMETERS, "NFS")
    return _parse_parameter_map(name, params)


def _parameters_of_object(storage_class: Mapping[str, Any]) -> NFSParameters:
    """:func:`parse_parameters` of a StorageClass's JSON (a cached one)."""
    name = str((storage_class.get("metadata") or {}).get("name") or "?")
    params: Mapping[str, str] = storage_class.get("parameters") or {}
    unknown = [k for k in params if k not in _KNOWN_PARAMETERS]
    reject_unknown_parameters(name, unknown, _KNOWN_PARAMETERS, "NFS")
    return _parse_parameter_map(name, params)


def _parse_parameter_map(name: str, params: Mapping[str, str]) -> NFSParameters:
    on_delete = params.get(PARAM_ON_DELETE)
    if on_delete is not None and on_delete not in ("delete", "retain"):
        raise ProvisioningError(
            f"StorageClass {name!r}: parameter {PARAM_ON_DELETE}={on_delete!r} is invalid; "
            "use delete or retain"
        )
    archive = True
    if PARAM_ARCHIVE_ON_DELETE in params:
        parsed = _parse_bool(params[PARAM_ARCHIVE_ON_DELETE])
        if parsed is None:
            raise ProvisioningError(
                f"StorageClass {name!r}: parameter {PARAM_ARCHIVE_ON_DELETE}="
                f'{params[PARAM_ARCHIVE_ON_DELETE]!r} is not a boolean; use "true" or "false"'
            )
        archive = parsed
    pattern = params.get(PARAM_PATH_PATTERN)
    if pattern is not None:
        for match in _PATTERN.finditer(pattern):
            field = match.group(3)
            if field is not None and field not in ("name", "namespace"):
                raise ProvisioningError(
                    f"StorageClass {name!r}: {PARAM_PATH_PATTERN} uses unknown field "
                    f"{match.group(0)}; use ${{.PVC.namespace}}, ${{.PVC.name}}, "
                    "${.PVC.labels.KEY} or ${.PVC.annotations.KEY}"
                )
    return NFSParameters(path_pattern=pattern, on_delete=on_delete, archive_on_delete=archive)


def expand_path_pattern(pattern: str, claim: V1PersistentVolumeClaim) -> str:
    """Substitute the claim's metadata into ``pattern`` (missing labels/annotations expand to
    the empty string, as upstream). The result is not yet validated."""
    meta = claim.metadata
    return _expand(pattern, meta.name, meta.namespace, meta.labels, meta.annotations)


def _expand(
    pattern: str,
    name: str | None,
    namespace: str | None,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
) -> str:
    data = {"name": name or "", "namespace": namespace or ""}
    labels = labels or {}
    annotations = annotations or {}

    def substitute(match: re.Match[str]) -> str:
        kind, key, field = match.group(1), match.group(2), match.group(3)
        if kind == "labels":
            return str(labels.get(key, ""))
        if kind == "annotations":
            return str(annotations.get(key, ""))
        return data.get(field, "")

    # One pass over the pattern: substituted values are never themselves re-expanded.
    return _PATTERN.sub(substitute, pattern)


class NFSProvisioner(Provisioner, ObjectDeleter):
    """Provisions ``nfs`` PVs as subdirectories of ``server:export_path``, mounted locally at
    ``mount_path``. On delete the volume's StorageClass is read from ``class_cache`` (the
    controller's StorageClass informer, see :meth:`read_classes_from`) once it has synced and
    holds the class, else with ``api_client`` from the API server (nfs-subdir's GET).

    Deletion works on the PV's JSON (:class:`~pyprovlib.ObjectDeleter`): the
    controller converts nothing for it."""

    def __init__(
        self,
        api_client: ApiClient | None,
        server: str,
        export_path: str,
        mount_path: str = DEFAULT_MOUNT_PATH,
        *,
        dir_mode: int = DEFAULT_DIR_MODE,
    ) -> None:
        if not server or "\x00" in server:
            raise ValueError("NFS server must be set (--nfs-server or NFS_SERVER)")
        self.server = server
        # The export path appears in PVs; "/" is a legitimate export, so it is allowed here.
        self.export_path = (
            "/" if export_path == "/" else validate_base_path(export_path, "NFS export path")
        )
        self.mount_path = validate_base_path(mount_path, "NFS mount path")
        self.dir_mode = dir_mode
        self._storage = StorageV1Api(api_client) if api_client is not None else None
        self.class_cache: SharedInformer | None = None

    def read_classes_from(self, informer: SharedInformer) -> None:
        """Read StorageClasses on delete from ``informer``'s cache (the ProvisionController's
        ``class_informer``) instead of a GET per volume, as upstream's CSI provisioner reads
        them through its lister; a class the cache does not hold is still read from the API
        server."""
        self.class_cache = informer

    def subdirectory(self, options: ProvisionOptions, params: NFSParameters) -> tuple[str, ...]:
        """The volume's path components relative to the export; raises
        :class:`UnsafePathError` when the expansion would leave the export."""
        # The claim as the controller cached it: no model is needed to read its metadata.
        meta: Mapping[str, Any] = options.claim_object.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace")
        default = f"{namespace}-{name}-{options.pv_name}"
        if params.path_pattern is not None:
            expanded = _expand(
                params.path_pattern, name, namespace, meta.get("labels"), meta.get("annotations")
            )
            parts = split_relative_path(expanded, "expanded pathPattern")
            if parts:
                return parts
        return split_relative_path(default, "volume directory name")

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        """Create the subdirectory in the export and return an ``nfs`` PV for it."""
        # The claim and its class are read as the controller cached them (the options'
        # JSON forms): converting them to models costs more than the rest of this method.
        sc = options.storage_class_object
        sc_name = (sc.get("metadata") or {}).get("name") or "?"
        claim_meta: Mapping[str, Any] = options.claim_object.get("metadata") or {}
        claim = f"{claim_meta.get('namespace')}/{claim_meta.get('name')}"
        spec: Mapping[str, Any] = options.claim_object.get("spec") or {}
        if spec.get("selector") is not None:
            raise ProvisioningError(
                f"claim {claim}: spec.selector is not supported by the NFS provisioner; remove "
                "the selector"
            )
        params = _parameters_of_object(sc)
        try:
            parts = self.subdirectory(options, params)
        except UnsafePathError as err:
            raise ProvisioningError(
                f"claim {claim} (StorageClass {sc_name!r}): {err}; the volume directory must "
                "stay inside the NFS export — fix the claim's name/labels/annotations or the "
                f"class's {PARAM_PATH_PATTERN}"
            ) from err
        relative = "/".join(parts)
        try:
            local = await asyncio.to_thread(
                make_directory_beneath, self.mount_path, parts, self.dir_mode
            )
        except UnsafePathError as err:
            raise ProvisioningError(
                f"claim {claim} (StorageClass {sc_name!r}): {err}; nothing was created"
            ) from err
        except OSError as err:
            raise ProvisioningError(
                f"claim {claim}: cannot create {relative} in the NFS export mounted at "
                f"{self.mount_path}: {err.strerror or err}; check the mount and its permissions"
            ) from err
        log.info("volume directory ready", claim=claim, pv=options.pv_name, path=local)
        requests: Mapping[str, Any] = (spec.get("resources") or {}).get("requests") or {}
        mount_options = sc.get("mountOptions")
        return V1PersistentVolume(
            api_version="v1",
            kind="PersistentVolume",
            metadata=V1ObjectMeta(name=options.pv_name),
            spec=V1PersistentVolumeSpec(
                capacity={"storage": requests["storage"]} if "storage" in requests else None,
                access_modes=list(spec.get("accessModes") or []),
                volume_mode=spec.get("volumeMode") or "Filesystem",
                mount_options=list(mount_options) if mount_options else None,
                nfs=V1NFSVolumeSource(
                    server=self.server,
                    path=posixpath.join(self.export_path, relative),
                    read_only=False,
                ),
            ),
        )

    def _relative_parts(self, pv_name: str, path: str) -> tuple[str, ...]:
        prefix = self.export_path.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise IgnoredError(
                f"PersistentVolume {pv_name}: path {path!r} is not inside this provisioner's "
                f"export {self.export_path}"
            )
        parts = split_relative_path(path[len(prefix) :], f"PersistentVolume {pv_name} path")
        if not parts:
            raise RuntimeError(
                f"PersistentVolume {pv_name} points at the export root; refusing to delete it"
            )
        return parts

    def _cached_params(self, class_name: str) -> NFSParameters | None:
        """The class's parameters from the controller's cache, or None when the cache cannot
        say (no cache, not synced, no such class, or parameters it cannot parse): the caller
        then takes :meth:`_params_for`'s path, which reports those cases."""
        cache = self.class_cache
        if not class_name or cache is None or not cache.has_synced():
            return None
        cached = cache.store.get_by_key(class_name)
        if cached is None:
            return None
        try:
            return _parameters_of_object(cached)
        except ProvisioningError:
            return None

    async def _params_for(self, pv_name: str, class_name: str) -> NFSParameters:
        if not class_name:
            raise RuntimeError(
                f"PersistentVolume {pv_name} has no storage class; cannot tell "
                "whether to delete or archive its directory"
            )
        cache = self.class_cache
        if cache is not None and cache.has_synced():
            cached = cache.store.get_by_key(class_name)
            if cached is not None:
                try:
                    return _parameters_of_object(cached)
                except ProvisioningError as err:
                    raise RuntimeError(str(err)) from err
        if self._storage is None:
            raise RuntimeError("the NFS provisioner needs an API client to delete volumes")
        sc = await read_class_of_volume(
            self._storage,
            pv_name,
            class_name,
            fix="recreate it so the onDelete/archiveOnDelete policy is known",
        )
        try:
            return parse_parameters(sc)
        except ProvisioningError as err:
            raise RuntimeError(str(err)) from err

    def _remove_or_archive(self, parts: tuple[str, ...], action: str, pv_name: str) -> bool:
        """Remove or archive the volume's directory (in a worker thread); False when it was
        not there."""
        if action == "delete":
            return remove_beneath(self.mount_path, parts)
        archived = "archived-" + parts[-1]
        try:
            return archive_beneath(self.mount_path, parts, archived) is not None
        except FileExistsError:
            # Patterns may map several claims onto one name; keep every archive apart.
            return archive_beneath(self.mount_path, parts, f"{archived}-{pv_name}") is not None

    async def delete(self, volume: V1PersistentVolume) -> None:
        """Delete, retain or archive the volume's directory per the class's ``onDelete`` /
        ``archiveOnDelete``. A directory already gone is success."""
        await self.delete_object(from_model(volume))

    async def delete_object(self, volume: Mapping[str, Any]) -> None:
        """:meth:`delete` on the PV's JSON."""
        metadata: Mapping[str, Any] = volume.get("metadata") or {}
        spec: Mapping[str, Any] = volume.get("spec") or {}
        pv_name = str(metadata.get("name") or "")
        nfs: Mapping[str, Any] | None = spec.get("nfs")
        if nfs is None:
            raise IgnoredError(f"PersistentVolume {pv_name} is not an NFS volume")
        if nfs.get("server") != self.server:
            raise IgnoredError(
                f"PersistentVolume {pv_name} is on server {nfs.get('server')}, this "
                f"provisioner serves {self.server}"
            )
        parts = self._relative_parts(pv_name, str(nfs.get("path") or ""))
        class_name = str(spec.get("storageClassName") or "")
        # The class from the controller's cache (the usual case) lets one trip to a worker
        # thread both find and act on the directory; otherwise, as nfs-subdir does, a
        # directory already gone is success before the class is looked up at all.
        params = self._cached_params(class_name)
        if params is None:
            exists = await asyncio.to_thread(
                posixpath.lexists, posixpath.join(self.mount_path, *parts)
            )
            if not exists:
                log.warning("volume directory already gone", pv=pv_name)
                return
            params = await self._params_for(pv_name, class_name)
        action = params.action()
        log.info("deleting volume directory", pv=pv_name, action=action)
        if action == "retain":
            return
        if not await asyncio.to_thread(self._remove_or_archive, parts, action, pv_name):
            log.warning("volume directory already gone", pv=pv_name)
