"""hostpath example backend: local PersistentVolumes in ``<basePath>/<pv name>`` on the node the
scheduler picked (OpenEBS local-hostpath style). Run it with ``python -m
pyprovlib.examples.hostpath`` (``--demo`` for a self-contained tour)."""

# The package exports what its modules do: their ``__all__`` lists are the one place the names
# are written.
from pyprovlib.examples.hostpath import helper_pod, provisioner
from pyprovlib.examples.hostpath.helper_pod import *  # noqa: F403
from pyprovlib.examples.hostpath.provisioner import *  # noqa: F403

__all__ = provisioner.__all__ + helper_pod.__all__
