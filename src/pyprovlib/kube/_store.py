"""The informer cache: a keyed store of Kubernetes objects with secondary indexes.

client-go's ``cache.Store`` / ``cache.Indexer`` over the JSON dicts exactly as they came off the
wire. Nothing is converted and nothing is copied on read, so reads are free — and callers must
never mutate what the store returns: ``copy.deepcopy`` an object before changing it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from pyprovlib.kube._objects import Obj, meta_namespace_key

__all__ = [
    "NAMESPACE_INDEX",
    "UID_INDEX",
    "DeletedFinalStateUnknown",
    "IndexFunc",
    "Indexer",
    "KeyFunc",
    "Store",
    "deletion_handling_key",
    "namespace_index_func",
    "uid_index_func",
]

KeyFunc = Callable[[Obj], str]
"""Computes an object's store key (``namespace/name`` by default)."""

IndexFunc = Callable[[Obj], list[str]]
"""Computes the values under which an object is indexed (an empty list: not indexed)."""

NAMESPACE_INDEX = "namespace"
"""Name of the built-in index of objects by ``metadata.namespace``."""

UID_INDEX = "uid"
"""Name of the built-in index of objects by ``metadata.uid``."""


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """Handed to ``on_delete`` when an object vanished while the watch was down: a relist no
    longer contains it, so its final state is unknown. ``obj`` is the last state the cache had."""

    key: str
    obj: Obj


def deletion_handling_key(obj: Obj | DeletedFinalStateUnknown) -> str:
    """The store key of an object or of a tombstone (client-go's
    ``DeletionHandlingMetaNamespaceKeyFunc``)."""
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    return meta_namespace_key(obj)


def namespace_index_func(obj: Obj) -> list[str]:
    """Index by namespace (client-go's ``MetaNamespaceIndexFunc``); cluster-scoped objects are
    indexed under ''."""
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return [ns if isinstance(ns, str) else ""]


def uid_index_func(obj: Obj) -> list[str]:
    """Index by ``metadata.uid`` (objects without one are not indexed)."""
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return [uid] if isinstance(uid, str) and uid else []


class Store:
    """Objects by key. Not thread-safe (there are no threads); O(1) get/add/update/delete.

    The objects are held by reference: never mutate what :meth:`get_by_key`, :meth:`list` or
    :meth:`get` return.
    """

    def __init__(self, key_func: KeyFunc = meta_namespace_key) -> None:
        self.key_func = key_func
        self._items: dict[str, Obj] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def get_by_key(self, key: str) -> Obj | None:
        """The object stored under ``key``, or None."""
        return self._items.get(key)

    def get(self, obj: Obj) -> Obj | None:
        """The stored object with the same key as ``obj``, or None."""
        return self._items.get(self.key_func(obj))

    def list(self) -> list[Obj]:
        """Every stored object (a new list of the stored dicts)."""
        return list(self._items.values())

    def list_keys(self) -> builtins.list[str]:
        """Every key."""
        return list(self._items)

    def items(self) -> builtins.list[tuple[str, Obj]]:
        """Every (key, object) pair."""
        return list(self._items.items())

    def add(self, obj: Obj) -> None:
        """Insert or overwrite ``obj`` under its key."""
        self._put(self.key_func(obj), obj)

    def update(self, obj: Obj) -> None:
        """Same as :meth:`add` (client-go's Update is an upsert too)."""
        self._put(self.key_func(obj), obj)

    def delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        """Remove the object with ``obj``'s key (a tombstone's key works too); absent is fine."""
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else self.key_func(obj)
        self.delete_key(key)

    def delete_key(self, key: str) -> Obj | None:
        """Remove ``key``; return what was stored there, if anything."""
        old = self._items.pop(key, None)
        if old is not None:
            self._on_removed(key, old)
        return old

    def replace(self, objs: Iterable[Obj]) -> None:
        """Make the store hold exactly ``objs``."""
        items = {self.key_func(o): o for o in objs}
        self._items = items
        self._rebuild()

    def _put(self, key: str, obj: Obj) -> None:
        old = self._items.get(key)
        self._items[key] = obj
        self._on_stored(key, old, obj)

    # Hooks for the Indexer.
    def _on_stored(self, key: str, old: Obj | None, new: Obj) -> None:
        pass

    def _on_removed(self, key: str, old: Obj) -> None:
        pass

    def _rebuild(self) -> None:
        pass


# An index bucket: a single key (the common case for unique values such as uids, and 5x
# smaller than a one-element set) or a set of keys once a second object shares the value.
_Bucket = str | set[str]


class Indexer(Store):
    """A :class:`Store` with named secondary indexes (client-go's ``cache.Indexer``).

    The built-in indexes ``namespace`` and ``uid`` are always present; :meth:`add_indexers`
    adds more at any time (existing objects are indexed at once).
    """

    def __init__(
        self,
        key_func: KeyFunc = meta_namespace_key,
        indexers: Mapping[str, IndexFunc] | None = None,
    ) -> None:
        super().__init__(key_func)
        self._indexers: dict[str, IndexFunc] = {
            NAMESPACE_INDEX: namespace_index_func,
            UID_INDEX: uid_index_func,
        }
        self._indices: dict[str, dict[str, _Bucket]] = {
            NAMESPACE_INDEX: {},
            UID_INDEX: {},
        }
        if indexers:
            self.add_indexers(indexers)

    @property
    def indexers(self) -> Mapping[str, IndexFunc]:
        """The index functions by index name."""
        return dict(self._indexers)

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add index functions; existing objects are indexed right away.

        Raises ``ValueError`` if an index of that name already exists.
        """
        clash = [name for name in indexers if name in self._indexers]
        if clash:
            raise ValueError(f"indexer(s) already defined: {', '.join(sorted(clash))}")
        for name, fn in indexers.items():
            self._indexers[name] = fn
            index: dict[str, _Bucket] = {}
            self._indices[name] = index
            for key, obj in self._items.items():
                for value in fn(obj):
                    _bucket_add(index, value, key)

    def index_keys(self, index_name: str, value: str) -> list[str]:
        """Keys of the objects whose ``index_name`` index function yields ``value``."""
        bucket = self._index(index_name).get(value)
        if bucket is None:
            return []
        if isinstance(bucket, str):
            return [bucket]
        return list(bucket)

    def by_index(self, index_name: str, value: str) -> list[Obj]:
        """The objects whose ``index_name`` index function yields ``value``."""
        items = self._items
        return [items[k] for k in self.index_keys(index_name, value)]

    def index(self, index_name: str, obj: Obj) -> list[Obj]:
        """The objects sharing any of ``obj``'s values in index ``index_name``."""
        fn = self._indexers.get(index_name)
        if fn is None:
            raise KeyError(f"index {index_name!r} does not exist")
        keys: set[str] = set()
        for value in fn(obj):
            keys.update(self.index_keys(index_name, value))
        return [self._items[k] for k in keys]

    def list_index_func_values(self, index_name: str) -> list[str]:
        """Every value present in index ``index_name``."""
        return list(self._index(index_name))

    def _index(self, index_name: str) -> dict[str, _Bucket]:
        try:
            return self._indices[index_name]
        except KeyError:
            raise KeyError(f"index {index_name!r} does not exist") from None

    def _on_stored(self, key: str, old: Obj | None, new: Obj) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            new_values = fn(new)
            if old is not None:
                old_values = fn(old)
                if old_values == new_values:
                    continue
                for value in old_values:
                    _bucket_remove(index, value, key)
            for value in new_values:
                _bucket_add(index, value, key)

    def _on_removed(self, key: str, old: Obj) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(old):
                _bucket_remove(index, value, key)

    def _rebuild(self) -> None:
        for name, fn in self._indexers.items():
            index: dict[str, _Bucket] = {}
            self._indices[name] = index
            for key, obj in self._items.items():
                for value in fn(obj):
                    _bucket_add(index, value, key)


def _bucket_add(index: dict[str, _Bucket], value: str, key: str) -> None:
    bucket = index.get(value)
    if bucket is None:
        index[value] = key
    elif isinstance(bucket, str):
        if bucket != key:
            index[value] = {bucket, key}
    else:
        bucket.add(key)


def _bucket_remove(index: dict[str, _Bucket], value: str, key: str) -> None:
    bucket = index.get(value)
    if bucket is None:
        return
    if isinstance(bucket, str):
        if bucket == key:
            del index[value]
        return
    bucket.discard(key)
    if len(bucket) == 1:
        index[value] = next(iter(bucket))
    elif not bucket:
        del index[value]
