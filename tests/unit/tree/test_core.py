"""Core building blocks: message validation, the journaled node store, the FAISS node index and score
propagation (SegTreeMem Sec. 4.3.1, Eq. 3-4, Figure 3)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core.search.index import NodeIndex, inner_products, normalize_rows
from shared_core.tree.nodes import ChildTexts, Node, NodeStore, TreeInvariantError
from shared_core.tree.propagation import propagate, propagate_levelled, propagate_parents, propagation_matrix
from shared_core.types import (
    EmbeddingError,
    InvalidInputError,
    Message,
    NodeNotFoundError,
    PersistenceError,
    UnknownPolicyError,
    as_messages,
)


# --------------------------------------------------------------------------- messages
@pytest.mark.parametrize("bad", ["", " ", "\n\t  ", None, 3, 2.5, b"bytes", ["x"], {"text": "x"}])
def test_message_rejects_bad_text(bad):
    with pytest.raises(InvalidInputError):
        Message(bad)  # type: ignore[arg-type]


def test_message_keeps_fields_and_coerces_ids():
    m = Message("hello", role="user", speaker="Ann", timestamp=20240101, id=7, metadata={"k": 1})
    assert (m.text, m.role, m.speaker, m.timestamp, m.id, m.metadata) == (
        "hello",
        "user",
        "Ann",
        "20240101",
        "7",
        {"k": 1},
    )
    assert Message.from_dict(m.to_dict()) == m
    with pytest.raises(InvalidInputError):
        Message("x", metadata=["not", "a", "dict"])  # type: ignore[arg-type]


def test_as_messages_mixed_and_single():
    out = as_messages(["a", Message("b", id="s2"), "c"])
    assert [m.text for m in out] == ["a", "b", "c"]
    assert out[1].id == "s2"
    assert [m.text for m in as_messages("solo")] == ["solo"]
    assert [m.text for m in as_messages(Message("one"))] == ["one"]
    assert [m.text for m in as_messages(t for t in ("g1", "g2"))] == ["g1", "g2"]


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        (),
        {"text": "x"},
        5,
        ["ok", ""],
        ["ok", "   "],
        ["ok", None],
        ["ok", 3],
        ["ok", {"text": "x"}],
    ],
)
def test_as_messages_rejects(bad):
    with pytest.raises(InvalidInputError):
        as_messages(bad)


def test_as_messages_error_names_the_bad_item():
    with pytest.raises(InvalidInputError, match="Item 2"):
        as_messages(["a", "b", ""])


# --------------------------------------------------------------------------- node store journal
def _snapshot(s: NodeStore) -> dict:
    return {
        "dict": copy.deepcopy(s.to_dict()),
        "leaf_at": dict(s.leaf_at),
        "by_source": {k: sorted(v) for k, v in s.by_source.items()},
        "source_at": list(s.source_at),
    }


def _is_ancestor_or_self(s: NodeStore, a: int, b: int) -> bool:
    """Whether ``a`` is ``b`` or one of its ancestors (walks parent links)."""
    cur: int | None = b
    while cur is not None:
        if cur == a:
            return True
        cur = s.nodes[cur].parent
    return False


_TEXTS = st.sampled_from(["", "alpha", "beta", "gamma delta", "ε unicode"])
_SOURCES = st.sampled_from([None, "s1", "s2", "s3"])


def _random_op(s: NodeStore, data: st.DataObject) -> None:
    """Apply one random valid mutation to ``s``."""
    ids = sorted(s.nodes)
    kinds = ["new_leaf", "new_internal"]
    if ids:
        kinds += ["set_text", "set_span", "set_level", "set_data", "refresh_span"]
        internal = [i for i in ids if not s.nodes[i].is_leaf]
        detached = [i for i in ids if s.nodes[i].parent is None]
        if internal and detached:
            kinds.append("add_child")
        if any(s.nodes[i].parent is not None for i in ids):
            kinds.append("detach")
        if any(s.nodes[i].parent is None and not s.nodes[i].children for i in ids):
            kinds.append("delete")
        if detached:
            kinds.append("set_root")
    kind = data.draw(st.sampled_from(kinds))
    if kind == "new_leaf":
        text = data.draw(st.sampled_from(["alpha", "beta", "gamma"]))
        src = data.draw(_SOURCES)
        s.new_node(text=text, is_leaf=True, message=Message(text, id=src), level=1)
    elif kind == "new_internal":
        s.new_node(text=data.draw(_TEXTS), level=data.draw(st.integers(0, 4)), data={"x": 1})
    elif kind == "set_text":
        s.set_text(data.draw(st.sampled_from(ids)), data.draw(_TEXTS))
    elif kind == "set_span":
        a = data.draw(st.integers(0, 9))
        s.set_span(data.draw(st.sampled_from(ids)), (a, a + data.draw(st.integers(0, 3))))
    elif kind == "set_level":
        s.set_level(data.draw(st.sampled_from(ids)), data.draw(st.integers(0, 9)))
    elif kind == "set_data":
        s.set_data(data.draw(st.sampled_from(ids)), data.draw(st.sampled_from(["x", "y"])), [1, 2])
    elif kind == "refresh_span":
        s.refresh_span(data.draw(st.sampled_from(ids)))
    elif kind == "add_child":
        parent = data.draw(st.sampled_from([i for i in ids if not s.nodes[i].is_leaf]))
        cands = [i for i in ids if s.nodes[i].parent is None and not _is_ancestor_or_self(s, i, parent)]
        if not cands:
            return
        child = data.draw(st.sampled_from(cands))
        n = len(s.nodes[parent].children)
        index = data.draw(st.one_of(st.none(), st.integers(0, n)))
        if s.root == child:
            s.set_root(None)
        s.add_child(parent, child, index)
    elif kind == "detach":
        s.detach(data.draw(st.sampled_from([i for i in ids if s.nodes[i].parent is not None])))
    elif kind == "delete":
        s.delete_node(
            data.draw(
                st.sampled_from([i for i in ids if s.nodes[i].parent is None and not s.nodes[i].children])
            )
        )
    elif kind == "set_root":
        s.set_root(data.draw(st.sampled_from([i for i in ids if s.nodes[i].parent is None])))


@pytest.mark.parametrize("contiguous", [False, True])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n_base=st.integers(0, 12), n_tx=st.integers(1, 25))
def test_store_rollback_restores_exactly(contiguous, data, n_base, n_tx):
    s = NodeStore(contiguous)
    s.begin()
    for _ in range(n_base):
        _random_op(s, data)
    s.commit()
    before = _snapshot(s)
    s.begin()
    for _ in range(n_tx):
        _random_op(s, data)
    s.rollback()
    assert _snapshot(s) == before
    assert s.changed == set() and s.removed == set()
    # the store is usable again: a new transaction can open, and a committed change sticks
    s.begin()
    leaf = s.new_node(text="after", is_leaf=True, message=Message("after", id="s9"), level=1)
    s.commit()
    assert s.nodes[leaf.id].span == (before["dict"]["n_inserted"],) * 2
    assert s.by_source["s9"] == [leaf.id]


def test_store_commit_reports_changed_and_removed():
    s = NodeStore()
    s.begin()
    a = s.new_node(text="a", is_leaf=True, message=Message("a"), level=1)
    b = s.new_node(text="b", is_leaf=True, message=Message("b"), level=1)
    s.commit()
    s.begin()
    s.set_text(a.id, "a2")
    s.set_text(b.id, "b")  # unchanged text: not reported
    c = s.new_node(text="c")
    gone = s.new_node(text="tmp")
    s.delete_node(gone.id)
    s.delete_node(b.id)
    changed, removed = s.commit()
    assert changed == {a.id, c.id}
    assert removed == {gone.id, b.id}
    assert s.leaves() == [a.id]


def test_store_nested_begin_and_bad_mutations():
    s = NodeStore()
    s.begin()
    with pytest.raises(TreeInvariantError):
        s.begin()
    p = s.new_node(text="p")
    c = s.new_node(text="c", is_leaf=True, message=Message("c"), level=1)
    s.add_child(p.id, c.id)
    with pytest.raises(TreeInvariantError):
        s.add_child(p.id, c.id)  # already has a parent
    with pytest.raises(TreeInvariantError):
        s.delete_node(p.id)  # has children
    with pytest.raises(NodeNotFoundError):
        s.get(999)
    s.rollback()
    assert len(s) == 0 and s.next_id == 0 and s.n_inserted == 0 and s.leaf_at == {}


def test_store_to_dict_is_a_copy_not_a_view():
    s = NodeStore()
    s.begin()
    leaf = s.new_node(text="a", is_leaf=True, message=Message("a", metadata={"k": 1}), level=1)
    s.set_data(leaf.id, "x", 1)
    s.commit()
    d = s.to_dict()
    d["nodes"][0]["data"]["x"] = 2
    d["nodes"][0]["children"].append(5)
    d["nodes"][0]["message"]["metadata"]["k"] = 2
    assert s.nodes[leaf.id].data == {"x": 1}
    assert s.nodes[leaf.id].children == []
    assert s.nodes[leaf.id].message.metadata == {"k": 1}


def test_store_dict_round_trip_and_links():
    s = NodeStore()
    s.begin()
    root = s.new_node(text="root", level=2)
    leaves = [s.new_node(text=t, is_leaf=True, message=Message(t, id=f"id{t}"), level=1) for t in "xyz"]
    for leaf in leaves:
        s.add_child(root.id, leaf.id)
    s.refresh_span(root.id)
    s.set_root(root.id)
    s.commit()
    assert s.nodes[root.id].span == (0, 2)
    t = NodeStore.from_dict(s.to_dict())
    assert t.to_dict() == s.to_dict()
    assert t.leaf_at == s.leaf_at and t.by_source == s.by_source
    assert t.source_ids_under(root.id) == ["idx", "idy", "idz"]
    d = s.to_dict()
    d["nodes"][1]["parent"] = None  # a child listed under the root whose parent link is gone
    with pytest.raises(TreeInvariantError):
        NodeStore.from_dict(d)
    assert Node.from_dict(s.nodes[leaves[0].id].to_dict()) == s.nodes[leaves[0].id]


# --------------------------------------------------------------------------- node index
def _rand(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def test_index_upsert_overwrite_remove_get():
    idx = NodeIndex(6)
    v = _rand(4, 6, 0)
    idx.upsert([10, 11, 12, 13], v)
    assert len(idx) == 4 and 11 in idx and 99 not in idx
    np.testing.assert_allclose(idx.get([12, 10]), normalize_rows(v[[2, 0]]), atol=1e-6)
    # overwrite one existing id and add a new one in the same call
    w = _rand(2, 6, 1)
    idx.upsert([11, 20], w)
    assert len(idx) == 5
    np.testing.assert_allclose(idx.get([11, 20]), normalize_rows(w), atol=1e-6)
    np.testing.assert_allclose(idx.get([10, 12, 13]), normalize_rows(v[[0, 2, 3]]), atol=1e-6)
    idx.remove([12, 999])
    assert len(idx) == 4 and 12 not in idx
    assert sorted(idx.ids.tolist()) == [10, 11, 13, 20]
    np.testing.assert_allclose(idx.get([13, 20]), normalize_rows(np.stack([v[3], w[1]])), atol=1e-6)
    with pytest.raises(KeyError):
        idx.get([12])
    # a later upsert after removal still lands on the right rows
    idx.upsert([12], v[2:3])
    np.testing.assert_allclose(idx.get([12, 11]), normalize_rows(np.stack([v[2], w[0]])), atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 60), k=st.integers(1, 12), seed=st.integers(0, 10_000))
def test_index_scores_and_search_equal_brute_force(n, k, seed):
    d = 8
    vecs = _rand(n, d, seed)
    ids = list(range(100, 100 + n))
    idx = NodeIndex(d)
    idx.upsert(ids, vecs)
    q = _rand(1, d, seed + 1)[0]
    got_ids, got = idx.scores_all(q)
    ref = normalize_rows(vecs) @ (q / np.linalg.norm(q))
    by_id = dict(zip(got_ids.tolist(), got.tolist()))
    np.testing.assert_allclose([by_id[i] for i in ids], ref, atol=1e-5)
    top_ids, top = idx.search(q, k)
    kk = min(k, n)
    assert len(top_ids) == kk
    order = np.argsort(-ref, kind="stable")[:kk]
    np.testing.assert_allclose(top, ref[order], atol=1e-5)
    assert np.all(np.diff(top) <= 1e-6)
    # the returned ids carry the scores they claim
    np.testing.assert_allclose([by_id[int(i)] for i in top_ids], top, atol=1e-5)
    # restricted search: only subset ids, and the best of them
    rng = np.random.default_rng(seed)
    subset = sorted(rng.choice(ids, size=max(1, n // 3), replace=False).tolist())
    sub_ids, sub = idx.search(q, k, subset=subset + [10_000_000])
    assert set(sub_ids.tolist()) <= set(subset)
    assert len(sub_ids) == min(k, len(subset))
    best_sub = sorted((by_id[i] for i in subset), reverse=True)[: len(sub_ids)]
    np.testing.assert_allclose(sub, best_sub, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 40), m=st.integers(1, 5), d=st.integers(1, 19), seed=st.integers(0, 10_000))
def test_inner_products_are_the_dot_products_and_bitwise_symmetric(n, m, d, seed):
    X = _rand(n, d, seed) if n else np.zeros((0, d), np.float32)
    Q = _rand(m, d, seed + 1)
    got = inner_products(X, Q)
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, Q.astype(np.float64) @ X.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    if n:
        # the same pair gives the same bits whichever side and batch it is computed from
        np.testing.assert_array_equal(inner_products(Q, X), got.T)
        np.testing.assert_array_equal(inner_products(X, Q[0]), got[0])
        np.testing.assert_array_equal(inner_products(X[1:], Q)[:, :], got[:, 1:])
    with pytest.raises(InvalidInputError):
        inner_products(_rand(3, d + 1, seed), Q)


def test_index_empty_and_empty_subset():
    idx = NodeIndex(3)
    ids, sc = idx.search(np.ones(3, np.float32), 5)
    assert ids.size == 0 and sc.size == 0
    idx.upsert([1], np.ones((1, 3), np.float32))
    ids, _ = idx.search(np.ones(3, np.float32), 5, subset=[])
    assert ids.size == 0


@pytest.mark.parametrize(
    "vecs",
    [
        np.ones((2, 5), np.float32),  # wrong dim
        np.ones((3, 4), np.float32),  # wrong rows
        np.array([[1, np.nan, 0, 0], [1, 0, 0, 0]], np.float32),
        np.array([[1, np.inf, 0, 0], [1, 0, 0, 0]], np.float32),
    ],
)
def test_index_rejects_bad_vectors_and_writes_nothing(vecs):
    idx = NodeIndex(4)
    idx.upsert([1], np.ones((1, 4), np.float32))
    with pytest.raises(EmbeddingError):
        idx.upsert([2, 3], vecs)
    assert len(idx) == 1 and 2 not in idx
    with pytest.raises(EmbeddingError):
        idx.scores_all(np.ones(5, np.float32))
    with pytest.raises(EmbeddingError):
        idx.search(np.array([np.nan, 0, 0, 0], np.float32), 1)
    with pytest.raises(EmbeddingError):
        NodeIndex(0)


def test_index_write_read_round_trip(tmp_path):
    idx = NodeIndex(5)
    v = _rand(6, 5, 3)
    idx.upsert([3, 1, 4, 15, 9, 2], v)
    idx.remove([4])
    idx.write(tmp_path / "i.faiss")
    back = NodeIndex.read(tmp_path / "i.faiss", 5, [1, 2, 3, 9, 15])
    assert sorted(back.ids.tolist()) == [1, 2, 3, 9, 15]
    np.testing.assert_array_equal(back.get([1, 2, 3, 9, 15]), idx.get([1, 2, 3, 9, 15]))
    q = _rand(1, 5, 4)[0]
    a_ids, a = idx.search(q, 3)
    b_ids, b = back.search(q, 3)
    assert a_ids.tolist() == b_ids.tolist()
    np.testing.assert_array_equal(a, b)
    with pytest.raises(PersistenceError):
        NodeIndex.read(tmp_path / "i.faiss", 5, [1, 2, 3, 9])  # one id missing
    with pytest.raises(PersistenceError):
        NodeIndex.read(tmp_path / "i.faiss", 5, [1, 2, 3, 9, 15, 16])  # one id too many
    with pytest.raises(PersistenceError):
        NodeIndex.read(tmp_path / "i.faiss", 6, [1, 2, 3, 9, 15])  # wrong dimension
    (tmp_path / "junk.faiss").write_bytes(b"not a faiss index at all")
    with pytest.raises(PersistenceError):
        NodeIndex.read(tmp_path / "junk.faiss", 5, [])
    with pytest.raises(PersistenceError):
        NodeIndex.read(tmp_path / "missing.faiss", 5, [])


# --------------------------------------------------------------------------- propagation
@st.composite
def _parents(draw) -> np.ndarray:
    """A random rooted forest as a parent array (parents precede children, one root at 0)."""
    n = draw(st.integers(1, 30))
    parent = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    return np.asarray(parent, dtype=np.int64)


@settings(max_examples=80, deadline=None)
@given(
    parent=_parents(),
    direction=st.sampled_from(["top_down", "bottom_up"]),
    normalize=st.booleans(),
    alpha=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
    horizon=st.integers(0, 4),
    seed=st.integers(0, 9),
)
def test_propagate_parents_equals_the_sparse_operator(parent, direction, normalize, alpha, horizon, seed):
    # the gather / scatter-add steps give Eq. (3)-(4) exactly as the matrix W_P does, also on forests
    # (a node whose parent is not among the nodes counts as a root)
    r = np.random.default_rng(seed).random(len(parent))
    if seed % 3 == 0 and len(parent) > 2:
        parent = parent.copy()
        parent[len(parent) // 2] = -1
    s0 = r / r.sum()
    W = propagation_matrix(parent, direction, normalize=normalize)
    np.testing.assert_allclose(
        propagate_parents(parent, s0, direction, alpha, horizon, normalize=normalize),
        propagate(W, s0, alpha, horizon),
        rtol=1e-12,
        atol=1e-15,
    )
    with pytest.raises(UnknownPolicyError):
        propagate_parents(parent, s0, "sideways", alpha, horizon)


@settings(max_examples=60, deadline=None)
@given(parent=_parents())
def test_propagation_matrix_columns(parent):
    n = len(parent)
    n_children = np.bincount(parent[parent >= 0], minlength=n)
    td = propagation_matrix(parent, "top_down").toarray()
    bu = propagation_matrix(parent, "bottom_up").toarray()
    assert td.shape == bu.shape == (n, n)
    assert ((td >= 0) & (td <= 1)).all() and ((bu >= 0) & (bu <= 1)).all()
    # top_down: a parent's column spreads 1/|ch| over its children; leaves' columns are zero
    np.testing.assert_allclose(td.sum(axis=0), (n_children > 0).astype(float))
    # bottom_up: a child's column has a single 1 at its parent; the root column is zero
    np.testing.assert_allclose(bu.sum(axis=0), (parent >= 0).astype(float))
    for v in range(n):
        for u in range(n):
            exp_td = 1.0 / n_children[v] if parent[u] == v else 0.0
            exp_bu = 1.0 if parent[v] == u else 0.0
            assert td[u, v] == pytest.approx(exp_td)
            assert bu[u, v] == exp_bu


def test_propagation_matrix_by_hand():
    # root 0 with children 1, 2; node 1 with children 3, 4, 5
    parent = np.array([-1, 0, 0, 1, 1, 1])
    td = propagation_matrix(parent, "top_down").toarray()
    third = 1.0 / 3.0
    expected_td = np.array(
        [
            [0, 0, 0, 0, 0, 0],
            [0.5, 0, 0, 0, 0, 0],
            [0.5, 0, 0, 0, 0, 0],
            [0, third, 0, 0, 0, 0],
            [0, third, 0, 0, 0, 0],
            [0, third, 0, 0, 0, 0],
        ]
    )
    np.testing.assert_allclose(td, expected_td)
    bu = propagation_matrix(parent, "bottom_up").toarray()
    expected_bu = np.array(
        [
            [0, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 1, 1],
            [0, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],
        ]
    )
    np.testing.assert_array_equal(bu, expected_bu)
    with pytest.raises(UnknownPolicyError):
        propagation_matrix(parent, "sideways")


@settings(max_examples=40, deadline=None)
@given(
    parent=_parents(),
    alpha=st.floats(0.0, 0.99),
    seed=st.integers(0, 1000),
    direction=st.sampled_from(["top_down", "bottom_up"]),
)
def test_propagate_matches_dense_formula(parent, alpha, seed, direction):
    n = len(parent)
    r = np.random.default_rng(seed).random(n)
    s0 = r / r.sum()
    W = propagation_matrix(parent, direction)
    np.testing.assert_array_equal(propagate(W, s0, alpha, 0), s0)
    np.testing.assert_array_equal(propagate(None, s0, alpha, 0), s0)
    Wd = W.toarray()
    for H in (1, 2, 3):
        num = sum(alpha**k * np.linalg.matrix_power(Wd, k) @ s0 for k in range(H + 1))
        den = sum(alpha**k for k in range(H + 1))
        np.testing.assert_allclose(propagate(W, s0, alpha, H), num / den, rtol=1e-12, atol=1e-15)


def test_propagate_by_hand():
    # chain root 0 -> 1 -> 2, all mass on the root, top_down, alpha = 0.5, H = 2:
    # s0 = (1, 0, 0), s1 = (0, 1, 0), s2 = (0, 0, 1); s~ = (1, .5, .25) / 1.75
    W = propagation_matrix(np.array([-1, 0, 1]), "top_down")
    got = propagate(W, np.array([1.0, 0.0, 0.0]), 0.5, 2)
    np.testing.assert_allclose(got, [1 / 1.75, 0.5 / 1.75, 0.25 / 1.75], rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("alpha", "horizon"), [(1.0, 1), (-0.1, 1), (math.nan, 1), (0.1, -1), (0.1, 1.5), (0.1, True)]
)
def test_propagate_rejects_bad_parameters(alpha, horizon):
    W = propagation_matrix(np.array([-1, 0]), "top_down")
    with pytest.raises(InvalidInputError):
        propagate(W, np.array([0.5, 0.5]), alpha, horizon)


@given(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=12), st.integers(-14, 14))
def test_child_texts_view_reads_like_the_list_of_child_texts(texts, i):
    store = NodeStore()
    store.begin()
    parent = store.new_node(text="p").id
    for t in texts:
        store.add_child(parent, store.new_node(text=t, is_leaf=True).id)
    view = ChildTexts(store, parent)
    assert len(view) == len(texts) and list(view) == texts
    assert view[1:-1] == texts[1:-1] and view[::-1] == texts[::-1]
    if -len(texts) <= i < len(texts):
        assert view[i] == texts[i]
    else:
        with pytest.raises(IndexError):
            view[i]
    store.set_text(store.nodes[parent].children[-1], "changed")  # a live view, not a copy
    assert view[-1] == "changed"


def _expanded(parent: np.ndarray, gap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tree with every copy written out: (parent of each position, stored node of each position)."""
    n = len(parent)
    total = n + int(gap.sum())
    full = np.empty(total, dtype=np.int64)
    owner = np.arange(total, dtype=np.int64)
    nxt = n
    for j in range(n):
        below = j
        for _ in range(int(gap[j])):
            full[below] = nxt
            owner[nxt] = j
            below, nxt = nxt, nxt + 1
        full[below] = parent[j]
    return full, owner


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 25),
    direction=st.sampled_from(["top_down", "bottom_up"]),
    normalize=st.booleans(),
    alpha=st.sampled_from([0.0, 0.1, 0.3, 0.95]),
    horizon=st.integers(0, 4),
)
def test_levelled_propagation_equals_propagation_over_the_written_out_copies(
    data, n, direction, normalize, alpha, horizon
):
    parent = np.array([-1] + [data.draw(st.integers(0, j - 1)) for j in range(1, n)], dtype=np.int64)
    gap = np.array([0] + [data.draw(st.integers(0, 4)) for _ in range(1, n)], dtype=np.int64)
    r = np.array([data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 0.3])) for _ in range(n)])
    scores, best = propagate_levelled(parent, gap, r, direction, alpha, horizon, normalize=normalize)
    full, owner = _expanded(parent, gap)
    r_full = r[owner]
    s0 = r_full / r_full.sum() if r_full.sum() > 0 else np.full(len(full), 1.0 / len(full))
    W = propagation_matrix(full, direction, normalize=normalize)
    want = propagate(W, s0, alpha, horizon)
    np.testing.assert_allclose(scores, want[:n], rtol=1e-9, atol=1e-12)
    want_best = want[:n].copy()
    np.maximum.at(want_best, owner[n:], want[n:])
    np.testing.assert_allclose(best, want_best, rtol=1e-9, atol=1e-12)
    plain, same = propagate_levelled(
        parent, gap, r, direction, alpha, horizon, normalize=normalize, with_copies=False
    )
    np.testing.assert_array_equal(plain, scores)
    assert same is plain


def test_levelled_propagation_rejects_bad_arguments():
    one = np.array([-1]), np.array([0]), np.array([1.0])
    with pytest.raises(UnknownPolicyError):
        propagate_levelled(*one, "sideways", 0.1, 2)
    with pytest.raises(InvalidInputError):
        propagate_levelled(*one, "top_down", 1.0, 2)
    with pytest.raises(InvalidInputError):
        propagate_levelled(*one, "top_down", 0.1, -1)
