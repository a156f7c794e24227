"""``python -m pyprovlib.csi.provisioner``: the external-provisioner sidecar."""

import sys

import pyprovlib

if __name__ == "__main__":
    # First, before anything imports kubernetes_asyncio: its ~830 generated API and model
    # modules then load on first use (docs/operations.md, "Memory").
    pyprovlib.enable_lazy_kubernetes_imports()
    from pyprovlib.csi.provisioner._main import main

    sys.exit(main())
