"""Ceph RBD example backend: the in-tree Kubernetes RBD provisioner's behaviour on pyprovlib,
each volume an RBD image created and deleted with the ``rbd`` command. Run it with
``python -m pyprovlib.examples.rbd``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.examples.rbd._provisioner import RBDParameters, RBDProvisioner
    from pyprovlib.examples.rbd._resizer import RBDResizer

__all__ = [
    "RBDParameters",
    "RBDProvisioner",
    "RBDResizer",
]

# Imported on first use, so `python -m pyprovlib.examples.rbd` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._provisioner": ["RBDParameters", "RBDProvisioner"],
        "._resizer": ["RBDResizer"],
    },
)
