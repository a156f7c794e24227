"""A controller's options built from the runtime's flags, in one place per options type, so a
flag and an option cannot disagree.

The flags follow the CSI sidecars (``--worker-threads``, ``--leader-election=false``, ...); the
option dataclasses follow the Go libraries they port (``leader_election=True`` in
sig-storage-lib-external-provisioner), except the worker count, ``workers`` in all of them
(upstream's ``Threadiness``, ``--worker-threads`` and ``--workers``). Each function here
copies every setting the flags carry into the matching option field and takes the
controller-specific rest as keywords::

    options = provision_controller_options(ctx.options, add_finalizer=True)

A keyword naming a field the flags already set is refused (``TypeError``, naming the flag):
change the flag, or the entry point's default for it (``common_parser(defaults=...)``).

=========================  ==================================================================
flag                       option field
=========================  ==================================================================
``--worker-threads``       ``workers``
``--leader-election``      ``leader_election``
``--leader-election-*``    ``leader_election_namespace`` (resolved: flag, ``POD_NAMESPACE``,
                           the service account's namespace, ``default``), ``lease_duration``,
                           ``renew_deadline``, ``retry_period``
=========================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from pyprovlib.controller._attach.options import AttachControllerOptions
    from pyprovlib.controller._options import ProvisionControllerOptions
    from pyprovlib.controller._resize.options import ResizeControllerOptions
    from pyprovlib.runtime._flags import CommonOptions

__all__ = [
    "FLAG_OF_FIELD",
    "attach_controller_options",
    "provision_controller_options",
    "resize_controller_options",
]

FLAG_OF_FIELD: Final[Mapping[str, str]] = {
    "threadiness": "--worker-threads",
    "worker_threads": "--worker-threads",
    "workers": "--worker-threads",
    "leader_election": "--leader-election",
    "leader_election_namespace": "--leader-election-namespace",
    "lease_duration": "--leader-election-lease-duration",
    "renew_deadline": "--leader-election-renew-deadline",
    "retry_period": "--leader-election-retry-period",
}
"""Each option field the flags set, with the flag that sets it."""


# the worker count's former names (still accepted by the options, with a DeprecationWarning)
_OLD_WORKERS_NAMES: Final = frozenset({"threadiness", "worker_threads"})


def _from_flags(flags: CommonOptions, fields: Mapping[str, Any]) -> Any:
    derived: dict[str, Any] = {"workers": flags.workers, **flags.leader_election_fields()}
    clash = sorted((derived.keys() | _OLD_WORKERS_NAMES) & fields.keys())
    if clash:
        named = ", ".join(f"{name} (from {FLAG_OF_FIELD[name]})" for name in clash)
        verb = "is" if len(clash) == 1 else "are"
        raise TypeError(
            f"{named} {verb} set by the command-line flags and cannot be passed as well: change "
            "the flag, or the entry point's default for it (common_parser(defaults=...))"
        )
    return {**derived, **fields}


def provision_controller_options(
    flags: CommonOptions, /, **fields: Any
) -> ProvisionControllerOptions:
    """:class:`~pyprovlib.ProvisionControllerOptions` from the flags
    (``workers`` from ``--worker-threads``, leader election from ``--leader-election*``)
    and ``fields`` for the rest."""
    from pyprovlib.controller._options import ProvisionControllerOptions

    return ProvisionControllerOptions(**_from_flags(flags, fields))


def attach_controller_options(flags: CommonOptions, /, **fields: Any) -> AttachControllerOptions:
    """:class:`~pyprovlib.AttachControllerOptions` from the flags
    (``workers`` from ``--worker-threads``, leader election from
    ``--leader-election*``) and ``fields`` for the rest."""
    from pyprovlib.controller._attach.options import AttachControllerOptions

    return AttachControllerOptions(**_from_flags(flags, fields))


def resize_controller_options(flags: CommonOptions, /, **fields: Any) -> ResizeControllerOptions:
    """:class:`~pyprovlib.ResizeControllerOptions` from the flags
    (``workers`` from ``--worker-threads``, which the resizer also accepts as external-resizer's
    ``--workers``; leader election from ``--leader-election*``) and ``fields`` for the rest."""
    from pyprovlib.controller._resize.options import ResizeControllerOptions

    return ResizeControllerOptions(**_from_flags(flags, fields))
