"""What the provisioning controller wrote about volumes that its cache has not shown yet.

In the spirit of kube-controller-manager's ``ControllerExpectations``: a worker decides from the
informer cache, and the cache lags the controller's own writes. Everything the volume side must
remember across that lag lives here, and nowhere else.

Invariants:

- A PV name is *expected* from just before the controller asks the volume store to save it
  until a volume worker has processed an event for that name (the cache shows it) or the save
  failed for good. While expected, no claim is provisioned again for that PV name.
- A PV's asset is *deleted* from the moment ``Provisioner.delete`` returned for it until a
  volume worker sees the PV gone (or replaced by a PV of another UID). While deleted, updates of
  the PV racing with its deletion never delete the asset a second time.
- Only workers read or write this object; event handlers only enqueue keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyprovlib.kube._objects import name_of, uid_of

__all__ = ["VolumeExpectations"]


class VolumeExpectations:
    """PVs saved but not yet seen in the cache, and PVs whose asset is already deleted."""

    def __init__(self) -> None:
        self._saved: set[str] = set()
        self._assets_deleted: dict[str, str] = {}  # PV name -> UID of the PV deleted

    # -- saves -------------------------------------------------------------------------------

    def expect_saved(self, pv_name: str) -> None:
        """The PV is about to be saved: the cache may show it before the save returns."""
        self._saved.add(pv_name)

    def save_failed(self, pv_name: str) -> None:
        """The store gave up (and cleaned up): the PV will not appear."""
        self._saved.discard(pv_name)

    def saved_not_seen(self, pv_name: str) -> bool:
        """Whether the PV was saved (or is being saved) but the cache may not show it."""
        return pv_name in self._saved

    # -- asset deletion ----------------------------------------------------------------------

    def asset_deleted(self, volume: Mapping[str, Any]) -> None:
        """``Provisioner.delete`` succeeded for ``volume``; its PV object still exists."""
        self._assets_deleted[name_of(volume)] = uid_of(volume)

    def is_asset_deleted(self, volume: Mapping[str, Any]) -> bool:
        """Whether the asset of this very PV (same name and UID) was deleted already."""
        return self._assets_deleted.get(name_of(volume)) == uid_of(volume)

    # -- what the cache shows ----------------------------------------------------------------

    def observed(self, pv_name: str, current: Mapping[str, Any] | None) -> None:
        """A volume worker processed an event for ``pv_name``; ``current`` is what the cache
        holds now (None: the PV is gone)."""
        self._saved.discard(pv_name)
        deleted_uid = self._assets_deleted.get(pv_name)
        if deleted_uid is not None and (current is None or uid_of(current) != deleted_uid):
            del self._assets_deleted[pv_name]

    def __len__(self) -> int:
        return len(self._saved) + len(self._assets_deleted)
