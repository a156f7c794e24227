"""``python -m pyprovlib.csi.attacher``: the external-attacher sidecar."""

import sys

from pyprovlib.csi.attacher.main import main

if __name__ == "__main__":
    sys.exit(main())
