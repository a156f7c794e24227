"""Which claim updates are only the echo of the controller's own provisioning-protection PATCH
(``only_protection_changed``): those need no sync; every other update, and every resync, does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pyprovlib.controller._provision.protection import (
    FINALIZER_PROVISIONING,
    only_protection_changed,
)

PVC_PROTECTION = "kubernetes.io/pvc-protection"


def claim(rv: str = "10", finalizers: list[str] | None = None, **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "data",
            "namespace": "default",
            "uid": "u-1",
            "resourceVersion": rv,
            "annotations": {"volume.kubernetes.io/storage-provisioner": "example.com/p"},
            "finalizers": [PVC_PROTECTION] if finalizers is None else finalizers,
            "managedFields": [{"manager": "kube-controller-manager", "time": rv}],
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast"},
        "status": {"phase": "Pending"},
    }
    for path, value in changes.items():
        section, key = path.split("__")
        obj[section][key] = value
    return obj


def test_finalizer_added_or_removed_alone_is_an_echo() -> None:
    before = claim("10")
    after = claim("11", [PVC_PROTECTION, FINALIZER_PROVISIONING])
    after["metadata"]["managedFields"] = [{"manager": "pyprovlib", "time": "11"}]
    assert only_protection_changed(before, after)
    assert only_protection_changed(after, claim("12"))


def test_a_resync_is_never_an_echo() -> None:
    obj = claim("10", [FINALIZER_PROVISIONING])
    assert not only_protection_changed(obj, copy.deepcopy(obj))
    # Even if the cache somehow held a differing copy under the same resourceVersion.
    assert not only_protection_changed(claim("10"), claim("10", [FINALIZER_PROVISIONING]))


@pytest.mark.parametrize(
    "after",
    [
        # Something besides our finalizer changed in the same write: a real update.
        claim("11", [PVC_PROTECTION, FINALIZER_PROVISIONING], spec__volumeName="pv-1"),
        claim("11", [PVC_PROTECTION, FINALIZER_PROVISIONING], status__phase="Bound"),
        claim("11", [FINALIZER_PROVISIONING]),  # another finalizer went away
        claim("11", [PVC_PROTECTION, "example.com/other", FINALIZER_PROVISIONING]),
        claim(
            "11",
            [PVC_PROTECTION, FINALIZER_PROVISIONING],
            metadata__deletionTimestamp="2026-11-22T00:00:00Z",
        ),
        claim(
            "11",
            [PVC_PROTECTION, FINALIZER_PROVISIONING],
            metadata__annotations={"volume.kubernetes.io/selected-node": "n1"},
        ),
        # Our finalizer did not change: whatever changed (if anything), sync.
        claim("11"),
        claim("11", [PVC_PROTECTION], spec__volumeName="pv-1"),
    ],
    ids=[
        "volume-name",
        "status",
        "other-finalizer-gone",
        "other-finalizer-added",
        "deleted",
        "annotations",
        "no-change-but-rv",
        "ours-unchanged",
    ],
)
def test_other_updates_are_synced(after: dict[str, Any]) -> None:
    assert not only_protection_changed(claim("10"), after)


def test_new_top_level_field_is_an_update() -> None:
    after = claim("11", [PVC_PROTECTION, FINALIZER_PROVISIONING])
    after["extra"] = {}
    assert not only_protection_changed(claim("10"), after)
