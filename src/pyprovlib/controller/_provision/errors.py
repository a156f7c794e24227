"""The provisioning controller's errors: a claim naming an unknown class, which failures are
infeasible (their retries are delayed), and how an error is described in events and logs
without leaking what user code put in its message.
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from pyprovlib._errors import PyprovlibError
from pyprovlib._provisioner import InfeasibleError
from pyprovlib.controller._errors import describe_error as describe

__all__ = ["ClassNotFoundError", "describe", "is_infeasible_error"]


class ClassNotFoundError(PyprovlibError, LookupError):
    """The StorageClass a claim names is not (yet) known."""

    def __init__(self, class_name: str) -> None:
        super().__init__(
            f'StorageClass "{class_name}" not found: create it, or correct the claim\'s '
            "storageClassName"
        )
        self.class_name = class_name


def is_infeasible_error(err: BaseException) -> bool:
    """True for :class:`InfeasibleError` and for a gRPC ``INVALID_ARGUMENT`` status (a CSI
    driver refusing the request), also when it is the cause or context of the error raised
    (``raise ProvisioningError(...) from None`` still records the gRPC error as context)."""
    seen: set[int] = set()
    pending: list[BaseException] = [err]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, InfeasibleError):
            return True
        if isinstance(current, GRPCError) and current.status is Status.INVALID_ARGUMENT:
            return True
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False
