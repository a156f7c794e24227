"""NFS example backend: each volume a subdirectory of one NFS export
(nfs-subdir-external-provisioner style). Run it with ``python -m pyprovlib.examples.nfs``."""

# The package exports what the provisioner module does: its ``__all__`` is the one list.
from pyprovlib.examples.nfs import provisioner
from pyprovlib.examples.nfs.provisioner import *  # noqa: F403

__all__ = provisioner.__all__
