"""LlamaIndex persistence through fsspec filesystems (``persist(..., fs=fs)`` and the loaders' ``fs=``).

The memory is written by the core to a local temporary directory and copied through ``fs`` (the local
filesystem is written in place). No network, no API key and no model: a deterministic hash embedder.
"""

from __future__ import annotations

import uuid

import fsspec
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from llama_index.core import Settings, StorageContext
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode

from llamaindex_hiermem import HierMemEmbedding, SegTreeIndex, load_index_from_storage
from shared_core.types import InvalidInputError, PersistenceError
from tests.support.llamaindex import TEXTS, HashEmbedder, summary, tree_of

QUERIES = [("dog name", "bottom_up"), ("Maria's job", "top_down"), ("what was for dinner", "collapsed")]


@pytest.fixture(autouse=True)
def li_settings(monkeypatch):
    """Explicit Settings for each test (the hash embedder, a placeholder LLM = no LLM), then restored."""
    monkeypatch.setattr(Settings, "_llm", MockLLM())
    monkeypatch.setattr(Settings, "_embed_model", HierMemEmbedding(HashEmbedder()))


@pytest.fixture
def memfs():
    """The in-memory filesystem, under a fresh root removed afterwards (its store is process-wide)."""
    fs = fsspec.filesystem("memory")
    root = f"/hiermem-test-{uuid.uuid4().hex[:8]}"
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


def build() -> SegTreeIndex:
    return SegTreeIndex(
        [TextNode(id_=f"n{i}", text=t) for i, t in enumerate(TEXTS)], threshold=0.2, relevance="dense"
    )


def assert_same_index(a, b) -> None:
    """Same class, ids, tree, docstore and retrieval results."""
    assert type(a) is type(b) and a.index_id == b.index_id
    assert tree_of(a) == tree_of(b)
    assert a.index_struct.all_nodes == b.index_struct.all_nodes
    assert a.index_struct.node_id_to_children_ids == b.index_struct.node_id_to_children_ids
    assert set(a.docstore.docs) == set(b.docstore.docs)
    for q, policy in QUERIES:
        want = summary(a.as_retriever(policy=policy, admissible="all").retrieve(q))
        assert want and summary(b.as_retriever(policy=policy, admissible="all").retrieve(q)) == want


def snapshots(fs, save_dir: str) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(save_dir, detail=False) if "snapshot-" in p)


# --------------------------------------------------------------------------- round trips
def test_round_trip_through_the_memory_filesystem(memfs, tmp_path, monkeypatch):
    fs, root = memfs
    monkeypatch.chdir(tmp_path)  # nothing may land on the local disk
    index = build()
    url = f"memory://{root}/storage"
    index.storage_context.persist(url, fs=fs)

    save_dir = f"{root}/storage/hiermem/{index.index_id}"
    assert fs.isfile(f"{root}/storage/docstore.json") and fs.isfile(f"{save_dir}/CURRENT")
    (snap,) = snapshots(fs, save_dir)
    assert fs.cat_file(f"{save_dir}/CURRENT").decode() == snap
    assert {p.rsplit("/", 1)[-1] for p in fs.ls(f"{save_dir}/{snap}", detail=False)} == {
        "memory.json",
        "index.faiss",
    }
    assert list(tmp_path.iterdir()) == []

    again = SegTreeIndex.from_persist_dir(url, fs=fs)
    other = load_index_from_storage(
        StorageContext.from_defaults(persist_dir=url, fs=fs), persist_dir=url, fs=fs
    )
    for idx in (again, other):
        assert_same_index(index, idx)
        assert idx.ref_doc_info == index.ref_doc_info

    # the reloaded index keeps working and saves again over the same save (old snapshot replaced)
    again.insert_nodes([TextNode(id_="late", text="Luna turned two years old.")])
    again.persist(f"{root}/storage", fs=fs)  # the index's own persist; a path without the protocol
    (snap2,) = snapshots(fs, save_dir)
    assert snap2 != snap
    third = SegTreeIndex.from_persist_dir(url, fs=fs)
    assert_same_index(again, third)
    assert "late" in third.index_struct.all_nodes.values()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("as_url", [False, True])
def test_round_trip_through_the_local_fsspec_filesystem(tmp_path, as_url):
    fs = fsspec.filesystem("file")
    assert isinstance(fs, LocalFileSystem)
    index = build()
    d = tmp_path / "storage"
    where = d.as_uri() if as_url else str(d)
    index.storage_context.persist(where, fs=fs)
    # the same files as a plain local save
    assert (d / "docstore.json").is_file() and (d / "hiermem" / index.index_id / "CURRENT").is_file()

    assert_same_index(index, SegTreeIndex.from_persist_dir(where, fs=fs))
    sc = StorageContext.from_defaults(persist_dir=str(d), fs=fs)
    assert_same_index(index, load_index_from_storage(sc, persist_dir=where, fs=fs))
    assert_same_index(index, SegTreeIndex.from_persist_dir(d))  # readable without fs too


def test_round_trip_through_a_filesystem_wrapping_the_local_disk(tmp_path):
    """A non-local fsspec filesystem backed by the disk: the copied files form a plain local save."""
    fs = DirFileSystem(path=str(tmp_path), fs=LocalFileSystem())
    index = build()
    index.storage_context.persist("storage", fs=fs)
    save_dir = tmp_path / "storage" / "hiermem" / index.index_id
    assert (save_dir / "CURRENT").is_file()
    assert [p.name for p in save_dir.iterdir() if p.is_dir()] == [(save_dir / "CURRENT").read_text()]

    assert_same_index(index, SegTreeIndex.from_persist_dir("storage", fs=fs))
    assert_same_index(index, SegTreeIndex.from_persist_dir(tmp_path / "storage"))
    # and a plain local save can be read through the wrapper
    index.storage_context.persist(tmp_path / "plain")
    assert_same_index(index, SegTreeIndex.from_persist_dir("plain", fs=fs))


def test_other_memory_kinds_are_dispatched_through_fs(memfs):
    pytest.importorskip("shared_core.memories.memtree")
    import llamaindex_hiermem

    fs, root = memfs
    index = llamaindex_hiermem.MemTreeIndex([TextNode(id_=f"n{i}", text=t) for i, t in enumerate(TEXTS)])
    index.storage_context.persist(f"{root}/mt", fs=fs)
    again = load_index_from_storage(
        StorageContext.from_defaults(persist_dir=f"{root}/mt", fs=fs), persist_dir=f"{root}/mt", fs=fs
    )
    assert type(again) is llamaindex_hiermem.MemTreeIndex and tree_of(again) == tree_of(index)
    assert summary(again.as_retriever(policy="collapsed").retrieve("dog")) == summary(
        index.as_retriever(policy="collapsed").retrieve("dog")
    )
    with pytest.raises(PersistenceError, match="No SegTreeIndex"):
        SegTreeIndex.from_persist_dir(f"{root}/mt", fs=fs)


# --------------------------------------------------------------------------- errors
def test_missing_paths_give_persistence_errors(memfs, tmp_path):
    fs, root = memfs
    with pytest.raises(PersistenceError, match="No saved index"):
        SegTreeIndex.from_persist_dir(f"memory://{root}/nowhere", fs=fs)
    with pytest.raises(PersistenceError, match="No saved index"):
        SegTreeIndex.from_persist_dir(tmp_path / "nowhere", fs=fsspec.filesystem("file"))
    with pytest.raises(PersistenceError, match="No saved index"):
        SegTreeIndex.from_persist_dir(tmp_path / "nowhere")

    index = build()
    index.storage_context.persist(f"{root}/s", fs=fs)
    sc = StorageContext.from_defaults(persist_dir=f"{root}/s", fs=fs)
    # the LlamaIndex stores are there but the memory is not where it is looked for
    with pytest.raises(PersistenceError, match="No hiermem memory saved"):
        SegTreeIndex(index_struct=index.index_struct, storage_context=sc, persist_dir=f"{root}/other", fs=fs)
    fs.rm(f"{root}/s/hiermem", recursive=True)
    with pytest.raises(PersistenceError, match="No hiermem index"):
        load_index_from_storage(sc, persist_dir=f"{root}/s", fs=fs)
    with pytest.raises(PersistenceError, match="has no saved hiermem memory"):
        load_index_from_storage(sc, index.index_id, persist_dir=f"{root}/s", fs=fs)
    with pytest.raises(PersistenceError, match="No SegTreeIndex"):
        SegTreeIndex.from_persist_dir(f"{root}/s", fs=fs)


def test_corrupt_or_foreign_targets_are_refused(memfs):
    fs, root = memfs
    index = build()
    index.storage_context.persist(f"{root}/s", fs=fs)
    save_dir = f"{root}/s/hiermem/{index.index_id}"

    fs.pipe_file(f"{save_dir}/CURRENT", b"../../elsewhere")
    with pytest.raises(PersistenceError, match="invalid snapshot"):
        SegTreeIndex.from_persist_dir(f"{root}/s", fs=fs)
    fs.rm(f"{save_dir}/CURRENT")
    with pytest.raises(PersistenceError, match="not a saved hiermem memory"):
        SegTreeIndex.from_persist_dir(f"{root}/s", fs=fs)
    # a non-empty directory that is not a save is not overwritten
    with pytest.raises(PersistenceError, match="not a hiermem save"):
        index.storage_context.persist(f"{root}/s", fs=fs)
    fs.pipe_file(f"{root}/f/hiermem/{index.index_id}", b"a file")
    with pytest.raises(PersistenceError, match="is a file"):
        index.storage_context.persist(f"{root}/f", fs=fs)
    with pytest.raises(InvalidInputError, match="fs= is for reloading"):
        SegTreeIndex([TextNode(id_="x", text="hello there")], fs=fs)


class FlakyMemoryFileSystem(MemoryFileSystem):
    """The memory filesystem, failing uploads while ``fail`` is set."""

    fail = False

    def put_file(self, lpath, rpath, *args, **kwargs):
        if self.fail:
            raise PermissionError("bucket is read-only")
        return super().put_file(lpath, rpath, *args, **kwargs)


def test_failed_upload_is_typed_and_keeps_the_previous_save(memfs):
    _, root = memfs
    fs = FlakyMemoryFileSystem(skip_instance_cache=True)
    index = build()
    index.storage_context.persist(f"{root}/s", fs=fs)
    before = tree_of(index)

    index.insert_nodes([TextNode(id_="late", text="Luna turned two years old.")])
    fs.fail = True
    with pytest.raises(PersistenceError, match="bucket is read-only") as e:
        index.storage_context.persist(f"{root}/s", fs=fs)
    assert isinstance(e.value.__cause__, PermissionError)
    fs.fail = False
    assert tree_of(SegTreeIndex.from_persist_dir(f"{root}/s", fs=fs)) == before
