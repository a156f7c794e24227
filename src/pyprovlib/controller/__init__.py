"""Controllers built on :mod:`pyprovlib.kube`: provisioning, attaching, resizing."""

__all__: list[str] = []  # nothing is re-exported here; the controllers live in the submodules
