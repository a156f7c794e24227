"""Secrets of a CSI StorageClass: the ``csi.storage.k8s.io/*-secret-name`` and
``-namespace`` parameters, their templates (``${pvc.name}``, ``${pv.name}``, ...) and their
resolution into Secret references (upstream's ``getSecretReference`` and ``resolveTemplate``),
and reading the provisioner secret sent with CreateVolume and DeleteVolume."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pyprovlib.csi.provisioner._common import PreparationError
from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._objects import is_dns1123_label, is_dns1123_subdomain
from pyprovlib.kube._rest import ResourceClient

__all__ = [
    "ANN_DELETION_SECRET_NAME",
    "ANN_DELETION_SECRET_NAMESPACE",
    "ANN_MODIFY_SECRET_NAME",
    "ANN_MODIFY_SECRET_NAMESPACE",
    "CONTROLLER_EXPAND_SECRET",
    "CONTROLLER_MODIFY_SECRET",
    "CONTROLLER_PUBLISH_SECRET",
    "CSI_PARAMETER_PREFIX",
    "NODE_EXPAND_SECRET",
    "NODE_PUBLISH_SECRET",
    "NODE_STAGE_SECRET",
    "PROVISIONER_SECRET",
    "PV_SECRETS",
    "SECRET_PARAMETER_KEYS",
    "SecretParams",
    "SecretRef",
    "read_secret",
    "resolve_template",
    "secret_reference",
]

CSI_PARAMETER_PREFIX: Final = "csi.storage.k8s.io/"
"""StorageClass parameters under this prefix are for the provisioner, not the driver."""
ANN_DELETION_SECRET_NAME: Final = "volume.kubernetes.io/provisioner-deletion-secret-name"  # noqa: S105 - a key, not a secret
"""PV annotation recording the provisioner secret's name, so Delete finds it without the class."""
ANN_DELETION_SECRET_NAMESPACE: Final = "volume.kubernetes.io/provisioner-deletion-secret-namespace"  # noqa: S105 - a key, not a secret
"""PV annotation recording the provisioner secret's namespace (see ANN_DELETION_SECRET_NAME)."""
ANN_MODIFY_SECRET_NAME: Final = "volume.kubernetes.io/controller-modify-secret-name"  # noqa: S105 - a key, not a secret
"""PV annotation naming the Secret the resizer sends with ControllerModifyVolume (a PV's
``spec.csi`` has no field for it), resolved from the class's controller-modify parameters."""
ANN_MODIFY_SECRET_NAMESPACE: Final = "volume.kubernetes.io/controller-modify-secret-namespace"  # noqa: S105 - a key, not a secret
"""PV annotation with that Secret's namespace (see ANN_MODIFY_SECRET_NAME)."""

_TOKEN_PV_NAME: Final = "pv.name"  # noqa: S105 - a key, not a secret
_TOKEN_PVC_NAME: Final = "pvc.name"  # noqa: S105 - a key, not a secret
_TOKEN_PVC_NAMESPACE: Final = "pvc.namespace"  # noqa: S105 - a key, not a secret


@dataclass(frozen=True)
class SecretParams:
    """The StorageClass parameter keys naming one kind of secret (name and namespace)."""

    kind: str
    name_key: str
    namespace_key: str


PROVISIONER_SECRET = SecretParams(
    "provisioner",
    CSI_PARAMETER_PREFIX + "provisioner-secret-name",
    CSI_PARAMETER_PREFIX + "provisioner-secret-namespace",
)
"""Class parameters naming the secret for CreateVolume and DeleteVolume."""
CONTROLLER_PUBLISH_SECRET = SecretParams(
    "controller publish",
    CSI_PARAMETER_PREFIX + "controller-publish-secret-name",
    CSI_PARAMETER_PREFIX + "controller-publish-secret-namespace",
)
"""Class parameters naming the secret for ControllerPublishVolume (recorded on the PV)."""
NODE_STAGE_SECRET = SecretParams(
    "node stage",
    CSI_PARAMETER_PREFIX + "node-stage-secret-name",
    CSI_PARAMETER_PREFIX + "node-stage-secret-namespace",
)
"""Class parameters naming the secret for NodeStageVolume (recorded on the PV)."""
NODE_PUBLISH_SECRET = SecretParams(
    "node publish",
    CSI_PARAMETER_PREFIX + "node-publish-secret-name",
    CSI_PARAMETER_PREFIX + "node-publish-secret-namespace",
)
"""Class parameters naming the secret for NodePublishVolume (recorded on the PV)."""
CONTROLLER_EXPAND_SECRET = SecretParams(
    "controller expand",
    CSI_PARAMETER_PREFIX + "controller-expand-secret-name",
    CSI_PARAMETER_PREFIX + "controller-expand-secret-namespace",
)
"""Class parameters naming the secret for ControllerExpandVolume (recorded on the PV)."""
NODE_EXPAND_SECRET = SecretParams(
    "node expand",
    CSI_PARAMETER_PREFIX + "node-expand-secret-name",
    CSI_PARAMETER_PREFIX + "node-expand-secret-namespace",
)
"""Each ``*_SECRET`` names the class parameters of one secret: the provisioner's (read and sent
with CreateVolume/DeleteVolume) and the ones only referenced from the PV."""
CONTROLLER_MODIFY_SECRET = SecretParams(
    "controller modify",
    CSI_PARAMETER_PREFIX + "controller-modify-secret-name",
    CSI_PARAMETER_PREFIX + "controller-modify-secret-namespace",
)
"""Class parameters naming the secret for ControllerModifyVolume (recorded on the PV as the
:data:`ANN_MODIFY_SECRET_NAME` annotations, as external-provisioner 6.2 does)."""
PV_SECRETS: Final = (
    ("controllerPublishSecretRef", CONTROLLER_PUBLISH_SECRET),
    ("nodeStageSecretRef", NODE_STAGE_SECRET),
    ("nodePublishSecretRef", NODE_PUBLISH_SECRET),
    ("controllerExpandSecretRef", CONTROLLER_EXPAND_SECRET),
    ("nodeExpandSecretRef", NODE_EXPAND_SECRET),
)
"""The PV's ``spec.csi`` fields that reference a secret, and the class parameters naming it."""
SECRET_PARAMETER_KEYS: Final = frozenset(
    key
    for params in (
        PROVISIONER_SECRET,
        CONTROLLER_PUBLISH_SECRET,
        NODE_STAGE_SECRET,
        NODE_PUBLISH_SECRET,
        CONTROLLER_EXPAND_SECRET,
        NODE_EXPAND_SECRET,
        CONTROLLER_MODIFY_SECRET,
    )
    for key in (params.name_key, params.namespace_key)
)
"""Every class parameter key that names a secret."""

_TEMPLATE_TOKEN = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z0-9_]+)|(?P<bad>\{|$))")


@dataclass(frozen=True)
class SecretRef:
    """A resolved Secret reference."""

    name: str
    namespace: str

    def as_dict(self) -> dict[str, str]:
        """The ``{"name", "namespace"}`` form of a PV's SecretReference."""
        return {"name": self.name, "namespace": self.namespace}


def resolve_template(template: str, params: Mapping[str, str]) -> str:
    """Expand ``${token}`` (and ``$token``) in ``template`` from ``params``.

    Unknown tokens and a malformed ``${`` are errors naming them (upstream: ``invalid tokens``).
    """
    missing: list[str] = []
    malformed = False

    def expand(match: re.Match[str]) -> str:
        nonlocal malformed
        if match.group("bad") is not None:
            malformed = True
            return ""
        token = match.group("braced")
        if token is None:
            token = match.group("bare")
        if token in params:
            return params[token]
        missing.append(token)
        return ""

    resolved = _TEMPLATE_TOKEN.sub(expand, template)
    if malformed:
        raise ValueError(f"malformed template {template!r}: a '$' must start ${{token}}")
    if missing:
        raise ValueError(f"invalid tokens: {sorted(set(missing))!r}")
    return resolved


def secret_reference(
    params: SecretParams,
    class_parameters: Mapping[str, str],
    pv_name: str,
    claim: Mapping[str, Any] | None,
) -> SecretRef | None:
    """Resolve a class's secret name/namespace templates (upstream's ``getSecretReference``).

    Namespace templates may use ``${pv.name}`` and ``${pvc.namespace}``; name templates also
    ``${pvc.name}`` and ``${pvc.annotations['KEY']}``. Claim tokens are unavailable when
    ``claim`` is None (deletion). Returns None when the class configures no such secret.
    Raises ValueError with a message for the user otherwise.
    """
    name_template = class_parameters.get(params.name_key, "")
    namespace_template = class_parameters.get(params.namespace_key, "")
    if not name_template and not namespace_template:
        return None
    if not name_template or not namespace_template:
        raise ValueError(
            f"either name and namespace for {params.kind} secrets specified, both must be "
            f"specified ({params.name_key}, {params.namespace_key})"
        )
    namespace_params = {_TOKEN_PV_NAME: pv_name}
    name_params = {_TOKEN_PV_NAME: pv_name}
    if claim is not None:
        metadata = claim.get("metadata") or {}
        namespace_params[_TOKEN_PVC_NAMESPACE] = metadata.get("namespace", "")
        name_params[_TOKEN_PVC_NAMESPACE] = metadata.get("namespace", "")
        name_params[_TOKEN_PVC_NAME] = metadata.get("name", "")
        for key, value in (metadata.get("annotations") or {}).items():
            name_params[f"pvc.annotations['{key}']"] = value
    namespace = _resolve_checked(
        namespace_template,
        namespace_params,
        params.namespace_key,
        valid=is_dns1123_label,
        what="namespace name (a DNS-1123 label)",
    )
    name = _resolve_checked(
        name_template,
        name_params,
        params.name_key,
        valid=is_dns1123_subdomain,
        what="secret name (a DNS-1123 subdomain)",
    )
    return SecretRef(name, namespace)


def _resolve_checked(
    template: str,
    params: Mapping[str, str],
    key: str,
    *,
    valid: Callable[[str], bool],
    what: str,
) -> str:
    """``template`` (the class parameter ``key``) resolved with ``params``; raises ValueError
    unless the result is a ``valid`` ``what``."""
    try:
        value = resolve_template(template, params)
    except ValueError as err:
        raise ValueError(f"error resolving value {template!r} of {key}: {err}") from None
    if valid(value):
        return value
    if template != value:
        raise ValueError(f"{key} {template!r} resolved to {value!r} which is not a valid {what}")
    raise ValueError(f"{key} {template!r} is not a valid {what}")


async def read_secret(secrets: ResourceClient, ref: SecretRef) -> dict[str, str]:
    """The Secret's data, decoded (raises PreparationError naming the Secret, never a value)."""
    try:
        secret = await secrets.get(ref.name, ref.namespace)
    except ApiException as err:
        raise PreparationError(
            f"error getting secret {ref.name} in namespace {ref.namespace}: "
            f"{err.status} {err.reason}"
        ) from None
    data: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            # The message names the key only: the value is the secret.
            raise PreparationError(
                f"secret {ref.namespace}/{ref.name}: value of key {key!r} is not UTF-8 text"
            ) from None
    return data
