"""Durable SQLite store: every acknowledged add survives SIGKILL, failed writes roll back, reopen is exact.

Also holds the helpers the reliability tests share (a cheap deterministic embedder, the memory
factories and a structural invariant check over ``to_dict()``).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import random
import re
import sqlite3
import time
from collections import deque
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
from tests.vectors import check_node_vectors

# --------------------------------------------------------------------------- shared helpers
KINDS = ["segtree", "memtree", "hat", "xmemory"]
LLM_FREE_POLICIES = {
    "segtree": ["collapsed", "top_down", "bottom_up"],
    "memtree": ["top_down", "collapsed", "traversal"],
    "hat": ["greedy", "collapsed"],
    "xmemory": ["adaptive", "representative", "collapsed"],
}


class HashEmbedder:
    """Cheap deterministic embedder (the same in every process): the sum of one pseudo-random vector per
    lower-cased word, seeded by BLAKE2b of the word, so texts sharing words are similar."""

    def __init__(self, dim: int = 32) -> None:
        self._dim = dim
        self._words: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return self._dim

    def _word(self, w: str) -> np.ndarray:
        v = self._words.get(w)
        if v is None:
            seed = int.from_bytes(hashlib.blake2b(w.encode("utf-8", "surrogatepass")).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self._dim).astype(np.float32)
            self._words[w] = v
        return v

    def vector(self, text: str) -> np.ndarray:
        words = re.findall(r"\w+", text.lower()) or [text]
        v = np.sum([self._word(w) for w in words], axis=0).astype(np.float32)
        if not np.any(v):
            v[0] = 1.0
        return v

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dim), np.float32)
        return np.stack([self.vector(t) for t in texts])

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def memory_class(kind: str) -> type[HierarchicalMemory]:
    """The class of a memory kind; skips the test when XMemory is not available."""
    if kind == "xmemory":
        mod = pytest.importorskip("shared_core.memories.xmemory")
        return mod.XMemory
    return {"segtree": SegTreeMem, "memtree": MemTree, "hat": HAT}[kind]


def make_memory(kind: str, embedder: Any = None, **kw: Any) -> HierarchicalMemory:
    """A memory of ``kind`` with the cheap embedder and no LLM (extractive summaries)."""
    return memory_class(kind)(embedder if embedder is not None else HashEmbedder(), **kw)


def message_text(i: int) -> str:
    """Deterministic message ``i``: a few topic words shared with nearby messages, two sentences."""
    topics = ["dogs", "travel", "cooking", "music", "work", "garden"]
    a, b = topics[i % 6], topics[(i // 3) % 6]
    return f"Message {i} talks about {a} and {b}. It adds detail number {i * 7 % 13} on {a}."


def check_tree(mem: HierarchicalMemory, texts: Sequence[str] | None = None, *, deleted: bool = False) -> None:
    """Structural invariants read off ``to_dict()`` plus each algorithm's own invariants.

    Links are mutual, every node is reachable from the root, leaves are in insertion order (and in
    left-to-right order for segment-style trees), spans cover the children, the vector index holds
    exactly the nodes with text (with the vectors of their texts), and: SegTreeMem's four invariants,
    HAT's layer rule, MemTree's entry counts and branching.
    """
    tree = mem.to_dict()["tree"]
    nodes = {n["id"]: n for n in tree["nodes"]}
    root = tree["root"]
    leaves = check_tree_dict(tree, contiguous=mem.contiguous_spans)
    if root is None:
        assert mem._index is None or len(mem._index) == 0
        if texts is not None:
            assert list(texts) == []
        return
    assert [mem._store.nodes[i].text for i in mem._store.leaves()] == [n["text"] for n in leaves]
    if texts is not None:
        assert [n["text"] for n in leaves] == list(texts)
    for n in nodes.values():
        if n["children"] and mem.kind != "xmemory":
            spans = [nodes[c]["span"] for c in n["children"]]
            assert n["span"] == [min(s[0] for s in spans), max(s[1] for s in spans)], f"span of {n['id']}"
    with_text = sorted(i for i, n in nodes.items() if n["text"])
    assert mem._index is not None or not with_text
    if mem._index is not None:
        assert sorted(mem._index.ids.tolist()) == with_text, "index and tree disagree"
        if mem.kind != "xmemory" and with_text:
            check_node_vectors(mem, with_text, mem.embedder)
    if isinstance(mem, SegTreeMem):
        from tests.test_segtree import check_invariants

        check_invariants(mem, contiguous=not deleted)
    if isinstance(mem, MemTree):
        assert nodes[root]["text"] == ""
        for n in nodes.values():
            if not n["is_leaf"] and n["id"] != root:
                assert len(n["children"]) >= 2
                assert n["data"]["entries"] == len(mem._store.leaves_under(n["id"]))
        assert nodes[root]["data"]["entries"] == len(leaves)
    check = getattr(mem, "check_invariants", None)
    if callable(check):
        check()


def check_tree_dict(tree: dict[str, Any], contiguous: bool = False) -> list[dict[str, Any]]:
    """Invariants of a ``to_dict()["tree"]`` snapshot: mutual links, one root, every node reachable,
    leaves with distinct insertion indices (and, for ``contiguous`` trees, left to right in insertion
    order). Returns the leaves in insertion order."""
    json.dumps(tree)  # plain data
    nodes = {n["id"]: n for n in tree["nodes"]}
    root = tree["root"]
    if root is None:
        assert not nodes, "nodes without a root"
        return []
    assert nodes[root]["parent"] is None
    for n in nodes.values():
        assert len(set(n["children"])) == len(n["children"])
        for c in n["children"]:
            assert nodes[c]["parent"] == n["id"], f"child link {n['id']}->{c} not mutual"
        if n["parent"] is not None:
            assert n["id"] in nodes[n["parent"]]["children"], f"parent link of {n['id']} not mutual"
        if n["is_leaf"]:
            assert not n["children"] and n["message"] is not None
            assert n["span"][0] == n["span"][1]
    seen, queue = set(), deque([root])
    while queue:
        i = queue.popleft()
        seen.add(i)
        queue.extend(nodes[i]["children"])
    assert seen == set(nodes), "unreachable nodes"
    dfs_leaves: list[int] = []
    stack = [root]
    while stack:
        i = stack.pop()
        if nodes[i]["is_leaf"]:
            dfs_leaves.append(i)
        stack.extend(reversed(nodes[i]["children"]))
    leaves = sorted((n for n in nodes.values() if n["is_leaf"]), key=lambda n: n["span"][0])
    first = [n["span"][0] for n in leaves]
    assert first == sorted(set(first)), "leaf insertion indices repeat"
    assert all(0 <= f < tree["n_inserted"] for f in first)
    if contiguous:
        assert dfs_leaves == [n["id"] for n in leaves], "leaves left to right are not in insertion order"
    return leaves


def stripped(d: dict[str, Any]) -> dict[str, Any]:
    """``to_dict()`` without the wall-clock seconds of its usage (not part of the memory's content)."""
    d = json.loads(json.dumps(d))
    d["usage"].pop("seconds", None)
    return d


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


def _open(kind: str, path: Path) -> HierarchicalMemory:
    return memory_class(kind).open(path, embedder=HashEmbedder())


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
    mem = _open("segtree", path)
    mem.add("held by the first memory")
    with pytest.raises(PersistenceError, match="in use"):
        DurableStore(path, timeout=0.05)
    mem.close_store()
    second = _open("segtree", path)  # free again once closed
    assert len(second) == 1
    second.close_store()


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat"])
def test_failed_sqlite_write_rolls_back_memory(kind, tmp_path):
    """A real SQLite failure (database full) during commit: PersistenceError, memory and disk unchanged."""
    path = tmp_path / "m.sqlite"
    mem = _open(kind, path)
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
    back = _open(kind, path)
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
    mem = _open("memtree", path)
    mem.add([message_text(i) for i in range(5)])
    mem.clear()
    mem.add("after the clear")
    mem.close_store()
    back = _open("memtree", path)
    check_tree(back, ["after the clear"])
    back.close_store()


# --------------------------------------------------------------------------- tampered stores
def _store_with_data(tmp_path: Path) -> Path:
    path = tmp_path / "t.sqlite"
    mem = _open("segtree", path)
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


# --------------------------------------------------------------------------- SIGKILL
def _writer(kind: str, path: str, conn: Any, limit: int) -> None:
    """Child: open the store, report how many messages it holds, then add messages one by one and send
    the index of each one after ``add`` returned (the acknowledgement)."""
    mem = memory_class(kind).open(path, embedder=HashEmbedder(), synchronous="FULL")
    start = len(mem)
    conn.send(("ready", start))
    for i in range(start, start + limit):
        mem.add(Message(message_text(i), id=f"m{i}"))
        conn.send(("ack", i))
    conn.send(("done", start + limit))
    time.sleep(30)


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.test_durable"])
    return ctx


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_never_loses_an_acknowledged_message(kind, tmp_path):
    """Child processes adding messages one by one are SIGKILLed at random moments; after every kill the
    reopened store holds every acknowledged message (in order, none half-inserted) and a valid tree."""
    memory_class(kind)
    runs, limit = 8, 400
    ctx = _context()
    rng = random.Random(f"sigkill-{kind}")
    path = tmp_path / f"{kind}.sqlite"
    acked_total = killed = lost = unacked_kept = 0
    max_acked = -1
    for run in range(runs):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_writer, args=(kind, str(path), send, limit), daemon=True)
        proc.start()
        send.close()
        early = run % 4 == 3  # every fourth run is killed at a random moment of start-up / reopen
        if early:
            time.sleep(rng.uniform(0.0, 0.2))
        else:
            assert recv.poll(60), "child did not start"
            time.sleep(rng.uniform(0.02, 0.35))
        proc.kill()  # SIGKILL
        proc.join(10)
        assert proc.exitcode == -9, f"run {run}: child ended by itself (exit {proc.exitcode})"
        killed += 1
        acks = []
        try:
            while recv.poll():
                tag, i = recv.recv()
                if tag == "ack":
                    acks.append(i)
        except (EOFError, OSError):
            pass
        recv.close()
        if acks:
            assert acks == list(range(acks[0], acks[-1] + 1))
            max_acked = max(max_acked, acks[-1])
        acked_total += len(acks)
        mem = _open(kind, path)
        n = len(mem)
        lost += max(0, max_acked + 1 - n)
        assert n >= max_acked + 1, f"run {run}: acknowledged messages lost ({max_acked + 1 - n})"
        assert n <= max_acked + 2, "more than the one in-flight message appeared"
        unacked_kept += n - (max_acked + 1)
        max_acked = n - 1  # an in-flight add that committed before the kill is durable from now on
        texts = [message_text(i) for i in range(n)]
        check_tree(mem, texts)
        assert [mem._store.nodes[i].message.id for i in mem._store.leaves()] == [f"m{i}" for i in range(n)]
        mem.close_store()
    print(
        f"\nSIGKILL[{kind}]: runs={runs} kills={killed} acknowledged={acked_total} "
        f"stored={max_acked + 1} committed-but-unacknowledged={unacked_kept} lost={lost}"
    )
    assert lost == 0
    assert acked_total > 0
