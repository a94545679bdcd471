"""Durable SQLite store: failed writes roll back, reopen is exact, one writer per store, a tampered store is
a clear error. Every acknowledged add surviving SIGKILL: tests/integration/test_durable_sigkill.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shared_core import HAT, HierarchicalMemory, MemTree, Message, SegTreeMem, memory_classes
from shared_core.durable import DurableStore
from shared_core.types import (
    EmbeddingError,
    InvalidInputError,
    PersistenceError,
    VersionMismatchError,
)
from tests.support.memory import (
    KINDS,
    LLM_FREE_POLICIES,
    HashEmbedder,
    check_tree,
    make_memory,
    memory_class,
    message_text,
    open_memory,
    stripped,
)


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("kind", KINDS)
def test_reopen_rebuilds_nodes_and_index_exactly(kind, tmp_path):
    path = tmp_path / "m.sqlite"
    cls = memory_class(kind)
    mem = cls.open(path, embedder=HashEmbedder())
    raw = [message_text(i) for i in range(14)]
    mem.add(raw[:5])  # several messages in one transaction
    for i, t in enumerate(raw[5:], start=5):
        mem.add(Message(t, id=f"s{i}", speaker="Ann", metadata={"i": i}))
    texts = raw[:5] + [f"Ann: {t}" for t in raw[5:]]  # a leaf stores Message.render()
    if kind == "xmemory" and not mem._store.nodes[mem._store.leaves()[-1]].text.startswith("Ann: "):
        texts = raw  # XMemory's leaves keep the bare message text
    mem.delete("s7")
    mem.delete(mem._store.leaves()[1])
    kept = [t for i, t in enumerate(texts) if i not in (1, 7)]
    check_tree(mem, kept, deleted=True)
    before = stripped(mem.to_dict())
    queries = ["dogs and travel", "cooking detail", "music at work"]
    hits = {(q, p): mem.retrieve(q, k=4, policy=p) for q in queries for p in LLM_FREE_POLICIES[kind]}
    mem.close_store()
    opener = HierarchicalMemory if kind in memory_classes() else cls
    back = opener.open(path, embedder=HashEmbedder())
    assert type(back) is cls
    assert stripped(back.to_dict()) == before
    check_tree(back, kept, deleted=True)
    for (q, p), want in hits.items():
        got = back.retrieve(q, k=4, policy=p)
        assert [(h.node_id, h.text, h.source_ids) for h in got] == [
            (h.node_id, h.text, h.source_ids) for h in want
        ]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
    # the reopened memory goes on where the old one stopped
    back.add(message_text(99))
    check_tree(back, [*kept, message_text(99)], deleted=True)
    back.close_store()


class FlatMemory(HierarchicalMemory):
    """A minimal memory whose constructor forwards ``store=`` to the base class (leaves under a
    structural root; collapsed retrieval by cosine)."""

    kind = "flat-test"

    def __init__(self, embedder: Any = None, llm: Any = None, *, store: Any = None) -> None:
        super().__init__(embedder, llm, store=store)

    def _insert(self, message: Message, usage: Any) -> dict[str, Any]:
        st = self._store
        if st.root is None:
            st.set_root(st.new_node().id)
        leaf = st.new_node(text=message.render(), is_leaf=True, message=message)
        self._set_vector(leaf.id, self._embed([leaf.text], usage)[0])
        st.add_child(st.root, leaf.id)
        st.refresh_span(st.root)
        return {}

    def _retrieve(self, query: str, policy: str, k: int, **params: Any) -> list[Any]:
        ids, r = self.relevance(query)
        order = np.argsort(-r, kind="stable")
        return [(int(ids[j]), float(r[j]), {}) for j in order]


def test_store_keyword_of_the_base_constructor(tmp_path):
    path = tmp_path / "flat.sqlite"
    mem = FlatMemory(HashEmbedder(), store=path)
    assert mem.store_path == path
    mem.add(["first about dogs", Message("second about travel", id="t")])
    mem.delete("t")
    mem.add("third about work")
    before = stripped(mem.to_dict())
    mem.close_store()
    back = FlatMemory(HashEmbedder(), store=path)
    assert stripped(back.to_dict()) == before
    assert [h.text for h in back.retrieve("dogs", k=1)] == ["first about dogs"]
    back.close_store()


def test_attach_store_to_a_full_memory_then_reopen(tmp_path):
    mem = make_memory("hat", M=3)
    mem.add([message_text(i) for i in range(10)])
    before = stripped(mem.to_dict())
    mem.attach_store(tmp_path / "hat.sqlite")
    assert mem.store_path == tmp_path / "hat.sqlite"
    with pytest.raises(InvalidInputError, match="already attached"):
        mem.attach_store(tmp_path / "other.sqlite")
    mem.close_store()
    mem.close_store()  # idempotent
    mem.add(message_text(10))  # in memory only now
    back = HAT.open(tmp_path / "hat.sqlite", embedder=HashEmbedder())
    assert stripped(back.to_dict()) == before
    assert back.M == 3  # the stored configuration
    back.close_store()


def test_attach_refuses_mismatches(tmp_path):
    path = tmp_path / "s.sqlite"
    mem = SegTreeMem.open(path, embedder=HashEmbedder(), threshold=0.5)
    mem.add("one message about dogs")
    mem.close_store()
    with pytest.raises(InvalidInputError, match="threshold"):
        SegTreeMem.open(path, embedder=HashEmbedder(), threshold=0.2)
    other = SegTreeMem(HashEmbedder(), threshold=0.2)
    with pytest.raises(PersistenceError, match="configuration"):
        other.attach_store(path)
    assert other.store_path is None
    with pytest.raises(PersistenceError, match="segtree"):
        MemTree.open(path, embedder=HashEmbedder())
    with pytest.raises(PersistenceError, match="not empty"):
        full = SegTreeMem(HashEmbedder(), threshold=0.5)
        full.add("something else")
        full.attach_store(path)
    with pytest.raises(PersistenceError, match="32-d"):
        SegTreeMem.open(path, embedder=HashEmbedder(dim=16))
    with pytest.raises(InvalidInputError, match="new store"):
        HierarchicalMemory.open(tmp_path / "new.sqlite", embedder=HashEmbedder())
    with pytest.raises(InvalidInputError, match="synchronous"):
        SegTreeMem.open(tmp_path / "x.sqlite", embedder=HashEmbedder(), synchronous="OFF")
    with pytest.raises(PersistenceError, match="directory"):
        SegTreeMem.open(tmp_path, embedder=HashEmbedder())
    ok = SegTreeMem.open(path, embedder=HashEmbedder(), threshold=0.5)  # the same value is fine
    assert len(ok) == 1
    ok.close_store()


def test_one_writer_per_store(tmp_path):
    path = tmp_path / "m.sqlite"
    mem = open_memory("segtree", path)
    mem.add("held by the first memory")
    with pytest.raises(PersistenceError, match="in use"):
        DurableStore(path, timeout=0.05)
    mem.close_store()
    second = open_memory("segtree", path)  # free again once closed
    assert len(second) == 1
    second.close_store()


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat"])
def test_failed_sqlite_write_rolls_back_memory(kind, tmp_path):
    """A real SQLite failure (database full) during commit: PersistenceError, memory and disk unchanged."""
    path = tmp_path / "m.sqlite"
    mem = open_memory(kind, path)
    mem.add([message_text(i) for i in range(6)])
    before = stripped(mem.to_dict())
    conn = mem._durable.conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(PersistenceError, match="full"):
        mem.add(["long message about dogs " * 400, "and another"])
    assert stripped(mem.to_dict()) == before
    conn.execute("PRAGMA max_page_count=1073741823")
    conn.execute("PRAGMA query_only=ON")  # every write now fails inside SQLite
    with pytest.raises(PersistenceError, match="readonly"):
        mem.delete(mem._store.leaves()[0])
    with pytest.raises(PersistenceError):
        mem.clear()
    assert stripped(mem.to_dict()) == before
    check_tree(mem, [message_text(i) for i in range(6)])
    conn.execute("PRAGMA query_only=OFF")
    mem.add("long message about dogs " * 400)  # works again
    mem.close_store()
    back = open_memory(kind, path)
    check_tree(back, [*(message_text(i) for i in range(6)), "long message about dogs " * 400])
    back.close_store()


class _FailingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail:
            return np.full((len(list(texts)), self.dim), np.nan, np.float32)
        return super().embed(texts)


def test_failed_add_writes_nothing(tmp_path):
    path = tmp_path / "m.sqlite"
    emb = _FailingEmbedder()
    mem = SegTreeMem.open(path, embedder=emb)
    mem.add([message_text(i) for i in range(4)])
    disk = (path.stat().st_size, _rows(mem))
    emb.fail = True
    with pytest.raises(EmbeddingError):
        mem.add(message_text(4))
    assert _rows(mem) == disk[1]
    mem.close_store()


def _rows(mem: HierarchicalMemory) -> list[Any]:
    c = mem._durable.conn
    return [
        c.execute("SELECT * FROM nodes ORDER BY id").fetchall(),
        c.execute("SELECT * FROM vectors ORDER BY id").fetchall(),
        c.execute("SELECT * FROM meta ORDER BY key").fetchall(),
    ]


def test_clear_is_durable(tmp_path):
    path = tmp_path / "m.sqlite"
    mem = open_memory("memtree", path)
    mem.add([message_text(i) for i in range(5)])
    mem.clear()
    mem.add("after the clear")
    mem.close_store()
    back = open_memory("memtree", path)
    check_tree(back, ["after the clear"])
    back.close_store()


# --------------------------------------------------------------------------- tampered stores
def _store_with_data(tmp_path: Path) -> Path:
    path = tmp_path / "t.sqlite"
    mem = open_memory("segtree", path)
    mem.add([message_text(i) for i in range(4)])
    mem.close_store()
    return path


@pytest.mark.parametrize(
    "sql, error",
    [
        ("UPDATE meta SET value = '2' WHERE key = 'format'", VersionMismatchError),
        ("UPDATE meta SET value = '99' WHERE key = 'memory_format'", VersionMismatchError),
        ("UPDATE meta SET value = '{' WHERE key = 'config'", PersistenceError),
        ("UPDATE meta SET value = '\"sparse\"' WHERE key = 'kind'", PersistenceError),
        ("DELETE FROM meta WHERE key = 'next_id'", PersistenceError),
        ("UPDATE meta SET value = '1' WHERE key = 'next_id'", PersistenceError),
        ("UPDATE nodes SET children = '[12345]' WHERE id = (SELECT MAX(id) FROM nodes)", PersistenceError),
        ("UPDATE nodes SET data = '[1]' WHERE id = 0", PersistenceError),
        ('UPDATE nodes SET message = \'{"text": ""}\' WHERE id = 0', PersistenceError),
        (
            'UPDATE nodes SET message = \'{"__reduce__": ["os.system", ["x"]]}\' WHERE id = 0',
            PersistenceError,
        ),
        ("DELETE FROM vectors WHERE id = 0", PersistenceError),
        ("UPDATE vectors SET vec = x'00' WHERE id = 0", PersistenceError),
        ("DELETE FROM nodes WHERE id = 0", PersistenceError),
        ("CREATE TRIGGER t AFTER INSERT ON nodes BEGIN DELETE FROM meta; END", PersistenceError),
        ("CREATE TABLE extra (x)", PersistenceError),
    ],
)
def test_tampered_store_is_a_clear_error(tmp_path, sql, error):
    path = _store_with_data(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()
    with pytest.raises(error):
        HierarchicalMemory.open(path, embedder=HashEmbedder())
    # the failed open released the file
    probe = sqlite3.connect(path, timeout=0.05, isolation_level=None)
    probe.execute("BEGIN IMMEDIATE")
    probe.execute("ROLLBACK")
    probe.close()


def test_not_a_database(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all " * 100)
    with pytest.raises(PersistenceError, match="not a hiermem store"):
        SegTreeMem.open(bad, embedder=HashEmbedder())
