"""``python -m pyprovlib.csi``: the CSI provisioner, attacher and resizer in one process (see
:mod:`pyprovlib.csi.combined`)."""

import sys

from pyprovlib.csi.combined import main

if __name__ == "__main__":
    sys.exit(main())
