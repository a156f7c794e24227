"""What the API server answers a call the test expects it to refuse. Here at the root of
``tests/``, which pytest puts on ``sys.path``, because the in-memory server's tests and the
conformance tests against a real one both check refusals."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException


async def refused(call: Awaitable[Any]) -> int:
    """The HTTP status the API server refused ``call`` with; fails when it succeeded."""
    try:
        await call
    except ApiException as err:
        return int(err.status)
    raise AssertionError("the API server accepted the call")


def error_body(err: ApiException) -> Any:
    """The JSON body (the ``Status``) of the API server's refusal ``err``; fails when it has
    none."""
    assert err.body is not None, f"the refusal has no body: {err}"
    return json.loads(err.body)
