"""Conversion between the JSON dicts the caches hold and the kubernetes-asyncio models user code
receives, done only at the boundary where a provisioner is called or hands a PV back.

The models describe themselves (``openapi_types``: attribute → type name, ``attribute_map``:
attribute → JSON key); both directions walk those tables the way kubernetes-asyncio's
``ApiClient`` does, with two differences measured to matter at a thousand claims a second:
timestamps are parsed with ``datetime.fromisoformat`` (dateutil only as a fallback), and every
model is built with one shared ``Configuration`` instead of a deep copy of the default one per
object. The result compares equal to what ``ApiClient.deserialize`` produces (tested).
"""

from __future__ import annotations

import datetime
from typing import Any, TypeVar, cast

import kubernetes_asyncio.client.models as k8s_models
from dateutil.parser import parse as _dateutil_parse  # type: ignore[import-untyped]
from kubernetes_asyncio.client import Configuration

from pyprovlib.kube.objects import Obj

__all__ = ["ConversionError", "from_model", "to_model"]

M = TypeVar("M")

_PRIMITIVES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}
_CONFIG: Configuration | None = None


class ConversionError(ValueError):
    """An object could not be converted to or from its kubernetes-asyncio model (the model's
    client-side validation refused it, or the value is not the model expected)."""


def _configuration() -> Configuration:
    # Models validate required fields against this (client_side_validation is on).
    global _CONFIG  # noqa: PLW0603 - one immutable Configuration shared by every model
    if _CONFIG is None:
        _CONFIG = Configuration()
    return _CONFIG


def _parse_datetime(value: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return value
    try:
        return datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        result: datetime.datetime = _dateutil_parse(value)
        return result


def _parse_date(value: Any) -> datetime.date:
    if isinstance(value, datetime.date):
        return value
    try:
        return datetime.date.fromisoformat(value)
    except (TypeError, ValueError):
        result: datetime.date = _dateutil_parse(value).date()
        return result


def _deserialize(data: Any, klass: Any) -> Any:
    if data is None:
        return None
    if isinstance(klass, str):
        if klass.startswith("list["):
            inner = klass[5:-1]
            return [_deserialize(item, inner) for item in data]
        if klass.startswith("dict("):
            inner = klass[5:-1].split(", ", 1)[1]
            return {key: _deserialize(value, inner) for key, value in data.items()}
        primitive = _PRIMITIVES.get(klass)
        if primitive is not None:
            try:
                return primitive(data)
            except TypeError:
                return data
        if klass == "object":
            return data
        if klass == "datetime":
            return _parse_datetime(data)
        if klass == "date":
            return _parse_date(data)
        klass = getattr(k8s_models, klass)
    return _deserialize_model(data, klass)


def _deserialize_model(data: Any, klass: Any) -> Any:
    discriminated = bool(
        hasattr(klass, "get_real_child_model") and klass.discriminator_value_class_map
    )
    types: dict[str, str] = klass.openapi_types
    if not types and not discriminated:
        return data
    kwargs: dict[str, Any] = {}
    if isinstance(data, dict):
        keys: dict[str, str] = klass.attribute_map
        for attr, attr_type in types.items():
            key = keys[attr]
            if key in data:
                kwargs[attr] = _deserialize(data[key], attr_type)
    instance = klass(local_vars_configuration=_configuration(), **kwargs)
    if discriminated:
        child = instance.get_real_child_model(data)
        if child:
            instance = _deserialize(data, child)
    return instance


def _serialize(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_serialize(item) for item in value]
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _serialize(item) for key, item in value.items()}
    types = getattr(value, "openapi_types", None)
    keys = getattr(value, "attribute_map", None)
    if not isinstance(types, dict) or not isinstance(keys, dict):
        raise TypeError(f"{type(value).__name__} is not a kubernetes-asyncio model")
    out: dict[str, Any] = {}
    for attr in types:
        item = getattr(value, attr)
        if item is not None:
            out[keys[attr]] = _serialize(item)
    return out


def to_model(obj: Obj, model: type[M]) -> M:
    """``obj`` as an instance of the kubernetes-asyncio ``model`` class (``V1PersistentVolume``).

    Raises :class:`ConversionError` naming the model when it refuses the data.
    """
    try:
        result = _deserialize(obj, model)
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
        result = _serialize(model)
    except (TypeError, AttributeError, KeyError) as err:
        raise ConversionError(f"cannot serialize {type(model).__name__}: {err}") from err
    if not isinstance(result, dict):
        raise ConversionError(f"expected an object, got {type(model).__name__}")
    return cast(Obj, result)
