"""``python -m pyprovlib.examples.hostpath``: run the hostpath provisioner (``--help`` for the
flags, ``--demo`` for a self-contained tour)."""

import sys

from pyprovlib.examples.hostpath.cli import main

if __name__ == "__main__":
    sys.exit(main())
