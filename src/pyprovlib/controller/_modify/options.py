"""Options of the :class:`~pyprovlib.ModifyController`, carrying
kubernetes-csi/external-resizer's flag defaults (``cmd/csi-resizer``: the modify controller
shares the resizer's flags) in one frozen dataclass.

Durations are seconds (floats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.controller._modify.errors import InvalidModifyOptionsError
from pyprovlib.controller._resize.options import ResizerSidecarOptions
from pyprovlib.controller._sidecar_options import sanitize_driver_name

__all__ = [
    "LEASE_NAME_PREFIX",
    "InvalidModifyOptionsError",
    "ModifyControllerOptions",
    "lease_name",
]

LEASE_NAME_PREFIX: Final = "external-resizer-modify-"
"""A ModifyController run on its own elects with ``external-resizer-modify-<modifier>``: not
the resizer's Lease, which a ResizeController in the same process may hold. The resizer
sidecar runs both under the resizer's one Lease, as upstream."""


def lease_name(modifier_name: str) -> str:
    """The leader election Lease of a ModifyController run on its own for ``modifier_name``."""
    return LEASE_NAME_PREFIX + sanitize_driver_name(modifier_name)


@dataclass(frozen=True)
class ModifyControllerOptions(ResizerSidecarOptions):
    """How a :class:`~pyprovlib.ModifyController` runs.

    ``extra_modify_metadata`` (``--extra-modify-metadata``): add the claim's name and namespace
    and the volume's name to the parameters of every modification
    (``csi.storage.k8s.io/pvc/name``, ``.../pvc/namespace``, ``.../pv/name``).
    ``retry_interval_max`` is also how long an infeasible modification waits before it is tried
    again with the same class. The timing fields (and their defaults) are the resizer's
    (:class:`~pyprovlib.controller._resize.options.ResizerSidecarOptions`); the leader election
    fields and ``registry`` are the keyword-only fields of
    :class:`~pyprovlib.controller._sidecar_options.SidecarControllerOptions`.
    """

    invalid_error: ClassVar[type[InvalidOptionsError]] = InvalidModifyOptionsError

    extra_modify_metadata: bool = False
