"""``python -m pyprovlib.examples.nfs``: run the NFS subdirectory provisioner (``--help`` for
the flags)."""

import sys

from pyprovlib.examples.nfs.cli import main

if __name__ == "__main__":
    sys.exit(main())
