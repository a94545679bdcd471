"""NodeArrays: per-node arrays kept in step with a NodeStore through commits, rollbacks and new stores."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core.search.ranking import best_first
from shared_core.tree.nodes import NodeStore
from shared_core.tree.structure import NodeArrays
from tests.support.memory import KINDS, HashEmbedder, make_memory, message_text
from tests.support.structure import naive_structure


def _check(arrays: NodeArrays, store: NodeStore, rng: np.random.Generator) -> None:
    ids = np.array(sorted(store.nodes), dtype=np.int64)
    if len(ids):
        ids = ids[rng.permutation(len(ids))][: max(1, len(ids) - 1)]  # some order, a parent may be missing
    got = arrays.aligned(store, ids)
    want = naive_structure(store, ids)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


OPS = st.lists(
    st.tuples(st.sampled_from(["leaf", "inner", "move", "level", "delete"]), st.integers(0, 50)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(
    txs=st.lists(st.tuples(OPS, st.booleans(), st.booleans()), min_size=1, max_size=8), seed=st.integers(0, 9)
)
def test_arrays_follow_commits_rollbacks_and_reads_mid_transaction(txs, seed):
    rng = np.random.default_rng(seed)
    store = NodeStore()
    arrays = NodeArrays()
    for ops, keep, read_inside in txs:
        store.begin()
        for op, x in ops:
            nodes = sorted(store.nodes)
            inner = [i for i in nodes if not store.nodes[i].is_leaf]
            if op in ("leaf", "inner"):
                n = store.new_node(text="t", is_leaf=op == "leaf", level=1 if op == "leaf" else 2 + x % 3)
                if inner:
                    store.add_child(inner[x % len(inner)], n.id)
            elif op == "move" and nodes and inner:
                c = nodes[x % len(nodes)]
                p = inner[(x // 2) % len(inner)]
                if c != p and c not in store.ancestors(p):
                    if store.nodes[c].parent is not None:
                        store.detach(c)
                    store.add_child(p, c)
            elif op == "level" and nodes:
                store.set_level(nodes[x % len(nodes)], x % 5)
            elif op == "delete" and nodes:
                c = nodes[x % len(nodes)]
                if not store.nodes[c].children:
                    if store.nodes[c].parent is not None:
                        store.detach(c)
                    store.delete_node(c)
            if read_inside:
                _check(arrays, store, rng)  # a read inside the transaction, rolled back or not later
        if keep:
            store.commit()
        else:
            store.rollback()
        _check(arrays, store, rng)


def test_new_store_object_is_read_in_full():
    arrays = NodeArrays()
    a = NodeStore()
    root = a.new_node(text="r", level=3)
    leaf = a.new_node(text="l", is_leaf=True, level=1)
    a.add_child(root.id, leaf.id)
    ids = np.array([root.id, leaf.id])
    assert arrays.aligned(a, ids)[0].tolist() == [-1, 0]
    b = NodeStore.from_dict(a.to_dict())
    b.set_level(root.id, 5)
    assert arrays.aligned(b, ids)[2].tolist() == [0, 3]  # 5 - 1 - 1 copies
    assert arrays.aligned(b, np.zeros(0, np.int64))[0].shape == (0,)


@pytest.mark.parametrize("kind", KINDS)
def test_memory_structure_matches_its_nodes_after_adds_deletes_and_a_load(kind, tmp_path):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(40)])
    mem.retrieve("travel and music", k=5)  # arrays read once
    mem.add([message_text(i) for i in range(40, 55)])
    for i in (3, 4, 30):
        mem.delete(mem._store.leaf_at[i])
    mem.retrieve("garden", k=5)
    ids = mem._index.ids.copy()
    for g, w in zip(mem._structure(ids), naive_structure(mem._store, ids)):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(mem._leaf_mask(ids), naive_structure(mem._store, ids)[1])
    mem.save(tmp_path / "m")
    loaded = type(mem).load(tmp_path / "m", embedder=HashEmbedder())
    ids = loaded._index.ids.copy()
    for g, w in zip(loaded._structure(ids), naive_structure(loaded._store, ids)):
        np.testing.assert_array_equal(g, w)


@settings(max_examples=150, deadline=None)
@given(
    scores=st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.5, 0.9, 1.0, 0.33]), min_size=0, max_size=700),
    keep_every=st.integers(1, 3),
    seed=st.integers(0, 5),
)
def test_best_first_walks_the_full_lexsort_order(scores, keep_every, seed):
    # many ties, sizes around the chunk boundaries (64, 512): the lazy walk equals the full sort
    rng = np.random.default_rng(seed)
    sc = np.asarray(scores, dtype=np.float64)
    ids = rng.permutation(len(sc) * 3)[: len(sc)].astype(np.int64)
    pos = np.arange(0, len(sc), keep_every)
    want = pos[np.lexsort((ids[pos], -sc[pos]))].tolist()
    assert list(best_first(ids, sc, pos)) == want
    assert list(best_first(ids, sc)) == np.lexsort((ids, -sc)).tolist()


def test_grow_and_positions():
    from shared_core.arrays import grow, positions

    a = np.arange(3, dtype=np.int64)
    assert grow(a, 3) is a
    g = grow(a, 5, fill=-1, minimum=4)
    assert len(g) == 6 and g[:3].tolist() == [0, 1, 2] and g[3:].tolist() == [-1, -1, -1]
    m = grow(np.ones((2, 3), np.float32), 3)
    assert m.shape == (16, 3) and m[:2].tolist() == [[1.0] * 3] * 2
    p = positions(np.array([5, 2, 9]), size=12)
    assert len(p) == 12 and p[[5, 2, 9]].tolist() == [0, 1, 2] and (p >= 0).sum() == 3
    assert positions(np.zeros(0, np.int64)).shape == (0,)


def test_lookup_takes_the_default_outside_the_table():
    from shared_core.arrays import lookup, positions

    p = positions(np.array([5, 2, 9]))
    assert lookup(p, np.array([9, 2, 3, 10, -1, 5]), -1).tolist() == [2, 1, -1, -1, -1, 0]
    assert lookup(np.array([0.5, 1.5]), np.array([1, 7]), -np.inf).tolist() == [1.5, -np.inf]
    assert lookup(np.zeros(0), np.array([0, 3]), 2.0).tolist() == [2.0, 2.0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=300))
def test_unique_ints_is_numpys_unique(values):
    """The sort-and-mask ``unique_ints`` returns exactly ``numpy.unique`` (values, order, dtype)."""
    from shared_core.arrays import unique_ints

    a = np.asarray(values, dtype=np.int64)
    got, want = unique_ints(a), np.unique(a)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(unique_ints(a.reshape(1, -1)), want)  # read flattened
