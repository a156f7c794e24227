"""An options field renamed for one release: the old keyword still works in the constructor and
the old attribute still reads, each with a DeprecationWarning naming the new name (issue 29 made
``workers`` the one name of the worker count)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["renamed_field", "warn_renamed"]

T = TypeVar("T")


def warn_renamed(owner: str, old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``owner``'s keyword ``old`` is deprecated in favour of ``new`` (for a plain
    ``__init__``; ``stacklevel`` 3 points at the caller of the function that warns)."""
    warnings.warn(
        f"{owner}({old}=...) is deprecated: use {new}=", DeprecationWarning, stacklevel=stacklevel
    )


def renamed_field(old: str, new: str) -> Callable[[type[T]], type[T]]:
    """Class decorator for a dataclass whose field ``new`` was called ``old``: ``Cls(old=...)``
    sets ``new`` and ``obj.old`` reads it, both warning that ``old`` is deprecated. Giving both
    names is a :class:`TypeError`."""

    def decorate(cls: type[T]) -> type[T]:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: T, *args: Any, **kwargs: Any) -> None:
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(
                        f"{cls.__name__}() got both {new}= and {old}=: give {new}= only "
                        f"({old} is its deprecated name)"
                    )
                warn_renamed(cls.__name__, old, new)
                kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        def read_old(self: T) -> Any:
            warnings.warn(
                f"{cls.__name__}.{old} is deprecated: read {new}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(self, new)

        setattr(cls, "__init__", __init__)  # noqa: B010 - mypy refuses assigning a method
        setattr(cls, old, property(read_old, doc=f"Deprecated name of :attr:`{new}`."))
        return cls

    return decorate
