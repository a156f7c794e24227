"""Per-stage timestamps inside the Python CSI provisioner sidecar, for ``csi_real.py --stages``.

:func:`install` wraps a few of pyprovlib's own methods (never a dependency's) so each claim's
way to its PV is timed with ``time.monotonic()`` (CLOCK_MONOTONIC: comparable with the bench
process's clock), keyed by the claim's uid:

- ``event``: the claim's watch event reached the informer's handlers (and the work queue);
- ``worker``: a worker took the claim from the queue (each time);
- ``provision``: ``CSIProvisioner.provision`` was entered;
- ``csi_sent`` / ``csi_answered``: CreateVolume sent and answered;
- ``pv_sent`` / ``pv_answered``: the PV's POST sent and answered;
- ``pv_cached``: the PV's watch event reached the informer's handlers.

Written as JSON lines (``{"uid":…, "name":…, "stage":…, "t":…}``) when the process exits.
"""

from __future__ import annotations

import atexit
import functools
import json
import time
from typing import Any

_records: list[tuple[str, str, float]] = []
_names: dict[str, str] = {}


def _mark(uid: str, stage: str) -> None:
    _records.append((uid, stage, time.monotonic()))


def _uid_of_pv_name(name: str) -> str:
    return name[4:] if name.startswith("pvc-") else name


def install(path: str) -> None:
    from pyprovlib.controller._provision import ProvisionController
    from pyprovlib.controller._provision.claims import ClaimSync
    from pyprovlib.csi._connection import CSIConnection
    from pyprovlib.csi.provisioner import CSIProvisioner
    from pyprovlib.kube._rest import ResourceClient

    enqueue_claim = ProvisionController._enqueue_claim
    process_claim = ClaimSync.process
    enqueue_volume = ProvisionController._enqueue_volume
    provision = CSIProvisioner.provision
    create_volume = CSIConnection.create_volume
    create = ResourceClient.create

    @functools.wraps(enqueue_claim)
    def traced_enqueue_claim(self: Any, obj: Any) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid", "")
        _names.setdefault(uid, meta.get("name", ""))
        _mark(uid, "event")
        enqueue_claim(self, obj)

    @functools.wraps(process_claim)
    async def traced_process_claim(self: Any, key: str) -> None:
        _mark(key, "worker")
        await process_claim(self, key)

    @functools.wraps(enqueue_volume)
    def traced_enqueue_volume(self: Any, obj: Any) -> None:
        _mark(_uid_of_pv_name((obj.get("metadata") or {}).get("name", "")), "pv_cached")
        enqueue_volume(self, obj)

    @functools.wraps(provision)
    async def traced_provision(self: Any, options: Any) -> Any:
        _mark(options.claim_object["metadata"]["uid"], "provision")
        return await provision(self, options)

    @functools.wraps(create_volume)
    async def traced_create_volume(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        uid = _uid_of_pv_name(request.name)
        _mark(uid, "csi_sent")
        try:
            return await create_volume(self, request, *args, **kwargs)
        finally:
            _mark(uid, "csi_answered")

    @functools.wraps(create)
    async def traced_create(self: Any, obj: Any, namespace: str | None = None) -> Any:
        if obj.get("kind") != "PersistentVolume":
            return await create(self, obj, namespace)
        uid = _uid_of_pv_name(obj["metadata"]["name"])
        _mark(uid, "pv_sent")
        try:
            return await create(self, obj, namespace)
        finally:
            _mark(uid, "pv_answered")

    ProvisionController._enqueue_claim = traced_enqueue_claim  # type: ignore[method-assign]
    ClaimSync.process = traced_process_claim  # type: ignore[method-assign]
    ProvisionController._enqueue_volume = traced_enqueue_volume  # type: ignore[method-assign]
    CSIProvisioner.provision = traced_provision  # type: ignore[method-assign]
    CSIConnection.create_volume = traced_create_volume  # type: ignore[method-assign]
    ResourceClient.create = traced_create  # type: ignore[method-assign]

    def dump() -> None:
        with open(path, "w") as out:
            for uid, stage, t in _records:
                out.write(
                    json.dumps({"uid": uid, "name": _names.get(uid, ""), "stage": stage, "t": t})
                )
                out.write("\n")

    atexit.register(dump)
