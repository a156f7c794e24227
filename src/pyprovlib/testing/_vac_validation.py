"""kube-apiserver's rules for VolumeAttributesClasses (storage.k8s.io/v1) and for the
``volumeAttributesClassName`` fields of claims and volumes, as a real v1.36 server answers them
(checked against one; tests/e2e/test_differential_vac.py runs the same requests on both).

- A class needs a ``driverName`` (a qualified name, checked lowercased, as a StorageClass's
  provisioner) and at least one parameter: no empty key, at most 512 of them, 256 KiB in all.
  Neither may change afterwards.
- A claim's class name is a DNS-1123 subdomain when set. It may change only while the claim is
  Bound, and not to nil or "" once ``status.currentVolumeAttributesClassName`` is set.
- A volume's class name is a DNS-1123 subdomain, never "", and never unset once set.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pyprovlib.kube._objects import is_dns1123_subdomain
from pyprovlib.testing._causes import Cause, forbidden, invalid_value, required
from pyprovlib.testing._labels import SUBDOMAIN_MSG

__all__ = [
    "pv_vac_causes",
    "pv_vac_update_causes",
    "pvc_vac_causes",
    "pvc_vac_update_causes",
    "vac_causes",
    "vac_update_causes",
]

FIELD: Final = "volumeAttributesClassName"
_MAX_PARAMETERS: Final = 512
_MAX_PARAMETERS_SIZE: Final = 256 * 1024

_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_NAME_PART_FMT = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


def _too_long(field: str, limit: int) -> Cause:
    return ("FieldValueTooLong", f"Too long: may not be more than {limit} bytes", field)


def _qualified_name_messages(value: str) -> list[str]:
    """apimachinery's IsQualifiedName: an optional DNS-subdomain prefix and '/', then a name
    part of at most 63 characters."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        if not is_dns1123_subdomain(prefix):
            return ["prefix part " + SUBDOMAIN_MSG]
    else:
        return [
            "a valid label key " + _NAME_PART_FMT + " with an optional DNS subdomain prefix and "
            "'/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        return ["name part must be non-empty"]
    if len(name) > 63:
        return ["name part must be no more than 63 characters"]
    if not _NAME_PART.match(name):
        return ["name part " + _NAME_PART_FMT]
    return []


def vac_causes(obj: dict[str, Any]) -> list[Cause]:
    """ValidateVolumeAttributesClass: the driver name and the parameters."""
    causes: list[Cause] = []
    driver = obj.get("driverName")
    if not isinstance(driver, str) or not driver:
        causes.append(required("driverName"))
    else:
        # validateProvisioner checks the lowercased name and reports it so.
        lowered = driver.lower()
        causes.extend(
            invalid_value("driverName", lowered, m) for m in _qualified_name_messages(lowered)
        )
    parameters = obj.get("parameters")
    parameters = parameters if isinstance(parameters, dict) else {}
    if len(parameters) > _MAX_PARAMETERS:
        causes.append(_too_long("parameters", _MAX_PARAMETERS))
    size = 0
    for key, value in parameters.items():
        if not key:
            causes.append(invalid_value("parameters", key, "field can not be empty."))
        size += len(key) + len(str(value))
    if size > _MAX_PARAMETERS_SIZE:
        causes.append(_too_long("parameters", _MAX_PARAMETERS_SIZE))
    if not parameters:
        causes.append(required("parameters", "must contain at least one key/value pair"))
    return causes


def vac_update_causes(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """ValidateVolumeAttributesClassUpdate: the driver and the parameters are fixed."""
    causes: list[Cause] = []
    if (old.get("parameters") or {}) != (new.get("parameters") or {}):
        causes.append(forbidden("parameters", "updates to parameters are forbidden."))
    if old.get("driverName") != new.get("driverName"):
        causes.append(forbidden("driverName", "updates to driverName are forbidden."))
    return causes


def _class_name_causes(spec: dict[str, Any], *, empty_allowed: bool) -> list[Cause]:
    name = spec.get(FIELD)
    if name is None:
        return []
    if not isinstance(name, str):
        return []  # the type check refuses it first
    if not name:
        return [] if empty_allowed else [required(f"spec.{FIELD}", "an empty string is disallowed")]
    if not is_dns1123_subdomain(name):
        return [invalid_value(f"spec.{FIELD}", name, SUBDOMAIN_MSG)]
    return []


def pvc_vac_causes(spec: dict[str, Any]) -> list[Cause]:
    """A claim's class name: unset, "" or a DNS-1123 subdomain."""
    return _class_name_causes(spec, empty_allowed=True)


def pvc_vac_update_causes(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """A claim with a current class may not drop its class (the immutability of the rest of
    the field is the spec's, which only a Bound claim escapes)."""
    old_name = (old.get("spec") or {}).get(FIELD)
    new_name = (new.get("spec") or {}).get(FIELD)
    current = (old.get("status") or {}).get("currentVolumeAttributesClassName")
    if old_name == new_name or current is None:
        return []
    if new_name is None:
        return [
            forbidden(
                f"spec.{FIELD}",
                "update to nil is forbidden when status.currentVolumeAttributesClassName is "
                "not nil",
            )
        ]
    if new_name == "":
        return [
            forbidden(
                f"spec.{FIELD}",
                "update to empty string is forbidden when status.currentVolumeAttributesClassName "
                "is not nil",
            )
        ]
    return []


def pv_vac_causes(spec: dict[str, Any]) -> list[Cause]:
    """A volume's class name: unset or a DNS-1123 subdomain, never ""."""
    return _class_name_causes(spec, empty_allowed=False)


def pv_vac_update_causes(old_spec: dict[str, Any], new_spec: dict[str, Any]) -> list[Cause]:
    """A volume's class, once set, stays set."""
    if old_spec.get(FIELD) is not None and new_spec.get(FIELD) is None:
        return [forbidden(f"spec.{FIELD}", "update from non-nil value to nil is forbidden")]
    return []
