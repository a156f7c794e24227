"""``python -m pyprovlib.testing`` and the ``pyprovlib-apiserver`` command: the in-memory API
server standalone (:mod:`pyprovlib.testing._cli` has the flags)."""

from __future__ import annotations

import sys

import pyprovlib

__all__ = ["main"]


def main(prog: str | None = None) -> int:
    """Run the command line; ``prog`` defaults to the name the program was called by (the
    ``pyprovlib-apiserver`` console script calls this with none)."""
    # First, before anything imports kubernetes_asyncio: its ~830 generated API and model
    # modules then load on first use (docs/operations.md, "Memory").
    pyprovlib.enable_lazy_kubernetes_imports()
    from pyprovlib.testing import _cli as cli

    return cli.main(prog=prog)


if __name__ == "__main__":
    sys.exit(main(prog="python -m pyprovlib.testing"))
