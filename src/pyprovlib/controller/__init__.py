"""Controllers built on :mod:`pyprovlib.kube`: provisioning, attaching, resizing."""
