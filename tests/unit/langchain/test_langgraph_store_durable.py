"""The LangGraph store that survives restarts (``HierMemStore.from_conn_string``) on SQLite: round trips
across a reopen, atomic failed puts, repair after a crash between a memory's add and the item commit, a
differential test against LangGraph's own ``InMemoryStore``, and typed errors for bad input (PostgreSQL
URLs included, with no server). On a PostgreSQL server: tests/integration/test_langgraph_store_postgres.py.
"""

from __future__ import annotations

import sqlite3
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.base import BaseStore, InvalidNamespaceError, PutOp
from langgraph.store.memory import InMemoryStore

from langchain_hiermem import HierMemStore
from shared_core import SegTreeMem
from shared_core.types import (
    InvalidInputError,
    Message,
    ModelError,
    PersistenceError,
    VersionMismatchError,
)
from tests.support.langgraph_store import (
    DIM,
    EMBEDDINGS,
    FACTS,
    KEYS,
    MEMORY_KWARGS,
    NAMESPACES,
    NS,
    TEXTS,
    FailOn,
    _items,
    _prune,
    index,
    leaves,
    open_store,
    round_trip,
    snapshot,
)
from tests.support.memory import HashEmbedder


# =========================================================================== round trips
def test_sqlite_round_trip_across_reopen(tmp_path):
    path = tmp_path / "agent.sqlite"
    round_trip(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.sqlite", "agent.sqlite.memories"]
    with open_store(str(path)) as s:  # a str path as well as a Path
        s.setup()
        s.setup()  # idempotent
        assert s.list_namespaces() == [("memories", "ann"), ("memories", "bob"), ("other",)]


def test_the_in_ram_store_takes_the_same_index_config():
    s = HierMemStore(index=index(fields=["note"]), memory_kwargs=MEMORY_KWARGS)
    s.put(NS, "a", {"note": FACTS[0], "text": "not this"})
    assert leaves(s, NS) == [("a", FACTS[0])]
    fn = HierMemStore(index={"dims": DIM, "embed": EMBEDDINGS.embed_documents}, memory_kwargs=MEMORY_KWARGS)
    fn.put(NS, "a", {"text": FACTS[0]})
    fn.put(NS, "b", {"text": FACTS[3]})
    assert [i.key for i in fn.search(NS, query=FACTS[3], limit=1)] == ["b"]
    with pytest.raises(InvalidInputError, match="not both"):
        HierMemStore(index=index(), embedder=EMBEDDINGS)
    with pytest.raises(InvalidInputError, match="dims"):
        HierMemStore(index={"dims": 0, "embed": EMBEDDINGS})
    with pytest.raises(InvalidInputError, match="Unknown index keys"):
        HierMemStore(index={"embed": EMBEDDINGS, "fileds": ["text"]})
    with pytest.raises(InvalidInputError, match="embed"):
        HierMemStore(index={"embed": 42})
    with pytest.raises(InvalidInputError):
        HierMemStore(index={"embed": "no-such-provider:model"})
    with pytest.raises(InvalidInputError):
        HierMemStore(memory_factory=lambda: SegTreeMem(HashEmbedder()), index=index())


# =========================================================================== failures and crashes
def test_a_failed_put_leaves_items_and_memories_unchanged_also_after_reopen(tmp_path):
    path = tmp_path / "s.sqlite"
    with open_store(path, FailOn("poison")) as s:
        s.put(NS, "a", {"text": FACTS[0]})
        before = (snapshot(s, scores=False), leaves(s, NS))
        with pytest.raises(ModelError):  # the memory's add fails
            s.batch([PutOp(NS, "a", {"text": "poison"}), PutOp(("new",), "b", {"text": FACTS[1]})])
        with pytest.raises(ModelError):  # the first namespace's add is undone, the new memory dropped
            s.batch([PutOp(("new",), "b", {"text": FACTS[1]}), PutOp(NS, "a", {"text": "poison"})])
        assert (snapshot(s, scores=False), leaves(s, NS)) == before and s.get_memory(("new",)) is None

        def down(*args: Any) -> int:
            raise PersistenceError("disk full")

        real = s._db.write
        s._db.write = down  # the item transaction fails after the memories' adds
        with pytest.raises(PersistenceError, match="disk full"):
            s.batch([PutOp(("new",), "b", {"text": FACTS[1]}), PutOp(NS, "a", {"text": FACTS[2]})])
        s._db.write = real
        assert (snapshot(s, scores=False), leaves(s, NS)) == before and s.get_memory(("new",)) is None
        stored = [p.name for p in (tmp_path / "s.sqlite.memories").iterdir()]
        assert not any(name.startswith("ns-langgraph-new") for name in stored)
    with open_store(path) as s:
        assert (snapshot(s, scores=False), leaves(s, NS)) == before and s.get_memory(("new",)) is None


def test_a_crash_between_a_memory_add_and_the_item_commit_is_repaired_on_reopen(tmp_path):
    path = tmp_path / "s.sqlite"
    with open_store(path) as s:
        s.put(NS, "a", {"text": FACTS[0]})
        s.put(NS, "b", {"text": FACTS[1]})
        # a put whose add landed but whose item transaction never did (the process died in between)
        s.get_memory(NS).add(Message("My dog is called Rex.", id="a"), allow_duplicate_ids=True)
        # an update whose old text was never deleted (killed after the item commit)
        s._forget = lambda space, key, lids, warn=True: list(lids)  # type: ignore[method-assign]
        s.put(NS, "b", {"text": FACTS[2]})
        assert ("b", FACTS[1]) in leaves(s, NS) and ("a", "My dog is called Rex.") in leaves(s, NS)
    with open_store(path) as s:
        assert leaves(s, NS) == [("a", FACTS[0]), ("b", FACTS[2])]
        assert s.get(NS, "a").value == {"text": FACTS[0]}
        assert [i.key for i in s.search(NS, query="dog Rex", limit=2)][0] == "a"
    with open_store(path) as s:  # the repair itself was durable
        assert leaves(s, NS) == [("a", FACTS[0]), ("b", FACTS[2])]


def test_a_store_is_owned_by_one_process_at_a_time(tmp_path):
    path = tmp_path / "s.sqlite"
    with open_store(path) as s:
        s.put(NS, "a", {"text": FACTS[0]})
        with pytest.raises(PersistenceError, match="in use by another process.*PostgreSQL"), open_store(path):
            pass
        assert s.get(NS, "a").value == {"text": FACTS[0]}
    with open_store(path) as s:  # released on close
        assert s.get(NS, "a").value == {"text": FACTS[0]}


# =========================================================================== bad input
@pytest.mark.parametrize(
    "conn, match",
    [
        ("postgresql://u@host:notaport/db", "port"),
        ("mysql://u@host/db", "scheme"),
        ("sqlite:///agent.sqlite", "scheme"),
        (":memory:", "HierMemStore()"),
        ("   ", "empty"),
        (42, "path of an SQLite file"),
    ],
)
def test_malformed_connection_strings_are_refused(conn, match):
    if isinstance(conn, str) and conn.startswith("postgresql"):
        pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")
    with pytest.raises(InvalidInputError, match=match), open_store(conn):
        pass


def test_an_unreachable_server_is_a_persistence_error(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")
    url = f"postgresql://nobody@/nodb?host={tmp_path}&port=5999&connect_timeout=2"
    with pytest.raises(PersistenceError, match="Cannot connect"), open_store(url):
        pass


def test_bad_arguments_and_values_are_refused_and_write_nothing(tmp_path):
    path = tmp_path / "s.sqlite"
    with pytest.raises(InvalidInputError, match="synchronous"), open_store(path, synchronous="OFF"):
        pass
    url = "postgresql://u@/db?host=/nowhere"
    with pytest.raises(InvalidInputError, match="synchronous"), open_store(url, synchronous="NORMAL"):
        pass
    assert not path.exists()
    with open_store(path) as s:
        s.put(NS, "a", {"text": FACTS[0]})
        before = snapshot(s)
        for value in ({"x": float("nan")}, {"x": object()}, {"x": {1, 2}}):
            with pytest.raises(InvalidInputError, match="JSON"):
                s.batch([PutOp(NS, "b", {"text": FACTS[1]}), PutOp(NS, "c", value)])
        with pytest.raises(InvalidInputError, match="NUL"):
            s.put(NS, "bad\x00key", {"text": FACTS[1]})
        with pytest.raises(InvalidNamespaceError, match="labels"):
            s.put(tuple("abcdefgh"), "k", {"text": FACTS[1]})  # the memories take 7 labels after the prefix
        with pytest.raises(InvalidNamespaceError):
            s.put((" ",), "k", {"text": FACTS[1]})
        with pytest.raises(InvalidNamespaceError):
            s.as_retriever(tuple("abcdefgh"))
        assert snapshot(s) == before
        # values come back in their JSON form, before and after a reopen
        s.put(NS, "t", {"text": FACTS[2], "pair": (1, 2), "n": {1: "one"}})
        assert s.get(NS, "t").value == {"text": FACTS[2], "pair": [1, 2], "n": {"1": "one"}}
    with open_store(path) as s:
        assert s.get(NS, "t").value == {"text": FACTS[2], "pair": [1, 2], "n": {"1": "one"}}


def test_files_that_are_not_a_store_are_refused_untouched(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("just some notes, not a database\n" * 10)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE store (prefix text, key text, value text)")
    c.close()
    memory = tmp_path / "memory.sqlite"
    SegTreeMem.open(memory, embedder=HashEmbedder()).close_store()
    for path in (text, other, memory):
        data = path.read_bytes()
        with pytest.raises(PersistenceError, match="not a hiermem LangGraph store"), open_store(path):
            pass
        assert path.read_bytes() == data
        assert not path.with_name(path.name + ".memories").exists()
    with pytest.raises(PersistenceError, match="directory"), open_store(tmp_path):
        pass
    clash = tmp_path / "x.sqlite"
    (tmp_path / "x.sqlite.memories").write_text("a file where the memories go")
    with pytest.raises(PersistenceError, match="memories"), open_store(clash):
        pass
    assert not clash.exists()


def test_another_format_is_a_version_mismatch(tmp_path):
    path = tmp_path / "s.sqlite"
    with open_store(path) as s:
        s.put(NS, "a", {"text": FACTS[0]})
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value = '99' WHERE key = 'format'")
    c.close()
    with pytest.raises(VersionMismatchError, match="format 99"), open_store(path):
        pass


# =========================================================================== differential test
FILTERS = [None, {"tag": "red"}, {"n": {"$gte": 2}}, {"n": 1, "tag": "blue"}, {"n": {"$ne": 0}}]

_values = st.fixed_dictionaries(
    {"n": st.integers(0, 3), "tag": st.sampled_from(["red", "blue"])},
    optional={"text": st.sampled_from(TEXTS)},
)
_put = st.tuples(
    st.just("put"),
    st.sampled_from(NAMESPACES),
    st.sampled_from(KEYS),
    _values,
    st.sampled_from([None, None, False, ["tag"]]),
)
_ops = st.lists(
    st.one_of(
        _put,
        _put,
        st.tuples(st.just("delete"), st.sampled_from(NAMESPACES), st.sampled_from(KEYS)),
        st.tuples(st.just("get"), st.sampled_from(NAMESPACES), st.sampled_from(KEYS)),
        st.tuples(
            st.just("search"),
            st.sampled_from([(), ("a",), ("b",), ("b", "x"), ("b", "y")]),
            st.one_of(st.none(), st.sampled_from(["dog", "music cooking", "beach sea", "basil"])),
            st.sampled_from(FILTERS),
            st.integers(1, 10),
            st.integers(0, 3),
        ),
        st.tuples(
            st.just("list"),
            st.sampled_from([None, ("b",), ("b", "*")]),
            st.sampled_from([None, ("x",), ("a",)]),
            st.sampled_from([None, 1, 2]),
            st.integers(1, 5),
            st.integers(0, 2),
        ),
        st.tuples(st.just("batch"), st.lists(_put, min_size=1, max_size=4)),
        st.tuples(st.just("reopen")),
    ),
    min_size=1,
    max_size=14,
)


def _per_namespace(items: list[Any]) -> dict[tuple[str, ...], list[str]]:
    out: dict[tuple[str, ...], list[str]] = {}
    for i in items:
        out.setdefault(tuple(i.namespace), []).append(i.key)
    return out


def _compare_search(dur: BaseStore, ref: InMemoryStore, op: tuple[Any, ...]) -> None:
    _, prefix, query, flt, limit, offset = op
    if query is not None:
        offset = 0  # InMemoryStore pads a query search with unscored items ignoring the offset
    got = dur.search(prefix, query=query, filter=flt, limit=limit, offset=offset)
    want = ref.search(prefix, query=query, filter=flt, limit=limit, offset=offset)
    matching = ref.search(prefix, filter=flt, limit=1000)
    assert len(got) == len(want), (got, want)
    truth = {(tuple(i.namespace), i.key): i.value for i in matching}
    assert all(truth[(tuple(i.namespace), i.key)] == i.value for i in got)
    if query is not None:
        assert all(i.score is not None for i in got[: len(got) - sum(i.score is None for i in got)])
        if limit >= len(matching):
            assert {(ns, k) for ns, k, _ in _items(got)} == set(truth)
        return
    if prefix in NAMESPACES:  # one namespace: insertion order, exactly
        assert _items(got) == _items(want)
        return
    # several namespaces: the same items, each namespace in insertion order (InMemoryStore orders the
    # namespaces by when they were first touched, a get included)
    full = dur.search(prefix, filter=flt, limit=1000)
    assert sorted(_items(full), key=repr) == sorted(_items(matching), key=repr)
    assert _per_namespace(full) == _per_namespace(matching)
    assert _items(got) == _items(full)[offset : offset + limit]


def _indexed(value: dict[str, Any], idx: Any) -> list[str]:
    """The texts a put indexes with the store's fields ``["text"]``."""
    if idx is False:
        return []
    field = "tag" if idx == ["tag"] else "text"
    return [value[field]] if field in value else []


def _check(dur: HierMemStore, ref: InMemoryStore, model: dict[tuple[Any, str], list[str]]) -> None:
    """Same items in the same order and namespaces as the reference; each memory holds exactly the
    texts its items index."""
    _prune(ref)
    for ns in NAMESPACES:
        assert _items(dur.search(ns, limit=100)) == _items(ref.search(ns, limit=100))
        want = sorted((key, t) for (n, key), texts in model.items() if n == ns for t in texts)
        assert leaves(dur, ns) == want
    assert dur.list_namespaces() == ref.list_namespaces()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_differential_against_langgraphs_in_memory_store(ops):
    """Random puts / gets / deletes / searches / listings (and reopens of the durable store) give the
    same results as LangGraph's InMemoryStore, up to scores and the order of equally scored items."""
    ref = InMemoryStore(index=index(fields=["text"]))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        path = Path(tmp) / "store.sqlite"

        def reopen() -> Any:
            return stack.enter_context(open_store(path, fields=["text"], synchronous="NORMAL"))

        dur = reopen()
        model: dict[tuple[Any, str], list[str]] = {}
        for op in ops:
            kind = op[0]
            if kind == "put":
                _, ns, key, value, idx = op
                dur.put(ns, key, value, index=idx)
                ref.put(ns, key, value, index=idx)
                model[(ns, key)] = _indexed(value, idx)
            elif kind == "batch":
                puts = [PutOp(ns, key, value, index=idx) for _, ns, key, value, idx in op[1]]
                assert dur.batch(puts) == [None] * len(puts)
                for put in puts:  # InMemoryStore's batch fails on two puts of one text: one by one
                    ref.batch([put])
                model.update({(ns, key): _indexed(value, idx) for _, ns, key, value, idx in op[1]})
            elif kind == "delete":
                dur.delete(op[1], op[2])
                ref.delete(op[1], op[2])
                model.pop((op[1], op[2]), None)
            elif kind == "get":
                got, want = dur.get(op[1], op[2]), ref.get(op[1], op[2])
                assert (got is None) == (want is None)
                if got is not None:
                    assert _items([got]) == _items([want]) and got.created_at <= got.updated_at
            elif kind == "search":
                _compare_search(dur, ref, op)
            elif kind == "list":
                _, prefix, suffix, depth, limit, offset = op
                _prune(ref)
                kw: dict[str, Any] = {"limit": limit, "offset": offset, "max_depth": depth}
                assert dur.list_namespaces(prefix=prefix, suffix=suffix, **kw) == ref.list_namespaces(
                    prefix=prefix, suffix=suffix, **kw
                )
            else:
                before = snapshot(dur, ("dog", "music"))
                stack.close()
                dur = reopen()
                assert snapshot(dur, ("dog", "music")) == before
        _check(dur, ref, model)
        stack.close()
        with open_store(path, fields=["text"], synchronous="NORMAL") as again:
            _check(again, ref, model)


def test_a_batch_orders_items_as_the_same_puts_one_by_one(tmp_path):
    ops = [
        PutOp(NS, "a", {"text": FACTS[0]}),
        PutOp(("other",), "z", {"text": FACTS[1]}),
        PutOp(NS, "b", {"text": FACTS[2]}),
        PutOp(NS, "a", {"text": FACTS[3]}),  # an update keeps the place of "a"
        PutOp(NS, "c", {"text": FACTS[4]}),
        PutOp(NS, "b", None),
        PutOp(NS, "b", {"text": FACTS[5]}),  # deleted and put again: last
    ]
    ram = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    for op in ops:
        ram.batch([op])
    want = _items(ram.search((), limit=100))
    assert [k for _, k, _ in want] == ["a", "c", "b", "z"]
    batched = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    batched.batch(ops)
    assert _items(batched.search((), limit=100)) == want
    with open_store(tmp_path / "s.sqlite") as s:
        s.batch(ops)
        assert _items(s.search((), limit=100)) == want
        assert leaves(s, NS) == sorted([("a", FACTS[3]), ("b", FACTS[5]), ("c", FACTS[4])])
    with open_store(tmp_path / "s.sqlite") as s:
        assert _items(s.search((), limit=100)) == want


def test_a_memory_of_another_configuration_is_refused_when_used(tmp_path):
    with open_store(tmp_path / "s.sqlite") as s:
        s.put(NS, "a", {"text": FACTS[0]})
    with HierMemStore.from_conn_string(tmp_path / "s.sqlite", index=index()) as s:  # default relevance
        assert s.get(NS, "a").value == {"text": FACTS[0]}
        with pytest.raises(PersistenceError, match="another configuration"):
            s.search(NS, query="dog")
    with open_store(tmp_path / "s.sqlite") as s:
        assert [i.key for i in s.search(NS, query="dog")] == ["a"]
