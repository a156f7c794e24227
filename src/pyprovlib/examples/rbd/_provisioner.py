"""The Ceph RBD provisioner: the in-tree ``kubernetes.io/rbd`` provisioner's behaviour
(kubernetes ``pkg/volume/rbd``, external-storage ``ceph/rbd``) on pyprovlib.

A claim becomes an RBD image ``kubernetes-dynamic-pvc-<uuid>`` created with the admin user's
key, and an ``rbd`` PersistentVolume that names the monitors, pool, image, the user the nodes
map it as and that user's Secret. Deleting refuses while the image has watchers (it is still
mapped somewhere), then removes it. :meth:`RBDProvisioner.expand` grows an image for the
resize controller.

All ``rbd`` calls go through :class:`~pyprovlib.examples.rbd._rbd_cli.RbdRunner`: argv lists,
keys in temporary 0600 keyfiles, timeouts on everything.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog
from kubernetes_asyncio.client import (
    ApiClient,
    StorageV1Api,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
    V1RBDPersistentVolumeSource,
    V1SecretReference,
    V1StorageClass,
)
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib._provisioner import (
    BlockProvisioner,
    IgnoredError,
    Provisioner,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
)
from pyprovlib.examples._storage_class import read_class_of_volume, reject_unknown_parameters
from pyprovlib.examples.rbd._rbd_cli import (
    MIB,
    CephCredentials,
    InvalidValueError,
    RbdBusyError,
    RbdError,
    RbdExistsError,
    RbdNotFoundError,
    RbdPermissionError,
    RbdRunner,
    validate_key,
    validate_monitors,
    validate_name,
)
from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._quantity import parse_storage_size
from pyprovlib.kube._resources import SECRETS
from pyprovlib.kube._rest import ResourceClient

__all__ = [
    "ACCESS_MODES",
    "ANN_CREATED_BY",
    "DEFAULT_PROVISIONER_NAME",
    "IMAGE_PREFIX",
    "SECRET_KEY",
    "SECRET_TYPE",
    "SUPPORTED_FEATURES",
    "RBDParameters",
    "RBDProvisioner",
    "RBDVolumeRef",
    "VolumeInUseError",
    "image_name_for",
    "parse_parameters",
]

DEFAULT_PROVISIONER_NAME: Final = "pyprovlib.io/rbd"
"""The provisioner name StorageClasses name in ``provisioner:`` unless ``--provisioner-name``
says otherwise."""

IMAGE_PREFIX: Final = "kubernetes-dynamic-pvc-"
"""Every image this provisioner creates is named ``<prefix><uuid>``, as in-tree."""

SECRET_KEY: Final = "key"  # noqa: S105 - the name of a data key, not a secret
"""The Secret data key holding a cephx key."""

SECRET_TYPE: Final = "kubernetes.io/rbd"  # noqa: S105 - a Secret type
"""The type the in-tree plugin requires of its Secrets (``GetSecretForPV``)."""

ANN_CREATED_BY: Final = "kubernetes.io/createdby"
"""Annotation the in-tree provisioner sets on its PVs (value ``rbd-dynamic-provisioner``)."""

ACCESS_MODES: Final = ("ReadWriteOnce", "ReadOnlyMany")
"""What an RBD volume supports (the in-tree plugin's ``GetAccessModes``)."""

SUPPORTED_FEATURES: Final = frozenset(
    {"layering", "exclusive-lock", "object-map", "fast-diff", "deep-flatten"}
)
"""Image features accepted in ``imageFeatures`` (those the kernel RBD client can map)."""

_FEATURE_NEEDS: Final = {"object-map": "exclusive-lock", "fast-diff": "object-map"}
_UUID_NAMESPACE: Final = uuid.UUID("7d0c4f0e-5a36-4b5e-9a0b-1f4f2f7f6b61")

# Lower-cased parameter name -> canonical spelling (the in-tree plugin matched names
# case-insensitively).
_PARAMS: Final = {
    name.lower(): name
    for name in (
        "monitors",
        "pool",
        "adminId",
        "adminSecretName",
        "adminSecretNamespace",
        "userId",
        "userSecretName",
        "userSecretNamespace",
        "imageFormat",
        "imageFeatures",
        "fsType",
    )
}

log = get_logger("pyprovlib.examples.rbd")


class VolumeInUseError(RbdBusyError):
    """Delete refused: the image still has watchers (it is mapped on some node)."""


@dataclass(frozen=True)
class RBDVolumeRef:
    """What delete and expand need of an ``rbd`` PersistentVolume, from its kubernetes-asyncio
    model (what both the provisioner's ``delete`` and the resizer receive)."""

    pv_name: str
    storage_class_name: str | None
    monitors: tuple[str, ...]
    pool: str
    image: str
    block: bool = False
    """``volumeMode: Block``: no file system to grow on the node."""

    @classmethod
    def from_model(cls, volume: V1PersistentVolume) -> RBDVolumeRef:
        """From a ``V1PersistentVolume``; :class:`IgnoredError` when it is not an RBD volume."""
        name = str(volume.metadata.name) if volume.metadata else "?"
        spec = volume.spec
        source: V1RBDPersistentVolumeSource | None = spec.rbd if spec else None
        if source is None:
            raise IgnoredError(f"PersistentVolume {name} is not an RBD volume")
        return cls(
            pv_name=name,
            storage_class_name=spec.storage_class_name,
            monitors=tuple(str(m) for m in source.monitors or ()),
            pool=str(source.pool or "rbd"),
            image=str(source.image or ""),
            block=spec.volume_mode == "Block",
        )


@dataclass(frozen=True)
class RBDParameters:
    """A StorageClass's parameters, validated, with the in-tree defaults."""

    monitors: tuple[str, ...]
    admin_secret_name: str
    user_secret_name: str | None
    pool: str = "rbd"
    admin_id: str = "admin"
    admin_secret_namespace: str = "default"  # noqa: S105 - a namespace
    user_id: str | None = None
    """None: the admin id, as in-tree."""
    user_secret_namespace: str | None = None
    """None: the claim's namespace."""
    image_format: int = 2
    image_features: tuple[str, ...] = ("layering",)
    fs_type: str | None = None


def _class_name(sc: V1StorageClass) -> str:
    return str(sc.metadata.name) if sc.metadata and sc.metadata.name else "?"


def parse_parameters(storage_class: V1StorageClass, *, for_delete: bool = False) -> RBDParameters:
    """Validate a StorageClass's parameters; :class:`ProvisioningError` says what to fix.

    ``for_delete`` skips the checks only provisioning needs (the user secret)."""
    name = _class_name(storage_class)
    raw: dict[str, str] = {}
    unknown = []
    for key, value in (storage_class.parameters or {}).items():
        canonical = _PARAMS.get(str(key).lower())
        if canonical is None:
            unknown.append(str(key))
        else:
            raw[canonical] = str(value)
    reject_unknown_parameters(name, unknown, _PARAMS.values(), "RBD")

    def bad(message: str) -> ProvisioningError:
        return ProvisioningError(f"StorageClass {name!r}: {message}")

    try:
        if not raw.get("monitors", "").strip():
            raise bad("parameter monitors is required (comma-separated host:port list)")
        monitors = validate_monitors(raw["monitors"])
        # An empty pool or adminId means the default, as in-tree.
        pool = validate_name(raw.get("pool") or "rbd", "pool")
        admin_id = validate_name(raw.get("adminId") or "admin", "adminId")
        user_id = validate_name(raw["userId"], "userId") if raw.get("userId") else None
        admin_secret = raw.get("adminSecretName", "")
        if not admin_secret:
            raise bad("parameter adminSecretName is required (missing Ceph admin secret name)")
        admin_secret = _k8s_name(admin_secret, "adminSecretName")
        admin_ns = _k8s_name(raw.get("adminSecretNamespace") or "default", "adminSecretNamespace")
        user_secret = raw.get("userSecretName") or None
        if user_secret is None and not for_delete:
            raise bad("parameter userSecretName is required (missing user secret name)")
        if user_secret is not None:
            user_secret = _k8s_name(user_secret, "userSecretName")
        user_ns = raw.get("userSecretNamespace") or None
        if user_ns is not None:
            user_ns = _k8s_name(user_ns, "userSecretNamespace")
    except InvalidValueError as err:
        raise bad(str(err)) from None

    image_format_text = raw.get("imageFormat", "2")
    if image_format_text not in ("1", "2"):
        raise bad(f"invalid imageFormat {image_format_text!r}, expecting 1 or 2")
    image_format = int(image_format_text)
    features: tuple[str, ...] = ("layering",)
    if "imageFeatures" in raw:
        if image_format != 2:
            raise bad("imageFeatures can only be set with imageFormat 2")
        features = tuple(f.strip() for f in raw["imageFeatures"].split(",") if f.strip())
        for feature in features:
            if feature not in SUPPORTED_FEATURES:
                raise bad(
                    f"invalid image feature {feature[:64]!r}, supported features are: "
                    f"{', '.join(sorted(SUPPORTED_FEATURES))}"
                )
        for feature, needs in _FEATURE_NEEDS.items():
            if feature in features and needs not in features:
                raise bad(f"image feature {feature} requires {needs}")
    elif image_format == 1:
        features = ()
    fs_type = raw.get("fsType") or None
    if fs_type is not None and not fs_type.isalnum():
        raise bad(f"invalid fsType {fs_type[:64]!r}")
    return RBDParameters(
        monitors=monitors,
        pool=pool,
        admin_id=admin_id,
        admin_secret_name=admin_secret,
        admin_secret_namespace=admin_ns,
        user_id=user_id,
        user_secret_name=user_secret,
        user_secret_namespace=user_ns,
        image_format=image_format,
        image_features=features,
        fs_type=fs_type,
    )


def _k8s_name(value: str, what: str) -> str:
    # DNS-1123 subdomain: what Secret names and namespaces must be anyway.
    if len(value) > 253 or not all(c.isalnum() or c in ".-" for c in value):
        raise InvalidValueError(f"{what} {value[:64]!r} is not a valid Kubernetes name")
    if not value[0].isalnum() or value != value.lower():
        raise InvalidValueError(f"{what} {value[:64]!r} is not a valid Kubernetes name")
    return value


def image_name_for(pv_name: str) -> str:
    """The image behind PV ``pv_name``: ``kubernetes-dynamic-pvc-<uuid>`` where the UUID is
    derived from the PV name (a name-based UUID), so every retry of one claim — after an error,
    a timeout or a restart — finds the image an earlier attempt created instead of leaking it.
    PV names are unique per claim (``pvc-<claim uid>``)."""
    return f"{IMAGE_PREFIX}{uuid.uuid5(_UUID_NAMESPACE, pv_name)}"


class RBDProvisioner(Provisioner, BlockProvisioner):
    """Provisions ``rbd`` PVs as images in a Ceph cluster. ``api_client`` reads Secrets and,
    on delete and expand, the PV's StorageClass; ``runner`` runs ``rbd``."""

    def __init__(self, api_client: ApiClient, runner: RbdRunner | None = None) -> None:
        self.runner = runner if runner is not None else RbdRunner()
        self._secrets = ResourceClient(api_client, SECRETS)
        self._storage = StorageV1Api(api_client)

    def supports_block(self) -> bool:
        """RBD images can be handed to pods as raw block devices."""
        return True

    async def read_key(self, namespace: str, name: str) -> str:
        """The cephx key in Secret ``namespace/name`` (data key ``key``, type
        ``kubernetes.io/rbd``). Raises ``LookupError`` with a message naming the Secret, never
        its content."""
        ref = f"{namespace}/{name}"
        try:
            secret: Mapping[str, Any] = await self._secrets.get(name, namespace)
        except ApiException as err:
            if is_not_found(err):
                raise LookupError(
                    f"Secret {ref} not found; create it (type {SECRET_TYPE}) with the Ceph "
                    f"key under data key {SECRET_KEY!r}"
                ) from None
            raise LookupError(f"cannot read Secret {ref}: HTTP {err.status} {err.reason}") from None
        if secret.get("type") != SECRET_TYPE:
            raise LookupError(
                f"Secret {ref} has type {secret.get('type')!r}; the RBD provisioner needs type "
                f"{SECRET_TYPE}"
            )
        encoded = (secret.get("data") or {}).get(SECRET_KEY)
        if not encoded:
            raise LookupError(f"Secret {ref} has no data key {SECRET_KEY!r} holding the Ceph key")
        try:
            key = base64.b64decode(encoded, validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise LookupError(f"Secret {ref}: data key {SECRET_KEY!r} is not valid") from None
        try:
            return validate_key(key, f"data key {SECRET_KEY!r} of Secret {ref}")
        except InvalidValueError as err:
            raise LookupError(str(err)) from None

    async def _credentials(self, params: RBDParameters) -> CephCredentials:
        key = await self.read_key(params.admin_secret_namespace, params.admin_secret_name)
        return CephCredentials(params.admin_id, key)

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        """Create (or find, on a retry) the image and return an ``rbd`` PV for it."""
        sc = options.storage_class
        claim = options.pvc
        claim_key = f"{claim.metadata.namespace}/{claim.metadata.name}"
        spec = claim.spec
        modes = list(spec.access_modes or []) if spec else []
        unsupported = [m for m in modes if m not in ACCESS_MODES]
        if unsupported:
            raise ProvisioningError(
                f"claim {claim_key}: invalid AccessModes {modes}: only AccessModes "
                f"{list(ACCESS_MODES)} are supported by RBD volumes"
            )
        params = parse_parameters(sc)
        requests = (spec.resources.requests if spec and spec.resources else None) or {}
        try:
            size = parse_storage_size(requests.get("storage"), what="storage request")
        except ValueError as err:
            raise ProvisioningError(f"claim {claim_key}: {err}") from None
        size_mib = max(1, -(-size // MIB))
        try:
            admin = await self._credentials(params)
        except LookupError as err:
            raise ProvisioningError(
                f"cannot read the Ceph admin key: {err}", ProvisioningState.NO_CHANGE
            ) from None
        image = image_name_for(options.pv_name)
        logger = log.bind(claim=claim_key, pv=options.pv_name, pool=params.pool, image=image)
        size_mib = await self._ensure_image(params, admin, image, size_mib, logger)

        block = (spec.volume_mode if spec else None) == "Block"
        user_ns = params.user_secret_namespace or str(claim.metadata.namespace)
        return V1PersistentVolume(
            api_version="v1",
            kind="PersistentVolume",
            metadata=V1ObjectMeta(
                name=options.pv_name,
                annotations={ANN_CREATED_BY: "rbd-dynamic-provisioner"},
            ),
            spec=V1PersistentVolumeSpec(
                capacity={"storage": f"{size_mib}Mi"},
                access_modes=modes or list(ACCESS_MODES),
                volume_mode="Block" if block else "Filesystem",
                mount_options=list(sc.mount_options) if sc.mount_options else None,
                rbd=V1RBDPersistentVolumeSource(
                    monitors=list(params.monitors),
                    image=image,
                    pool=params.pool,
                    user=params.user_id or params.admin_id,
                    secret_ref=V1SecretReference(name=params.user_secret_name, namespace=user_ns),
                    # Block volumes carry no filesystem (in-tree clears fsType for them).
                    fs_type=None if block else params.fs_type,
                    read_only=False,
                ),
            ),
        )

    async def _ensure_image(
        self,
        params: RBDParameters,
        admin: CephCredentials,
        image: str,
        size_mib: int,
        logger: structlog.typing.FilteringBoundLogger,
    ) -> int:
        """Create the image unless a previous attempt did; its size in MiB."""
        mons, pool, run = params.monitors, params.pool, self.runner
        try:
            info = await run.info(mons, admin, pool, image)
        except RbdError as err:
            # Nothing was done in this attempt; a previous one may have left an image.
            raise ProvisioningError(
                f"cannot check for image {pool}/{image}: {err}", ProvisioningState.NO_CHANGE
            ) from None
        if info is not None:
            logger.info("image exists from an earlier attempt", size_mib=info.size_mib)
            if info.size_mib >= size_mib:
                return info.size_mib
            await self._grow(params, admin, image, size_mib)
            return size_mib
        try:
            await run.create(
                mons,
                admin,
                pool,
                image,
                size_mib=size_mib,
                image_format=params.image_format,
                features=params.image_features,
            )
        except RbdExistsError:
            # Created concurrently or by an attempt whose answer was lost: the next attempt's
            # ``rbd info`` settles it.
            raise ProvisioningError(
                f"image {pool}/{image} appeared while creating it; retrying",
                ProvisioningState.IN_BACKGROUND,
            ) from None
        except (RbdNotFoundError, RbdPermissionError) as err:
            # A definite refusal (pool missing, key rejected): nothing was created.
            raise ProvisioningError(f"failed to create rbd image: {err}") from None
        except RbdError as err:
            state = (
                ProvisioningState.FINISHED
                if err.returncode == 22  # EINVAL: rejected before anything was written
                else ProvisioningState.IN_BACKGROUND
            )
            raise ProvisioningError(f"failed to create rbd image: {err}", state) from None
        logger.info("created rbd image", size_mib=size_mib, format=params.image_format)
        return size_mib

    async def _grow(
        self, params: RBDParameters, admin: CephCredentials, image: str, size_mib: int
    ) -> None:
        try:
            await self.runner.resize(params.monitors, admin, params.pool, image, size_mib)
        except RbdError as err:
            raise ProvisioningError(
                f"failed to grow rbd image: {err}", ProvisioningState.IN_BACKGROUND
            ) from None

    async def _volume_context(
        self, ref: RBDVolumeRef
    ) -> tuple[tuple[str, ...], str, str, CephCredentials]:
        """The monitors, pool and image of a PV, checked, and the admin credentials of its
        StorageClass."""
        pv_name = ref.pv_name
        image = ref.image
        if not image.startswith(IMAGE_PREFIX):
            raise IgnoredError(
                f"PersistentVolume {pv_name}: image {image[:80]!r} was not created by this "
                "provisioner"
            )
        try:
            validate_name(image, "image")
            validate_name(ref.pool, "pool")
            monitors = validate_monitors(",".join(ref.monitors))
        except InvalidValueError as err:
            raise RuntimeError(f"PersistentVolume {pv_name}: {err}") from None
        class_name = ref.storage_class_name
        if not class_name:
            raise RuntimeError(
                f"PersistentVolume {pv_name} has no StorageClass; the admin Secret that "
                "manages its image is unknown"
            )
        sc = await read_class_of_volume(
            self._storage, pv_name, class_name, fix="recreate it so the Ceph admin Secret is known"
        )
        try:
            params = parse_parameters(sc, for_delete=True)
        except ProvisioningError as err:
            raise RuntimeError(f"PersistentVolume {pv_name}: {err}") from None
        try:
            admin = await self._credentials(params)
        except LookupError as err:
            raise RuntimeError(
                f"PersistentVolume {pv_name}: cannot read the Ceph admin key: {err}"
            ) from None
        return monitors, ref.pool, image, admin

    async def delete(self, volume: V1PersistentVolume) -> None:
        """Remove the PV's image, refusing while it has watchers (:class:`VolumeInUseError`;
        the controller records an event and retries with backoff). Gone already = success."""
        mons, pool, image, admin = await self._volume_context(RBDVolumeRef.from_model(volume))
        logger = log.bind(pv=volume.metadata.name, pool=pool, image=image)
        watchers = await self.runner.status(mons, admin, pool, image)
        if watchers is None:
            logger.info("rbd image already gone")
            return
        if watchers:
            addresses = ", ".join(w.address for w in watchers[:5])
            raise VolumeInUseError(
                "rm",
                f"{pool}/{image}",
                f"rbd image {pool}/{image} is still being used: {len(watchers)} watcher(s) "
                f"({addresses}); unmap it on the node(s) first — deletion is retried",
            )
        try:
            removed = await self.runner.remove(mons, admin, pool, image)
        except RbdBusyError as err:
            # Watched between ``status`` and ``rm``.
            raise VolumeInUseError(
                "rm", f"{pool}/{image}", f"rbd image {pool}/{image} is still being used: {err}"
            ) from None
        logger.info("rbd image deleted" if removed else "rbd image already gone")

    async def expand(self, volume: V1PersistentVolume | RBDVolumeRef, new_size: int) -> int:
        """Grow the PV's image to at least ``new_size`` bytes (rounded up to MiB) and return
        its size in bytes. Reads the size with ``rbd info`` and calls ``rbd resize`` only when
        the image is smaller (in-tree ``ExpandImage``); never shrinks. A missing image raises
        :class:`~pyprovlib.examples.rbd._rbd_cli.RbdNotFoundError`."""
        if new_size <= 0:
            raise ValueError("new size must be positive")
        ref = volume if isinstance(volume, RBDVolumeRef) else RBDVolumeRef.from_model(volume)
        mons, pool, image, admin = await self._volume_context(ref)
        wanted = -(-new_size // MIB)
        info = await self.runner.info(mons, admin, pool, image)
        if info is None:
            raise RbdNotFoundError(
                "info",
                f"{pool}/{image}",
                f"image of PersistentVolume {ref.pv_name} does not exist",
            )
        if info.size_mib >= wanted:
            return info.size_mib * MIB
        await self.runner.resize(mons, admin, pool, image, wanted)
        log.info("rbd image resized", pv=ref.pv_name, image=image, size_mib=wanted)
        return wanted * MIB
