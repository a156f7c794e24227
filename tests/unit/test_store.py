"""Store / Indexer: keyed storage of wire dicts, built-in and user indexes, tombstones."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyprovlib.kube._objects import Obj
from pyprovlib.kube._store import (
    NAMESPACE_INDEX,
    UID_INDEX,
    DeletedFinalStateUnknown,
    Indexer,
    Store,
    deletion_handling_key,
)


def pvc(ns: str, name: str, uid: str = "", rv: str = "1", sc: str = "fast") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": uid or f"uid-{ns}-{name}",
            "resourceVersion": rv,
        },
        "spec": {"storageClassName": sc},
    }


def by_class(obj: Obj) -> list[str]:
    sc = obj.get("spec", {}).get("storageClassName")
    return [sc] if sc else []


def test_store_crud_keeps_the_very_same_dicts() -> None:
    s = Store()
    a = pvc("ns1", "a")
    s.add(a)
    assert s.get_by_key("ns1/a") is a  # no copy on read
    assert s.get({"metadata": {"namespace": "ns1", "name": "a"}}) is a
    a2 = pvc("ns1", "a", rv="2")
    s.update(a2)
    assert s.get_by_key("ns1/a") is a2
    assert s.list_keys() == ["ns1/a"]
    assert len(s) == 1
    assert "ns1/a" in s
    s.delete(a2)
    assert s.get_by_key("ns1/a") is None
    assert s.list() == []
    s.delete(a2)  # absent is fine


def test_cluster_scoped_key_is_the_name() -> None:
    s = Store()
    pv = {"metadata": {"name": "pv-1"}}
    s.add(pv)
    assert s.list_keys() == ["pv-1"]


def test_replace_makes_the_store_hold_exactly_the_items() -> None:
    s = Indexer()
    s.add(pvc("a", "x"))
    s.add(pvc("a", "y"))
    s.replace([pvc("b", "z"), pvc("a", "y", rv="9")])
    assert sorted(s.list_keys()) == ["a/y", "b/z"]
    assert s.index_keys(NAMESPACE_INDEX, "a") == ["a/y"]
    assert s.index_keys(UID_INDEX, "uid-a-x") == []


def test_builtin_namespace_and_uid_indexes() -> None:
    s = Indexer()
    s.add(pvc("ns1", "a"))
    s.add(pvc("ns1", "b"))
    s.add(pvc("ns2", "c"))
    assert sorted(s.index_keys(NAMESPACE_INDEX, "ns1")) == ["ns1/a", "ns1/b"]
    assert [o["metadata"]["name"] for o in s.by_index(NAMESPACE_INDEX, "ns2")] == ["c"]
    assert s.index_keys(UID_INDEX, "uid-ns1-b") == ["ns1/b"]
    assert sorted(s.list_index_func_values(NAMESPACE_INDEX)) == ["ns1", "ns2"]
    s.delete_key("ns1/a")
    assert s.index_keys(NAMESPACE_INDEX, "ns1") == ["ns1/b"]
    s.delete_key("ns1/b")
    assert s.index_keys(NAMESPACE_INDEX, "ns1") == []
    assert "ns1" not in s.list_index_func_values(NAMESPACE_INDEX)


def test_update_moves_an_object_between_index_values() -> None:
    s = Indexer(indexers={"class": by_class})
    s.add(pvc("ns", "a", sc="fast"))
    s.add(pvc("ns", "b", sc="fast"))
    s.update(pvc("ns", "a", sc="slow", rv="2"))
    assert s.index_keys("class", "fast") == ["ns/b"]
    assert s.index_keys("class", "slow") == ["ns/a"]
    s.update(pvc("ns", "b", sc="", rv="3"))  # no longer indexed at all
    assert s.index_keys("class", "fast") == []


def test_add_indexers_after_data_indexes_existing_items() -> None:
    s = Indexer()
    s.add(pvc("ns", "a", sc="fast"))
    s.add(pvc("ns", "b", sc="slow"))
    s.add_indexers({"class": by_class})
    assert s.index_keys("class", "fast") == ["ns/a"]
    assert [o["metadata"]["name"] for o in s.index("class", pvc("x", "y", sc="slow"))] == ["b"]
    with pytest.raises(ValueError, match="already defined"):
        s.add_indexers({"class": by_class})
    with pytest.raises(KeyError):
        s.by_index("nope", "x")


def test_tombstone_is_frozen_and_keyed() -> None:
    t = DeletedFinalStateUnknown("ns/a", pvc("ns", "a"))
    assert deletion_handling_key(t) == "ns/a"
    assert deletion_handling_key(pvc("ns", "b")) == "ns/b"
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.key = "x"  # type: ignore[misc]
    s = Indexer()
    s.add(pvc("ns", "a"))
    s.delete(t)
    assert len(s) == 0


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "delete"]),
        st.sampled_from(["n1", "n2", "n3"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from(["fast", "slow", ""]),
        st.sampled_from(["u1", "u2", "u3"]),
    ),
    max_size=60,
)


@given(ops)
def test_indexes_always_agree_with_a_recomputation(
    operations: list[tuple[str, str, str, str, str]],
) -> None:
    s = Indexer(indexers={"class": by_class})
    for op, ns, name, sc, uid in operations:
        obj = pvc(ns, name, uid=uid, sc=sc)
        if op == "add":
            s.add(obj)
        else:
            s.delete(obj)
    expected: dict[str, dict[str, set[str]]] = {}
    for key, obj in s.items():
        for index_name, fn in s.indexers.items():
            for value in fn(obj):
                expected.setdefault(index_name, {}).setdefault(value, set()).add(key)
    for index_name in s.indexers:
        got = {v: set(s.index_keys(index_name, v)) for v in s.list_index_func_values(index_name)}
        assert got == expected.get(index_name, {})
