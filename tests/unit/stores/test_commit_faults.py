"""A failed add or delete leaves the memory exactly as it was, whatever fails and wherever it fails.

A fault is injected at one step of the transaction at a time — embedding, summarising, the FAISS index
update (before it, after it, and half-way between FAISS and the index's bookkeeping), the durable write
(before it, a real SQLite failure inside it) — as an ordinary exception, ``KeyboardInterrupt`` or
``MemoryError``, for every memory, with and without a durable store. After the failure the tree
(``to_dict()``), the index (ids, row order and vectors) and the store after reopening equal the memory
before the call, retrieval answers as before, and the same call retried builds the memory a run without
a fault builds. A fault after the durable ``COMMIT`` landed keeps the change in memory and on disk.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core import HierarchicalMemory
from shared_core.durable import DurableStore
from shared_core.search.index import NodeIndex
from shared_core.types import PersistenceError
from tests.support.faults import Fault, answers, index_snapshot
from tests.support.memory import (
    KINDS,
    HashEmbedder,
    check_tree,
    make_memory,
    memory_class,
    message_text,
    stripped,
)

N_BEFORE = 9
EXCEPTIONS = {
    "error": lambda: RuntimeError("injected fault"),
    "interrupt": lambda: KeyboardInterrupt(),
    "memory": lambda: MemoryError(),
}


def _patch(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, fault: Fault) -> None:
    monkeypatch.setattr(owner, name, fault.wrap(getattr(owner, name)))


def inject(point: str, mem: HierarchicalMemory, monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> Fault:
    """Arm a fault at ``point`` of the next transaction of ``mem``."""
    if point == "embed":
        fault = Fault(exc)
        _patch(monkeypatch, mem.embedder, "embed", fault)
    elif point == "summarize":
        fault = Fault(exc)
        _patch(monkeypatch, mem.summarizer, "summarize", fault)
    elif point == "compose":  # a summary's vector from its sentences' vectors
        fault = Fault(exc)
        _patch(monkeypatch, mem.summarizer, "compose", fault)
    elif point == "index.remove":  # after the rows are gone from FAISS
        fault = Fault(exc, after=True)
        _patch(monkeypatch, NodeIndex, "remove", fault)
    elif point == "index.upsert":  # before anything is written
        fault = Fault(exc)
        _patch(monkeypatch, NodeIndex, "upsert", fault)
    elif point == "index.upsert.after":  # every vector written
        fault = Fault(exc, after=True)
        _patch(monkeypatch, NodeIndex, "upsert", fault)
    elif point == "faiss.add":  # new rows in FAISS, the index's own bookkeeping not yet updated
        fault = Fault(exc, after=True)
        _patch(monkeypatch, faiss.IndexIDMap2, "add_with_ids", fault)
    elif point == "durable":  # before the SQLite transaction
        fault = Fault(exc)
        _patch(monkeypatch, DurableStore, "commit", fault)
    elif point == "sqlite":  # a real SQLite error inside the transaction
        fault = Fault(exc)
        _patch(monkeypatch, DurableStore, "_write_meta", fault)
    else:
        raise AssertionError(point)
    return fault


def build(kind: str, tmp_path: Any, durable: bool, n: int = N_BEFORE) -> HierarchicalMemory:
    if durable:
        mem = memory_class(kind).open(tmp_path / "m.sqlite", embedder=HashEmbedder())
    else:
        mem = make_memory(kind)
    for i in range(n):
        mem.add(message_text(i))
    return mem


def reference(kind: str, op: str) -> dict[str, Any]:
    """The memory a run without any fault builds, without cost counters: caches of pure functions (the
    extractive summariser's sentence vectors, HAT's aggregation cache) warmed by the failed call save
    work on the retry."""
    mem = make_memory(kind)
    for i in range(N_BEFORE):
        mem.add(message_text(i))
    run(mem, op)
    return content(mem)


def content(mem: HierarchicalMemory) -> dict[str, Any]:
    d = stripped(mem.to_dict())
    d.pop("usage")
    if mem.kind == "hat":
        d["state"].pop("counters")
    return d


def run(mem: HierarchicalMemory, op: str) -> None:
    if op == "add":
        mem.add([message_text(N_BEFORE), message_text(N_BEFORE + 1)])
    else:
        mem.delete(mem._store.leaves()[3])


def texts_after(op: str) -> list[str]:
    texts = [message_text(i) for i in range(N_BEFORE)]
    if op == "add":
        return [*texts, message_text(N_BEFORE), message_text(N_BEFORE + 1)]
    return texts[:3] + texts[4:]


POINTS = ["embed", "summarize", "compose", "index.remove", "index.upsert", "index.upsert.after", "faiss.add"]
DURABLE_POINTS = ["durable", "sqlite"]


def _cases() -> list[Any]:
    cases = []
    for kind in KINDS:
        for op in ("add", "delete"):
            for durable in (False, True):
                for point in POINTS + (DURABLE_POINTS if durable else []):
                    for exc in EXCEPTIONS if point != "sqlite" else ["sqlite"]:
                        cases.append(
                            pytest.param(
                                kind,
                                op,
                                durable,
                                point,
                                exc,
                                id=f"{kind}-{op}-{'durable' if durable else 'memory'}-{point}-{exc}",
                            )
                        )
    return cases


def _fires(kind: str, op: str, point: str) -> bool:
    """Whether the transaction reaches ``point`` (checked: a fault that should fire and does not fails)."""
    if point == "faiss.add":
        return op == "add"  # a delete only rewrites existing rows
    if point == "embed":  # every memory composes summaries from sentences already embedded by default
        return op == "add"
    if point == "compose":  # every memory composes its summary vectors by default
        return True
    # xMemory's LLM-free annotations do not go through the summariser
    return not (point == "summarize" and kind == "xmemory")


@pytest.mark.parametrize(("kind", "op", "durable", "point", "exc"), _cases())
def test_failed_transaction_leaves_no_trace(kind, op, durable, point, exc, tmp_path, monkeypatch):
    mem = build(kind, tmp_path, durable)
    before = stripped(mem.to_dict())
    index_before = index_snapshot(mem)
    answers_before = answers(mem)
    texts = [message_text(i) for i in range(N_BEFORE)]
    if exc == "sqlite":
        err: BaseException = sqlite3.OperationalError("disk I/O error")
        expected: type[BaseException] = PersistenceError
    else:
        err = EXCEPTIONS[exc]()
        expected = type(err)
    fault = inject(point, mem, monkeypatch, err)
    if not _fires(kind, op, point):
        run(mem, op)
        assert not fault.fired
        return
    with pytest.raises(expected):
        run(mem, op)
    assert fault.fired == 1
    monkeypatch.undo()

    assert stripped(mem.to_dict()) == before
    after = index_snapshot(mem)
    if index_before is None:
        assert after is None or not after[0]
    else:
        assert after is not None and after[0] == index_before[0], "index ids or row order changed"
        np.testing.assert_array_equal(after[1], index_before[1])
    check_tree(mem, texts)
    assert answers(mem) == answers_before
    if durable:
        mem.close_store()
        back = memory_class(kind).open(tmp_path / "m.sqlite", embedder=HashEmbedder())
        assert stripped(back.to_dict()) == before
        assert index_snapshot(back)[0] == sorted(index_before[0])
        mem = back

    run(mem, op)  # the same call again, without a fault
    check_tree(mem, texts_after(op), deleted=op == "delete")
    assert content(mem) == reference(kind, op)
    if durable:
        mem.close_store()
        back = memory_class(kind).open(tmp_path / "m.sqlite", embedder=HashEmbedder())
        assert content(back) == reference(kind, op)
        back.close_store()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["add", "delete"])
def test_interrupt_after_the_durable_commit_keeps_the_change(kind, op, tmp_path, monkeypatch):
    """KeyboardInterrupt after SQLite's COMMIT returned: the change is on disk, so it stays in memory."""
    mem = build(kind, tmp_path, durable=True)
    seq = mem._durable.seq
    real_tx = DurableStore._tx

    def interrupted_tx(self: DurableStore) -> Any:
        cm = real_tx(self)

        class After:
            def __enter__(self_inner) -> Any:
                return cm.__enter__()

            def __exit__(self_inner, *exc: Any) -> Any:
                out = cm.__exit__(*exc)
                if exc[0] is None:  # committed
                    raise KeyboardInterrupt
                return out

        return After()

    monkeypatch.setattr(DurableStore, "_tx", interrupted_tx)
    with pytest.raises(KeyboardInterrupt):
        run(mem, op)
    monkeypatch.undo()
    assert mem._durable.seq == seq + 1
    assert content(mem) == reference(kind, op)
    check_tree(mem, texts_after(op), deleted=op == "delete")
    mem.add("one more message about dogs")  # the memory goes on
    mem.close_store()
    back = memory_class(kind).open(tmp_path / "m.sqlite", embedder=HashEmbedder())
    check_tree(back, [*texts_after(op), "one more message about dogs"], deleted=op == "delete")
    assert back._durable.seq == seq + 2
    back.close_store()


def test_interrupted_clear(tmp_path, monkeypatch):
    """clear(): interrupted before its COMMIT nothing is cleared; after it, memory and disk are empty."""
    mem = build("segtree", tmp_path, durable=True)
    before = stripped(mem.to_dict())
    fault = Fault(KeyboardInterrupt())
    _patch(monkeypatch, DurableStore, "_write_meta", fault)
    with pytest.raises(KeyboardInterrupt):
        mem.clear()
    monkeypatch.undo()
    assert stripped(mem.to_dict()) == before
    real_exec = DurableStore._forget_old_pages
    monkeypatch.setattr(DurableStore, "_forget_old_pages", Fault(KeyboardInterrupt()).wrap(real_exec))
    with pytest.raises(KeyboardInterrupt):
        mem.clear()
    monkeypatch.undo()
    assert len(mem) == 0 and mem._store.root is None
    mem.close_store()
    back = memory_class("segtree").open(tmp_path / "m.sqlite", embedder=HashEmbedder())
    assert len(back) == 0
    back.close_store()


def test_store_without_a_change_sequence_still_opens(tmp_path):
    """Stores written before the change sequence existed open with sequence 0 and count on from there."""
    mem = build("hat", tmp_path, durable=True, n=3)
    mem._durable.conn.execute("DELETE FROM meta WHERE key = 'seq'")
    mem.close_store()
    back = memory_class("hat").open(tmp_path / "m.sqlite", embedder=HashEmbedder())
    assert back._durable.seq == 0
    back.add("another message")
    assert back._durable.seq == 1
    back.close_store()
    again = memory_class("hat").open(tmp_path / "m.sqlite", embedder=HashEmbedder())
    check_tree(again, [*(message_text(i) for i in range(3)), "another message"])
    again.close_store()


def test_malformed_change_sequence_is_a_clear_error(tmp_path):
    mem = build("segtree", tmp_path, durable=True, n=2)
    mem._durable.conn.execute("UPDATE meta SET value = ? WHERE key = 'seq'", (json.dumps("three"),))
    mem.close_store()
    with pytest.raises(PersistenceError, match="change sequence"):
        memory_class("segtree").open(tmp_path / "m.sqlite", embedder=HashEmbedder())


# --------------------------------------------------------------------------- NodeIndex transactions
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.lists(st.integers(0, 30), min_size=1, max_size=6, unique=True)),
        st.tuples(st.just("remove"), st.lists(st.integers(0, 30), min_size=1, max_size=6)),
    ),
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(
    start=st.lists(st.integers(0, 30), max_size=20, unique=True),
    ops=_ops,
    fail_at=st.integers(0, 10),
    seed=st.integers(0, 2**16),
)
def test_index_rollback_restores_ids_order_and_vectors(start, ops, fail_at, seed):
    """Any sequence of upserts and removes, cut short anywhere, rolls back to the exact previous index."""
    rng = np.random.default_rng(seed)
    index = NodeIndex(8)
    index.upsert(start, rng.standard_normal((len(start), 8)).astype(np.float32))
    index.remove([i for i in start if i % 7 == 3])  # the starting rows are not in id order
    ids0 = index.ids.tolist()
    mat0 = index.get(ids0)
    index.begin()
    for step, (op, ids) in enumerate(ops):
        if step == fail_at:
            break
        if op == "upsert":
            index.upsert(ids, rng.standard_normal((len(ids), 8)).astype(np.float32))
        else:
            index.remove(ids)
    index.rollback()
    assert not index.in_transaction
    assert index.ids.tolist() == ids0
    np.testing.assert_array_equal(index.get(ids0), mat0)
    assert sorted(index._row_of) == sorted(ids0)
    assert [index._row_of[i] for i in ids0] == list(range(len(ids0)))
    # the index works on after a rollback
    index.upsert([99], np.ones((1, 8), np.float32))
    got, _ = index.search(np.ones(8, np.float32), 1)
    assert got.tolist() == [99]


def test_index_commit_keeps_changes_and_nested_begin_is_refused():
    index = NodeIndex(4)
    index.upsert([1, 2], np.eye(4, dtype=np.float32)[:2])
    index.begin()
    with pytest.raises(RuntimeError):
        index.begin()
    index.upsert([3], np.eye(4, dtype=np.float32)[2:3])
    index.remove([1])
    index.commit()
    index.rollback()  # nothing open: no-op
    assert index.ids.tolist() == [2, 3]
