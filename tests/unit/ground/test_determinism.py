"""Rankings do not depend on the CPU, the kernel, the batch or the row order.

Every dense score is :func:`shared_core.search.index.inner_products`: the exact dot product of the float32
vectors rounded to float32 (ties to even), computed from a float64 product of any summation order and
settled exactly where that product cannot decide the rounding. Every cut of a ranking breaks exact ties
by node id, ascending (insertion index for the flat baselines). Checked here:

- the scores against an exact rational reference, including sums that a float64 sum rounds onto a
  float32 midpoint (double rounding);
- the same bits whatever the float64 kernel (the matrix product replaced by reversed, blocked and
  pairwise sums and by a worst-case perturbation within the error bound), the rows scored with it, their
  order and their memory alignment;
- the top-k helpers against ``np.lexsort`` on score ties;
- xMemory's candidate path against its exhaustive path under those kernels and under 1-ulp changes of
  the query vector (texts with the same bag of words tie, as on the AVX2 machine the issue came from);
- every memory and flat baseline: the same hits (ids, texts, score bits) under every kernel and with
  the node index's rows permuted (and, in tests/integration/test_determinism_cpus.py, in subprocesses
  with FAISS's SIMD level and OpenBLAS's core type forced to other values).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core import scores as I
from shared_core.eval.baselines import FlatDense, FlatFusion
from shared_core.memories.xmemory import XMemory
from shared_core.memories.xmemory import retrieval as R
from shared_core.search.index import NodeIndex, exact_dot, inner_products, top_k
from shared_core.search.ranking import best_first
from tests.support.determinism import RETRIEVAL_QUERIES, _all_hits, _both_paths, _hits, _memory
from tests.support.memory import KINDS, HashEmbedder, message_text
from tests.support.xmemory import QUERIES, BowEmbedder, _messages


# --------------------------------------------------------------------------- the reference
def _rn32(s: Fraction) -> np.float32:
    """The float32 nearest to the rational ``s``, ties to even (exact)."""
    f = np.float32(float(s))
    best = None
    for c in (f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))):
        key = (abs(Fraction(float(c)) - s), int(np.asarray(c, np.float32).view(np.uint32)) & 1)
        if best is None or key < best[0]:
            best = (key, np.float32(c))
    assert best is not None
    return best[1]


def _exact(x: np.ndarray, y: np.ndarray) -> np.float32:
    return _rn32(sum((Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x, y)), Fraction(0)))


floats32 = st.floats(-1.0, 1.0, width=32, allow_subnormal=True)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), d=st.integers(1, 24))
def test_inner_products_are_the_exact_dot_products_rounded_to_float32(data, d):
    x = np.asarray(data.draw(st.lists(floats32, min_size=d, max_size=d)), np.float32)
    y = np.asarray(data.draw(st.lists(floats32, min_size=d, max_size=d)), np.float32)
    want = _exact(x, y)
    assert exact_dot(x, y) == want
    got = inner_products(x[None, :], y)[0]
    assert got == want and inner_products(y[None, :], x)[0] == want


@pytest.mark.parametrize(
    "terms",
    [
        [1.0, 2.0**-24, 2.0**-80],  # just above the midpoint 1 + 2^-24: a float64 sum lands on it
        [1.0, 2.0**-24, -(2.0**-80)],  # just below it
        [1.0, 2.0**-24],  # on it: ties to even (1.0)
        [1.0 + 2.0**-23, 2.0**-24],  # on it: ties to even (1 + 2^-22)
        [0.75, -(2.0**-26), 2.0**-60, 2.0**-61],
    ],
)
def test_sums_a_float64_sum_rounds_onto_a_float32_midpoint_are_rounded_once(terms):
    x = np.asarray(terms, np.float32)
    assert x.astype(np.float64).tolist() == terms  # every term is a float32
    y = np.ones(len(terms), np.float32)
    want = _rn32(sum((Fraction(t) for t in terms), Fraction(0)))
    assert exact_dot(x, y) == want
    assert inner_products(np.stack([x, x[::-1]]), y).tolist() == [want, want]


# --------------------------------------------------------------------------- other kernels
def _reversed(B, QT):
    return B[:, ::-1] @ QT[::-1]


def _blocked(B, QT):
    out = np.zeros((B.shape[0], QT.shape[1]))
    for s in range(0, B.shape[1], 7):
        out += B[:, s : s + 7] @ QT[s : s + 7]
    return out


def _sequential(B, QT):
    out = np.zeros((B.shape[0], QT.shape[1]))
    for j in range(B.shape[1]):  # one product at a time, in order
        out += B[:, j : j + 1] * QT[j]
    return out


def _perturbed(B, QT):
    """The exact-ish product moved by up to the error bound of any summation order, at random."""
    S = B @ QT
    d = B.shape[1]
    gamma = d * 2.0**-53 / (1 - d * 2.0**-53)
    bound = gamma * np.sqrt((B * B).sum(1))[:, None] * np.sqrt((QT * QT).sum(0))[None, :]
    rng = np.random.default_rng(int(abs(S).sum() * 1e6) % 2**32)
    return S + rng.uniform(-1.0, 1.0, S.shape) * bound


KERNELS = {"reversed": _reversed, "blocked": _blocked, "sequential": _sequential, "perturbed": _perturbed}


def _rand(n: int, d: int, seed: int, unit: bool = True) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return I.normalize_rows(x) if unit else x


@pytest.mark.parametrize("kernel", list(KERNELS))
@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 300),
    m=st.integers(1, 3),
    d=st.sampled_from([1, 4, 8, 12, 32, 384]),
    seed=st.integers(0, 10**6),
)
def test_scores_do_not_depend_on_the_kernel_rows_order_or_alignment(kernel, n, m, d, seed):
    X, Q = _rand(n, d, seed), _rand(m, d, seed + 1)
    base = inner_products(X, Q)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(I, "_products64", KERNELS[kernel])
        assert np.array_equal(inner_products(X, Q).view(np.uint32), base.view(np.uint32))
        rng = np.random.default_rng(seed)
        perm = rng.permutation(n)
        assert np.array_equal(inner_products(X[perm], Q), base[:, perm])
        sub = np.sort(rng.choice(n, size=max(1, n // 3), replace=False))
        assert np.array_equal(inner_products(X[sub], Q), base[:, sub])
        raw = np.zeros(X.nbytes + 4, np.uint8)  # the same rows at an address 4 bytes off
        shifted = np.frombuffer(raw.data, np.float32, count=X.size, offset=4).reshape(X.shape)
        shifted[...] = X
        assert np.array_equal(inner_products(shifted, Q), base)
        assert np.array_equal(inner_products(Q, X), base.T)


@pytest.mark.parametrize("kernel", [None, *KERNELS])
@pytest.mark.parametrize("budget", [1, 97, 4_000])
def test_one_query_over_many_blocks_gives_the_exact_values_of_every_row(monkeypatch, kernel, budget):
    # one query scores its blocks of _GEMV_VALUES values first and rounds them in one pass: blocks of
    # one row, of a row and a part, and of several rows (the last one short) give every row's value
    monkeypatch.setattr(I, "_GEMV_VALUES", budget)
    if kernel is not None:
        monkeypatch.setattr(I, "_products64", KERNELS[kernel])
    X, Q = _rand(250, 48, 11, unit=False), _rand(2, 48, 12, unit=False)
    want = np.asarray([[exact_dot(x, q) for x in X] for q in Q], np.float32)
    for j, q in enumerate(Q):
        assert np.array_equal(inner_products(X, q).view(np.uint32), want[j].view(np.uint32))
    assert np.array_equal(inner_products(X, Q).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kernel", [None, *KERNELS])
def test_rows_whose_exact_value_is_next_to_a_float32_midpoint_round_the_same_under_every_kernel(kernel):
    # a + ulp(a)/2 +- tiny: a float64 sum of any order lands on the midpoint (or, perturbed, on either
    # side of it); only the exact value says which way it rounds
    rng = np.random.default_rng(5)
    n, d = 300, 16
    X = np.zeros((n, d), np.float32)
    for i in range(n):
        a = np.float32(rng.uniform(0.5, 1.0))
        cols = rng.permutation(d)[:4]
        X[i, cols[0]] = a
        X[i, cols[1]] = 2.0**-25  # half an ulp of a in [0.5, 1)
        X[i, cols[2]] = rng.choice([-1, 0, 1]) * 2.0 ** -int(rng.integers(55, 70))
        X[i, cols[3]] = rng.choice([-1, 1]) * 2.0 ** -int(rng.integers(70, 90))
    q = np.ones(d, np.float32)
    want = np.asarray([_exact(x, q) for x in X], np.float32)
    with pytest.MonkeyPatch.context() as mp:
        if kernel is not None:
            mp.setattr(I, "_products64", KERNELS[kernel])
        assert np.array_equal(inner_products(X, q), want)
        assert np.array_equal(inner_products(X, np.stack([q, q]))[1], want)


def test_node_index_scores_are_the_same_for_any_insertion_order_and_part():
    d, n = 32, 500
    vecs = _rand(n, d, 7, unit=False)
    vecs[50:60] = vecs[40]  # ten exact duplicates of one vector: exact ties
    ids = np.arange(1000, 1000 + n)
    a, b = NodeIndex(d), NodeIndex(d)
    a.upsert(ids.tolist(), vecs)
    perm = np.random.default_rng(1).permutation(n)
    b.upsert(ids[perm].tolist(), vecs[perm])
    for seed in range(5):
        q = _rand(1, d, 100 + seed)[0] if seed else vecs[40]
        ia, sa = a.scores_all(q)
        ib, sb = b.scores_all(q)
        assert dict(zip(ia.tolist(), sa.tolist())) == dict(zip(ib.tolist(), sb.tolist()))
        rows = np.asarray(sorted(np.random.default_rng(seed).choice(n, 40, replace=False)))
        assert np.array_equal(a.scores_at(rows, q), sa[rows])
        for k in (1, 5, 12, 60):
            ta, va = a.search(q, k)
            tb, vb = b.search(q, k)
            assert ta.tolist() == tb.tolist() and np.array_equal(va, vb)
            want = np.lexsort((ia, -sa.astype(np.float64)))[:k]
            assert ta.tolist() == ia[want].tolist()
        sub = ids[::3].tolist()
        assert a.search(q, 7, subset=sub)[0].tolist() == b.search(q, 7, subset=sub[::-1])[0].tolist()
    top = a.search(vecs[40], 11)[0].tolist()
    assert top[:11] == [1040, *range(1050, 1060)]  # the duplicates, ids ascending


# --------------------------------------------------------------------------- top-k cuts
@settings(max_examples=80, deadline=None)
@given(
    scores=st.lists(st.integers(0, 6), min_size=0, max_size=300),
    k=st.integers(0, 80),
    seed=st.integers(0, 10**6),
)
def test_top_k_and_best_first_break_ties_by_id(scores, k, seed):
    rng = np.random.default_rng(seed)
    sc = np.asarray(scores, dtype=np.float32) / 4
    ids = rng.permutation(10 * len(sc) + 1)[: len(sc)].astype(np.int64)  # distinct, in any order
    want = np.lexsort((ids, -sc.astype(np.float64)))
    assert top_k(ids, sc, k).tolist() == want[:k].tolist()
    assert list(best_first(ids, sc)) == want.tolist()
    pos = np.flatnonzero(rng.random(len(sc)) < 0.5)
    assert list(best_first(ids, sc, pos)) == [j for j in want.tolist() if j in set(pos.tolist())]


# --------------------------------------------------------------------------- xMemory's two paths
@pytest.fixture(scope="module")
def xmem() -> XMemory:
    mem = XMemory(embedder=BowEmbedder(), dedup_threshold=0.85, max_episode_messages=5, exact_search_max=None)
    msgs = _messages(300)
    for i in range(0, len(msgs), 10):
        mem.add(msgs[i : i + 10])
    return mem


@pytest.mark.parametrize("kernel", [None, *KERNELS])
def test_xmemory_candidates_give_the_exhaustive_hits_under_every_kernel(xmem, monkeypatch, kernel):
    if kernel is not None:
        monkeypatch.setattr(I, "_products64", KERNELS[kernel])
    monkeypatch.setattr(R, "CANDIDATES_PER_HIT", 5)
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 4)
    baseline = {}
    for relevance in ("hybrid", "dense"):
        for q in QUERIES:
            got, want = _both_paths(xmem, q, 3, relevance=relevance)
            assert _hits(got) == _hits(want)  # ids, texts and score bits
            baseline[relevance, q] = _hits(want)
    # the texts with the same bag of words tie exactly; the lower node id comes first
    tied = [(h[0], h[2]) for h in baseline["hybrid", "river boat market"]]
    assert tied == sorted(tied, key=lambda t: (-np.uint64(t[1]).view(np.float64), t[0]))


class _Nudged:
    """An embedder whose query vectors are moved by one ulp in a few components."""

    def __init__(self, inner, queries: set[str], seed: int) -> None:
        self.inner, self.queries, self.seed = inner, queries, seed
        self.dim = inner.dim

    def embed(self, texts):
        out = np.array(self.inner.embed(texts), dtype=np.float32)
        rng = np.random.default_rng(self.seed)
        for i, t in enumerate(texts):
            if t in self.queries:
                for j in rng.choice(out.shape[1], 3, replace=False):
                    out[i, j] = np.nextafter(out[i, j], np.float32(np.inf if rng.random() < 0.5 else -np.inf))
        return out


@pytest.mark.parametrize("seed", range(4))
def test_xmemory_paths_agree_for_queries_moved_by_one_ulp(xmem, monkeypatch, seed):
    monkeypatch.setattr(R, "CANDIDATES_PER_HIT", 5)
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 4)
    monkeypatch.setattr(xmem, "embedder", _Nudged(xmem.embedder, set(QUERIES), seed))
    for q in QUERIES:
        for relevance in ("hybrid", "dense"):
            got, want = _both_paths(xmem, q, 3, relevance=relevance)
            assert _hits(got) == _hits(want)


# --------------------------------------------------------------------------- every memory


def _permute_rows(mem, seed: int) -> None:
    """Give the memory a node index with the same vectors in another row order."""
    old = mem._index
    perm = np.random.default_rng(seed).permutation(len(old))
    new = NodeIndex(old.dim)
    new.upsert(old.ids[perm].tolist(), old.matrix()[perm], normalized=True)
    mem._index = new
    mem._structure_cache = None


@pytest.mark.parametrize("kind", KINDS)
def test_every_memory_gives_the_same_hits_under_every_kernel_and_row_order(kind, monkeypatch):
    mem = _memory(kind)
    base = _all_hits(mem)
    for name, kernel in KERNELS.items():
        with monkeypatch.context() as mp:
            mp.setattr(I, "_products64", kernel)
            assert _all_hits(mem) == base, name
    _permute_rows(mem, 3)
    assert _all_hits(mem) == base


def test_flat_baselines_give_the_same_hits_under_every_kernel(monkeypatch):
    dense, fusion = FlatDense(HashEmbedder()), FlatFusion(HashEmbedder())
    texts = [message_text(i) for i in range(60)] + ["the boat by the river", "the river by the boat"]
    for b in (dense, fusion):
        b.add(texts)

    def run():
        return [
            (_hits(b.retrieve(q, k=5)), [int(i) for i in dense.ranking(q)[0]])
            for b in (dense, fusion)
            for q in RETRIEVAL_QUERIES
        ]

    base = run()
    for kernel in KERNELS.values():
        with monkeypatch.context() as mp:
            mp.setattr(I, "_products64", kernel)
            assert run() == base
