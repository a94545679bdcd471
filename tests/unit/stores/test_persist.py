"""Save / load: plain JSON plus the FAISS index file, atomic snapshot switch, typed errors, no pickle."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import faiss
import numpy as np
import pytest

from shared_core import HierarchicalMemory, SegTreeMem
from shared_core.search.index import NodeIndex
from shared_core.types import Message, PersistenceError, VersionMismatchError
from tests.support.segtree import TopicEmbedder, check_invariants, hit_key

QUERIES = [
    ("topic1 dog", "top_down", "all"),
    ("topic2", "bottom_up", "leaves"),
    ("topic3 piano", "collapsed", "all"),
    ("topic1", "top_down", "leaves"),
]


def build() -> SegTreeMem:
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", threshold=0.4, alpha=0.2, horizon=1, k=7)
    mem.add(
        [
            Message(
                f"topic{t} utterance {i}. Second sentence {i}!", id=f"s{i}", speaker="Ann", metadata={"i": i}
            )
            for i, t in enumerate([1, 1, 2, 2, 2, 3, 1, 3, 3, 2])
        ]
    )
    mem.delete("s4")
    return mem


def results(mem: SegTreeMem):
    return [hit_key(mem.retrieve(q, k=6, policy=p, admissible=a)) for q, p, a in QUERIES]


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


def snapshot_name(path: Path) -> str:
    return (path / "CURRENT").read_text().strip()


def test_round_trip_is_exact(tmp_path):
    mem = build()
    out = mem.save(tmp_path / "save")
    assert out == tmp_path / "save"
    back = SegTreeMem.load(tmp_path / "save", embedder=TopicEmbedder())
    assert back.to_dict() == mem.to_dict()
    assert back._config() == mem._config() and back.stats()["decisions"] == mem.stats()["decisions"]
    ids = sorted(mem._store.nodes)
    np.testing.assert_array_equal(back._index.get(ids), mem._index.get(ids))
    assert results(back) == results(mem)
    check_invariants(back, contiguous=False)
    # both keep growing identically
    more = [Message("topic2 later.", id="n1"), Message("topic4 new thread.", id="n2")]
    mem.add(more)
    back.add(more)
    a, b = mem.to_dict(), back.to_dict()
    a.pop("usage"), b.pop("usage")
    assert a == b
    assert results(back) == results(mem)


def test_generic_load_dispatches_on_kind(tmp_path):
    mem = build()
    mem.save(tmp_path / "s")
    back = HierarchicalMemory.load(tmp_path / "s", embedder=TopicEmbedder())
    assert isinstance(back, SegTreeMem)
    assert back.to_dict() == mem.to_dict()


def test_empty_memory_round_trip(tmp_path):
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    mem.save(tmp_path / "e")
    back = SegTreeMem.load(tmp_path / "e", embedder=TopicEmbedder())
    assert back.to_dict() == mem.to_dict() and len(back) == 0
    assert back.retrieve("anything") == []
    back.add("topic1 first.")
    check_invariants(back, ["topic1 first."])


def test_layout_json_and_faiss_only_no_pickle(tmp_path, monkeypatch):
    def no_pickle(*a, **k):
        raise AssertionError("pickle used")

    for name in ("dump", "dumps", "load", "loads"):
        monkeypatch.setattr(pickle, name, no_pickle)
    mem = build()
    path = tmp_path / "s"
    mem.save(path)
    mem.save(path)  # a second save replaces the first snapshot
    snap = snapshot_name(path)
    assert snap.startswith("snapshot-")
    assert files_under(path) == {"CURRENT", f"{snap}/memory.json", f"{snap}/index.faiss"}
    assert {p.name for p in path.iterdir()} == {"CURRENT", snap}
    data = json.loads((path / snap / "memory.json").read_text(encoding="utf-8"))
    assert data["kind"] == "segtree" and data["dim"] == 8 and data["format"] == 1
    assert len(data["tree"]["nodes"]) == len(mem._store.nodes)
    raw = faiss.read_index(str(path / snap / "index.faiss"))
    assert raw.ntotal == len(mem._store.nodes) and raw.d == 8
    back = SegTreeMem.load(path, embedder=TopicEmbedder())
    assert back.to_dict() == mem.to_dict()


# --------------------------------------------------------------------------- not a save


def test_load_from_something_that_is_not_a_save(tmp_path):
    for p in (tmp_path / "missing", tmp_path):
        with pytest.raises(PersistenceError):
            SegTreeMem.load(p, embedder=TopicEmbedder())
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(PersistenceError):
        SegTreeMem.load(tmp_path / "file.txt", embedder=TopicEmbedder())


def test_save_refuses_a_foreign_directory_or_a_file(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    mem = build()
    with pytest.raises(PersistenceError):
        mem.save(d)
    assert files_under(d) == {"notes.txt"} and (d / "notes.txt").read_text() == "keep me"
    with pytest.raises(PersistenceError):
        mem.save(d / "notes.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    mem.save(empty)  # an empty directory is fine
    assert SegTreeMem.load(empty, embedder=TopicEmbedder()).to_dict() == mem.to_dict()


# --------------------------------------------------------------------------- tampering


@pytest.fixture
def saved(tmp_path) -> tuple[Path, Path, SegTreeMem]:
    mem = build()
    path = tmp_path / "s"
    mem.save(path)
    return path, path / snapshot_name(path), mem


def _edit(snap: Path, fn) -> None:
    f = snap / "memory.json"
    data = json.loads(f.read_text(encoding="utf-8"))
    fn(data)
    f.write_text(json.dumps(data), encoding="utf-8")


def test_bad_json(saved):
    path, snap, _ = saved
    (snap / "memory.json").write_text('{"format": 1, "kind": ', encoding="utf-8")
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())
    (snap / "memory.json").write_text("[1, 2, 3]", encoding="utf-8")
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())


def test_wrong_format_version(saved):
    path, snap, _ = saved
    _edit(snap, lambda d: d.update(format=999))
    with pytest.raises(VersionMismatchError):
        SegTreeMem.load(path, embedder=TopicEmbedder())
    with pytest.raises(VersionMismatchError):
        HierarchicalMemory.load(path, embedder=TopicEmbedder())


def test_wrong_kind(saved):
    path, snap, _ = saved
    _edit(snap, lambda d: d.update(kind="memtree"))
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())


def test_unknown_kind_through_the_generic_loader(saved):
    path, snap, _ = saved
    _edit(snap, lambda d: d.update(kind="no-such-memory"))
    with pytest.raises(PersistenceError):
        HierarchicalMemory.load(path, embedder=TopicEmbedder())


@pytest.mark.parametrize(
    "patch",
    [
        lambda d: d["config"].update(alpha=5.0),
        lambda d: d["config"].update(relevance="sparse"),
        lambda d: d["config"].update(no_such_option=1),
        lambda d: d.update(config=[1, 2]),
    ],
)
def test_corrupt_config_is_persistence_error(saved, patch):
    path, snap, _ = saved
    _edit(snap, patch)
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())


@pytest.mark.parametrize(
    "patch",
    [
        lambda d: d["tree"]["nodes"].pop(0),  # a node gone: the index no longer matches
        lambda d: d["tree"]["nodes"][0].update(parent=12345),  # broken link
        lambda d: d["tree"]["nodes"][0].pop("children"),
        lambda d: d["tree"].update(root="x"),
        lambda d: d.update(state=[1]),
        lambda d: d.pop("dim"),
    ],
)
def test_corrupt_tree_is_persistence_error(saved, patch):
    path, snap, _ = saved
    _edit(snap, patch)
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())


def test_index_file_deleted_or_garbage(saved):
    path, snap, _ = saved
    good = (snap / "index.faiss").read_bytes()
    (snap / "index.faiss").unlink()
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())
    (snap / "index.faiss").write_bytes(b"\x00garbage" * 50)
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())
    (snap / "index.faiss").write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())
    flat = faiss.IndexFlatIP(8)  # a valid FAISS file of the wrong kind (no id map)
    flat.add(np.eye(8, dtype=np.float32))
    faiss.write_index(flat, str(snap / "index.faiss"))
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())


def test_current_pointing_elsewhere(saved):
    path, _, _ = saved
    for name in ("snapshot-doesnotexist", "../../etc", "", "snapshot-../x"):
        (path / "CURRENT").write_text(name)
        with pytest.raises(PersistenceError):
            SegTreeMem.load(path, embedder=TopicEmbedder())


def test_embedder_of_another_dimension(saved):
    path, _, _ = saved
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder(dim=12))


# --------------------------------------------------------------------------- interrupted saves


def test_interrupted_index_write_keeps_the_previous_save(saved, monkeypatch):
    path, snap, mem = saved
    before_files = files_under(path)
    reference = mem.to_dict()
    mem.add([Message("topic3 unsaved change.", id="u1")])

    def boom(self, p):
        Path(p).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(NodeIndex, "write", boom)
    with pytest.raises(OSError, match="disk full"):
        mem.save(path)
    assert files_under(path) == before_files  # no half-written snapshot left behind
    back = SegTreeMem.load(path, embedder=TopicEmbedder())
    assert back.to_dict() == reference
    monkeypatch.undo()
    mem.save(path)
    again = SegTreeMem.load(path, embedder=TopicEmbedder())
    assert again.to_dict() == mem.to_dict()


def test_interrupted_switch_keeps_the_previous_save_and_leaves_no_litter(saved, monkeypatch):
    path, snap, mem = saved
    reference = mem.to_dict()
    mem.add([Message("topic3 unsaved change.", id="u1")])
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "CURRENT":
            raise OSError("power cut")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="power cut"):
        mem.save(path)
    monkeypatch.undo()
    assert snapshot_name(path) == snap.name
    assert SegTreeMem.load(path, embedder=TopicEmbedder()).to_dict() == reference
    mem.save(path)
    new = snapshot_name(path)
    assert files_under(path) == {"CURRENT", f"{new}/memory.json", f"{new}/index.faiss"}
    assert SegTreeMem.load(path, embedder=TopicEmbedder()).to_dict() == mem.to_dict()


def test_first_save_interrupted_then_retried(tmp_path, monkeypatch):
    mem = build()
    path = tmp_path / "fresh"
    monkeypatch.setattr(NodeIndex, "write", lambda self, p: (_ for _ in ()).throw(OSError("nope")))
    with pytest.raises(OSError):
        mem.save(path)
    with pytest.raises(PersistenceError):
        SegTreeMem.load(path, embedder=TopicEmbedder())
    monkeypatch.undo()
    mem.save(path)  # the directory left behind is empty, so saving into it works
    assert SegTreeMem.load(path, embedder=TopicEmbedder()).to_dict() == mem.to_dict()
