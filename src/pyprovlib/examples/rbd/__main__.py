"""``python -m pyprovlib.examples.rbd``: run the Ceph RBD provisioner (``--help`` for the
flags)."""

import sys

from pyprovlib.examples.rbd.cli import main

if __name__ == "__main__":
    sys.exit(main())
