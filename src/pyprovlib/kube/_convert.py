"""Conversion between the JSON dicts the caches hold and the kubernetes-asyncio models user code
receives, done only at the boundary where user code is called or hands an object back.

Both directions are kubernetes-asyncio's own: ``ApiClient.deserialize`` (given what it reads
from a response, an object with the JSON text as ``.data`` — how kubernetes-asyncio's ``Watch``
calls it too) and ``ApiClient.sanitize_for_serialization``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, Final, TypeVar, cast

from kubernetes_asyncio.client import ApiClient, Configuration

from pyprovlib._errors import PyprovlibError
from pyprovlib.kube._objects import Obj

__all__ = ["ConversionError", "copy_json", "from_model", "to_model"]

M = TypeVar("M")

_serialiser: ApiClient | None = None


class ConversionError(PyprovlibError, ValueError):
    """An object could not be converted to or from its kubernetes-asyncio model (the model's
    client-side validation refused it, or the value is not the model expected)."""


def _new_serialiser() -> ApiClient:
    api = ApiClient(configuration=Configuration())
    api.rest_client.pool_manager.detach()
    return api


async def _new_serialiser_in_loop() -> ApiClient:
    return _new_serialiser()


def _api_client() -> ApiClient:
    """The process's ``ApiClient`` for conversions, built on first use. It never sends a
    request: its aiohttp session is detached at once, so there is nothing to close or to leak.
    An ``ApiClient`` is made in an event loop (aiohttp's connector asks for the running one);
    called from synchronous code, a short-lived loop serves, so conversions work there too."""
    global _serialiser  # noqa: PLW0603 - one serialiser per process, like a codec
    if _serialiser is None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            _serialiser = asyncio.run(_new_serialiser_in_loop())
        else:
            _serialiser = _new_serialiser()
    return _serialiser


def to_model(obj: Mapping[str, Any], model: type[M]) -> M:
    """``obj`` as an instance of the kubernetes-asyncio ``model`` class (``V1PersistentVolume``).

    Raises :class:`ConversionError` naming the model when it refuses the data.
    """
    try:
        response: Any = SimpleNamespace(
            data=json.dumps(obj if isinstance(obj, dict) else dict(obj))
        )
        result: Any = _api_client().deserialize(response, model.__name__)
    except Exception as err:
        # Models raise ValueError from their validation, and anything else on data of the
        # wrong shape (a list where an object belongs): either way it is unusable.
        raise ConversionError(f"cannot read the object as a {model.__name__}: {err}") from err
    if not isinstance(result, model):
        raise ConversionError(f"expected a {model.__name__}, got {type(result).__name__}")
    return result


def from_model(model: object) -> Obj:
    """The JSON dict of a kubernetes-asyncio model (or of a dict: a fresh copy), as
    ``ApiClient.sanitize_for_serialization`` makes it: None attributes are left out.

    Raises :class:`ConversionError` when ``model`` does not serialize to a JSON object.
    """
    try:
        result = _api_client().sanitize_for_serialization(model)
    except (TypeError, AttributeError, KeyError) as err:
        raise ConversionError(
            f"cannot serialize {type(model).__name__}: a value in it is neither JSON nor a "
            f"kubernetes-asyncio model ({err})"
        ) from err
    if not isinstance(result, dict):
        raise ConversionError(f"expected an object, got {type(model).__name__}")
    return cast(Obj, result)


_JSON_LEAVES: Final = (str, int, float, bool, type(None))


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON document: every dict and list is new; every other value (str,
    numbers, bools, None, anything else) is shared, as ``copy.deepcopy`` shares immutable
    leaves. About a third of deepcopy's cost on a PV: no memo, no dispatch table. Other
    mappings come back as dicts, tuples as lists (JSON has nothing else)."""
    kind = type(value)
    if kind is dict:
        return {key: copy_json(item) for key, item in value.items()}
    if kind is list:
        return [copy_json(item) for item in value]
    if kind in _JSON_LEAVES:
        return value
    if isinstance(value, Mapping):
        return {key: copy_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [copy_json(item) for item in value]
    return value
