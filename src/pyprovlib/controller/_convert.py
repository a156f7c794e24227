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
import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import kubernetes_asyncio.client.models as k8s_models
from dateutil.parser import parse as _dateutil_parse  # type: ignore[import-untyped]
from kubernetes_asyncio.client import Configuration

from pyprovlib.kube.objects import Obj

__all__ = ["ConversionError", "from_model", "to_model"]

M = TypeVar("M")

_Converter = Callable[[Any], Any]
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


def _primitive(kind: type) -> _Converter:
    def convert(data: Any) -> Any:
        if data is None:
            return None
        try:
            return kind(data)
        except TypeError:
            return data

    return convert


def _identity(data: Any) -> Any:
    return data


def _optional(parse: Callable[[Any], Any]) -> _Converter:
    def convert(data: Any) -> Any:
        return None if data is None else parse(data)

    return convert


@functools.cache
def _converter(type_name: str) -> _Converter:
    """The function turning JSON into a value of an ``openapi_types`` type name.

    Built once per type name: walking the type strings on every value was most of the cost.
    """
    if type_name.startswith("list["):
        item = _converter(type_name[5:-1])
        return _optional(lambda data: [item(x) for x in data])
    if type_name.startswith("dict("):
        value = _converter(type_name[5:-1].split(", ", 1)[1])
        return _optional(lambda data: {k: value(v) for k, v in data.items()})
    primitive = _PRIMITIVES.get(type_name)
    if primitive is not None:
        return _primitive(primitive)
    if type_name == "object":
        return _identity
    if type_name == "datetime":
        return _optional(_parse_datetime)
    if type_name == "date":
        return _optional(_parse_date)
    klass = getattr(k8s_models, type_name)
    return _optional(lambda data: _deserialize_model(data, klass))


@functools.cache
def _plan(klass: Any) -> tuple[dict[str, tuple[str, _Converter]], bool]:
    """JSON key → (attribute, converter) for a model class, and whether it is discriminated."""
    discriminated = bool(
        hasattr(klass, "get_real_child_model") and klass.discriminator_value_class_map
    )
    types: dict[str, str] = klass.openapi_types
    keys: dict[str, str] = klass.attribute_map
    return {keys[attr]: (attr, _converter(t)) for attr, t in types.items()}, discriminated


def _deserialize(data: Any, klass: Any) -> Any:
    if isinstance(klass, str):
        return _converter(klass)(data)
    return None if data is None else _deserialize_model(data, klass)


def _deserialize_model(data: Any, klass: Any) -> Any:
    plan, discriminated = _plan(klass)
    if not plan and not discriminated:
        return data
    kwargs: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            entry = plan.get(key)
            if entry is not None:
                kwargs[entry[0]] = entry[1](value)
    instance = klass(local_vars_configuration=_configuration(), **kwargs)
    if discriminated:
        child = instance.get_real_child_model(data)
        if child:
            instance = _deserialize(data, child)
    return instance


_SCALARS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _fields(klass: type) -> tuple[tuple[str, str], ...] | None:
    """(attribute, JSON key) pairs of a model class; None when it is not a model."""
    types = getattr(klass, "openapi_types", None)
    keys = getattr(klass, "attribute_map", None)
    if not isinstance(types, dict) or not isinstance(keys, dict):
        return None
    return tuple((attr, keys[attr]) for attr in types)


def _serialize(value: Any) -> Any:
    kind: Any = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {key: _serialize(item) for key, item in value.items()}
    if kind is list:
        return [_serialize(item) for item in value]
    fields = _fields(kind)
    if fields is not None:
        out: dict[str, Any] = {}
        for attr, key in fields:
            item = getattr(value, attr)
            if item is not None:
                out[key] = _serialize(item)
        return out
    # Subclasses of the JSON types, tuples and dates.
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_serialize(item) for item in value]
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _serialize(item) for key, item in value.items()}
    raise TypeError(f"{kind.__name__} is not a kubernetes-asyncio model")


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
