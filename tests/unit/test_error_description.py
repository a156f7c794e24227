"""One description of an error for events, statuses and logs, errors classified by type, and
the object helpers every controller shares (issue 29: copies that had drifted)."""

from __future__ import annotations

import json

import aiohttp
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from pyprovlib._attacher import AttachError
from pyprovlib._errors import PyprovlibError
from pyprovlib._provisioner import ProvisioningError
from pyprovlib._resizer import ResizeError
from pyprovlib.controller._errors import describe_error, is_user_bug
from pyprovlib.controller._provision.errors import describe, is_infeasible_error
from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._objects import is_deleting, spec_of, status_of


def _api_error(code: int, reason: str, message: str | None) -> ApiException:
    err = ApiException(status=code, reason=reason)
    if message is not None:
        err.body = json.dumps({"kind": "Status", "message": message, "code": code}).encode()
    return err


def test_an_api_error_reads_as_its_status_message_everywhere() -> None:
    err = _api_error(409, "Conflict", 'persistentvolumes "pv-1" already exists')
    assert describe_error(err) == 'persistentvolumes "pv-1" already exists'
    # the provisioning controller's name for it is the same function
    assert describe is describe_error
    assert describe_error(_api_error(500, "Internal Server Error", None)) == (
        "500 Internal Server Error"
    )


def test_contract_library_and_user_errors() -> None:
    assert describe_error(AttachError("no such node")) == "no such node"
    assert describe_error(ResizeError("too big", code=11)) == "too big"
    assert describe_error(ProvisioningError("backend full")) == "backend full"
    assert describe_error(ZeroDivisionError("division by zero")) == (
        "ZeroDivisionError: division by zero"
    )
    assert describe_error(KeyError()) == "KeyError"
    # a user bug's text may quote anything: scrubbed; a contract error's message is the
    # user's own words (the contract says: no secrets in it), shown as written
    assert "hunter2" not in describe_error(ValueError("password=hunter2"))
    assert describe_error(ProvisioningError("adminId '--keyring=/x' is invalid")) == (
        "adminId '--keyring=/x' is invalid"
    )


def test_errors_are_classified_by_type_not_by_module_name() -> None:
    for expected in (
        PyprovlibError("x"),
        aiohttp.ClientConnectionError("refused"),
        GRPCError(Status.UNAVAILABLE, "down"),
        StreamTerminatedError("reset"),
        _api_error(404, "Not Found", None),
        TimeoutError(),
        OSError("disk"),
    ):
        assert not is_user_bug(expected), expected
    # A user's class is a user bug wherever it is defined, even in a module whose name looks
    # like a library's.
    lookalike = type("Boom", (Exception,), {"__module__": "grpclib.mine"})
    assert is_user_bug(lookalike("boom"))
    assert is_user_bug(ValueError("bad"))


def test_infeasible_is_grpcs_invalid_argument_by_type() -> None:
    assert is_infeasible_error(GRPCError(Status.INVALID_ARGUMENT, "bad size"))
    assert not is_infeasible_error(GRPCError(Status.UNAVAILABLE, "down"))
    status = type("S", (), {"name": "INVALID_ARGUMENT"})()
    lookalike = type("GRPCError", (Exception,), {"status": status})
    assert not is_infeasible_error(lookalike("not grpclib's"))
    wrapped = ProvisioningError("refused")
    wrapped.__context__ = GRPCError(Status.INVALID_ARGUMENT, "bad size")
    assert is_infeasible_error(wrapped)


def test_is_deleting_means_a_deletion_timestamp_is_present() -> None:
    assert is_deleting({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert is_deleting({"metadata": {"deletionTimestamp": ""}})  # present, as Go's != nil
    assert not is_deleting({"metadata": {}})
    assert not is_deleting({})


def test_spec_and_status_of_tolerate_missing_or_odd_values() -> None:
    assert spec_of({"spec": {"a": 1}}) == {"a": 1}
    assert spec_of({"spec": None}) == {}
    assert spec_of({}) == {}
    assert status_of({"status": ["not", "a", "map"]}) == {}
    assert status_of({"status": {"phase": "Bound"}}) == {"phase": "Bound"}
