"""A small CSI driver in Python on :mod:`pyprovlib.csi`'s server kit: the counterpart of
kubernetes-csi/csi-driver-host-path, run with ``python -m pyprovlib.examples.csi_hostpath
--endpoint unix:///abs/csi.sock --nodeid NODE`` (``--help`` for the flags).

Volumes are directories in ``--statedir``; snapshots copies of them; staging and publishing
create the directories the CO names. It passes the CSI conformance suite (csi-sanity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.examples.csi_hostpath._cli import serve
    from pyprovlib.examples.csi_hostpath._driver import (
        DriverOptions,
        HostPathController,
        HostPathIdentity,
        HostPathNode,
    )

__all__ = [
    "DriverOptions",
    "HostPathController",
    "HostPathIdentity",
    "HostPathNode",
    "serve",
]

# Imported on first use, so `python -m pyprovlib.examples.csi_hostpath` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._driver": ["DriverOptions", "HostPathController", "HostPathIdentity", "HostPathNode"],
        "._cli": ["serve"],
    },
)
