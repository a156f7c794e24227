"""``python -m pyprovlib.examples.csi_hostpath``: run the hostpath CSI driver (``--help``)."""

import sys

from pyprovlib.examples.csi_hostpath.cli import main

if __name__ == "__main__":
    sys.exit(main())
