"""A small CSI driver in Python on :mod:`pyprovlib.csi.server`: the counterpart of
kubernetes-csi/csi-driver-host-path, run with ``python -m pyprovlib.examples.csi_hostpath
--endpoint unix:///abs/csi.sock --nodeid NODE`` (``--help`` for the flags).

Volumes are directories in ``--statedir``; snapshots copies of them; staging and publishing
create the directories the CO names. It passes the CSI conformance suite (csi-sanity).
"""

# The package exports what the driver module does: its ``__all__`` is the one list.
from pyprovlib.examples.csi_hostpath import driver
from pyprovlib.examples.csi_hostpath.driver import *  # noqa: F403

__all__ = driver.__all__
