"""``python -m pyprovlib.csi.provisioner``: the external-provisioner sidecar."""

import sys

from pyprovlib.csi.provisioner.main import main

if __name__ == "__main__":
    sys.exit(main())
