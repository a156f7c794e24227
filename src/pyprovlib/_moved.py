"""Old import paths that the guides once showed, kept working with a DeprecationWarning.

Each entry of :data:`MOVED` is a module that became internal when the public API moved into the
package ``__init__`` files: importing a name from the old path still works, warns, and names
the public place to import it from. The old module file holds nothing but :func:`forwarder`.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any, Final

__all__ = ["MOVED", "forwarder"]

MOVED: Final[dict[str, tuple[str, str]]] = {
    # old path: (the internal module that holds the names now, where users import them from)
    "pyprovlib.provisioner": ("pyprovlib._provisioner", "pyprovlib"),
    "pyprovlib.attacher": ("pyprovlib._attacher", "pyprovlib"),
    "pyprovlib.resizer": ("pyprovlib._resizer", "pyprovlib"),
    "pyprovlib.controller.attach_options": ("pyprovlib.controller._attach.options", "pyprovlib"),
    "pyprovlib.controller.resize_options": ("pyprovlib.controller._resize.options", "pyprovlib"),
    "pyprovlib.csi.server": ("pyprovlib.csi._server", "pyprovlib.csi"),
    "pyprovlib.csi.validate": ("pyprovlib.csi._validate", "pyprovlib.csi"),
    "pyprovlib.testing.node": ("pyprovlib.testing._node", "pyprovlib.testing"),
}
"""Old module path → (internal module, public package)."""


def forwarder(old: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` (PEP 562) of the deprecated module ``old``: each name is
    looked up in the internal module it moved to, with a DeprecationWarning naming the public
    package to import it from instead."""
    internal, public = MOVED[old]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(importlib.import_module(internal), name)
        where = public if name in getattr(importlib.import_module(public), "__all__", ()) else None
        advice = f"import it from {where}" if where else "it is internal and may change"
        warnings.warn(
            f"{old} is deprecated: {name} moved ({advice})", DeprecationWarning, stacklevel=2
        )
        return value

    return __getattr__
