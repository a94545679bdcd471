"""MemoryStore.get_all: the messages of one namespace in insertion order, never another's; a read never
creates a namespace; bad arguments are typed errors naming the value, also for a namespace that does not
exist."""

from __future__ import annotations

import pytest

from shared_core import DuplicateIdError, Message, SegTreeMem
from shared_core.namespaces import MemoryStore
from shared_core.types import InvalidInputError
from tests.support.memory import HashEmbedder, message_text


@pytest.mark.parametrize("durable", [False, True])
def test_get_all_lists_one_namespace_in_order(durable, tmp_path):
    store = MemoryStore(lambda ns: SegTreeMem(HashEmbedder()), root_dir=tmp_path if durable else None)
    a = [Message(message_text(i), id=f"a{i}", metadata={"i": i}) for i in range(4)]
    b = [Message(message_text(10 + i), id=f"b{i}") for i in range(2)]
    store.add(("ann",), a[:2])
    store.add(("bob",), b)
    store.add(("ann",), a[2:])
    store.delete(("ann",), "a1")
    with pytest.raises(DuplicateIdError, match="'a0'"):
        store.add(("ann",), Message("again", id="a0"))
    new = Message("The dog is called Rex now.", id="a2")
    store.add(("ann",), new, upsert=True)
    assert store.get_all(("ann",)) == [a[0], a[3], new]
    assert store.get_all("bob") == b
    assert store.get_all(("ann",), where={"i": {"$gte": 0}}, limit=1, offset=1) == [a[3]]
    assert store.get_all(("carol",)) == [] and ("carol",) not in store
    store.close()


@pytest.mark.parametrize(
    ("kwargs", "named"), [({"limit": -2}, "-2"), ({"offset": 1.5}, "1.5"), ({"where": []}, r"\[\]")]
)
def test_get_all_refuses_bad_arguments_also_for_a_missing_namespace(kwargs, named):
    store = MemoryStore(lambda ns: SegTreeMem(HashEmbedder()))
    store.add("ann", message_text(0))
    for ns in ("ann", "nobody"):
        with pytest.raises(InvalidInputError, match=named):
            store.get_all(ns, **kwargs)
