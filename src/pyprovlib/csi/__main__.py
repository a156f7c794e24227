"""``python -m pyprovlib.csi``: the CSI provisioner, attacher and resizer in one process (see
:mod:`pyprovlib.csi._combined`)."""

import sys

import pyprovlib

if __name__ == "__main__":
    # First, before anything imports kubernetes_asyncio: its ~830 generated API and model
    # modules then load on first use (docs/operations.md, "Memory").
    pyprovlib.enable_lazy_kubernetes_imports()
    from pyprovlib.csi._combined import main

    sys.exit(main())
