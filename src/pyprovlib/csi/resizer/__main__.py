"""``python -m pyprovlib.csi.resizer``: the external-resizer sidecar."""

import sys

from pyprovlib.csi.resizer.main import main

if __name__ == "__main__":
    sys.exit(main())
