"""NodeIndex: node vectors in a FAISS ``IndexIDMap2(IndexFlatIP)`` over L2-normalised float32 vectors.

Inner product of normalised vectors is cosine similarity. Ids are node ids. An update of an existing id
overwrites its row in place (O(dim)), which equals remove + add for a flat index but does not shift rows;
removal compacts the index (O(n)), so it is kept for deletions. Every score it gives (all nodes, some
rows, top-k, restricted top-k) is :func:`inner_products`: the exact dot product rounded to float32, the
same bits on every CPU and whichever rows are scored with it; top-k lists break exact ties by node id,
ascending. FAISS holds the vectors; its own search kernels are not used for scores.

Changes can be grouped in a transaction (:meth:`NodeIndex.begin` / :meth:`~NodeIndex.commit` /
:meth:`~NodeIndex.rollback`): the index keeps the previous vector of every row it overwrites and, at the
first removal, the previous row order, so a rollback restores the exact previous contents and row order
even when the failure interrupted an update half-way.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from .arrays import grow, lookup
from .types import EmbeddingError, InvalidInputError, PersistenceError

__all__ = [
    "NodeIndex",
    "UNIT_ROW_NORM",
    "exact_dot",
    "inner_products",
    "normalize_rows",
    "top_k",
    "unit_row_norm",
]


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """L2-normalise the rows of a float32 array ``(n, d)``; zero rows stay zero."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return x / norms


#: an upper bound of the L2 norm of a row normalised by :func:`normalize_rows` (its norm is 1 within
#: about ``d * 2^-24``, under 1e-3 below 16,000 dimensions); the error bound of :func:`inner_products`
#: for the node index's rows (see :func:`unit_row_norm`)
UNIT_ROW_NORM = 1.001


def unit_row_norm(dim: int) -> float | None:
    """:data:`UNIT_ROW_NORM` for normalised rows of ``dim`` dimensions, ``None`` (compute the norms)
    past 16,000 dimensions, where float32 rounding could take a norm above it."""
    return UNIT_ROW_NORM if dim <= 16_000 else None


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best scores, best first, exact ties by id ascending.

    The ranking rule of every top-k cut: ``np.lexsort((ids, -scores))[:k]``, computed by selecting
    with ``argpartition`` every position scoring at least the ``k``-th best (ties kept whole, so the
    cut does not depend on ``argpartition``'s unstable order) and sorting only those.

    Args:
        ids: ``int64 (n,)`` distinct ids (node ids, insertion indices). scores: ``(n,)``. k: >= 0.

    Returns:
        ``int64 (min(k, n),)`` positions.
    """
    ids = np.asarray(ids)
    neg = -np.asarray(scores, dtype=np.float64)
    k = min(int(k), len(neg))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    pos = np.arange(len(neg), dtype=np.int64)
    if len(neg) > k:
        pos = np.flatnonzero(neg <= np.partition(neg, k - 1)[k - 1])
    return pos[np.lexsort((ids[pos], neg[pos]))][:k]


_U = 2.0**-53  # unit roundoff of float64
_TINY = float(np.finfo(np.float64).tiny)
_CHUNK_VALUES = 1 << 20  # float64 values per block (8 MB): rows per block = this // (d + queries)
_scratch = threading.local()  # per-thread float64 block, reused across calls


def _products64(B: np.ndarray, QT: np.ndarray) -> np.ndarray:
    """``B @ QT`` in float64 by whatever kernel BLAS picks: any order of summation will do (the result
    only has to lie within the error bound of :func:`inner_products`; tests replace it with other
    orders to check that the scores do not change)."""
    if QT.shape[1] == 1:
        # one query: numpy's own single-threaded loop; OpenBLAS's threaded gemv (and a gemm with
        # n = 1) took 5-10x longer on a 2-core machine (24 against 3.4 ms at 25.6k x 384)
        return np.einsum("ij,j->i", B, QT[:, 0])[:, None]
    return B @ QT  # several queries: a gemm, faster than one pass per query from 8 queries on


def _block(rows: int, d: int) -> np.ndarray:
    """A float64 scratch block of at least ``rows x d`` values for this thread (reused)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < rows * d:
        buf = _scratch.buf = np.empty(max(rows * d, 1), dtype=np.float64)
    return buf[: rows * d].reshape(rows, d)


def exact_dot(x: np.ndarray, y: np.ndarray) -> np.float32:
    """The float32 nearest to the exact dot product of two float32 vectors (ties to even).

    The products of float32 numbers are exact in float64; :func:`math.fsum` returns their exact sum
    rounded to float64, and a sum that lands exactly halfway between two float32 numbers is resolved
    by the sign of the exact remainder (no double rounding). Slow (a Python sum): for the few values
    :func:`inner_products` cannot settle from its float64 product.
    """
    p = (np.asarray(x, dtype=np.float32).astype(np.float64) * np.asarray(y, dtype=np.float32)).tolist()
    f = math.fsum(p)
    r = np.float32(f)
    if math.isfinite(f) and float(r) != f:
        other = np.nextafter(r, np.float32(np.inf) if f > float(r) else np.float32(-np.inf))
        if (float(r) + float(other)) / 2 == f:  # halfway: the float64 rounding may have moved s onto it
            rest = math.fsum([*p, -f])
            if rest > 0:
                r = max(r, other)
            elif rest < 0:
                r = min(r, other)
    return np.float32(r)


def inner_products(X: np.ndarray, queries: np.ndarray, *, row_norm: float | None = None) -> np.ndarray:
    """Inner products of every row of ``X`` with each query: the exact value rounded to float32.

    Every value is the float32 nearest to the exact dot product of the two float32 vectors (ties to
    even): a function of the pair alone, whatever the CPU, SIMD width, BLAS kernel, batch, row
    position or memory alignment. So ``ip(x, y)`` is bitwise ``ip(y, x)``, scoring a part of the rows
    gives the values scoring all of them gives, and a ranking cut on these values (ties broken by a
    stable key) is the same on every machine. This is the one dense score every ranking of the
    memories and the flat baselines reads (:meth:`NodeIndex.scores_all`, :meth:`NodeIndex.search`).

    How: products of float32 numbers are exact in float64, so a float64 matrix product (any order,
    any kernel) is within ``gamma_d * sum_j |x_j q_j| <= gamma_d * |x| |q|`` of the exact sum
    (``gamma_d = d u / (1 - d u)``, ``u = 2^-53``; Higham, "Accuracy and Stability of Numerical
    Algorithms", Sec. 4.2). When both ends of that interval round to the same float32, so does the
    exact value (rounding is monotone); the rare value whose interval holds a float32 rounding
    boundary (about 2 in 10,000 for unit vectors of 384 dimensions) is computed exactly
    (:func:`exact_dot`, 20 us each). About 3x the cost of FAISS's float32 SIMD kernel, single-threaded
    (4 against 1.4 ms for 25.6k rows of 384, 16 against 6 ms for 100k), whose sums depend on the SIMD
    width, the row's alignment and, for some widths, its position in the batch.

    Args:
        X: float32 ``(n, d)`` (other dtypes are converted to float32 first).
        queries: float32 ``(m, d)`` or ``(d,)``.
        row_norm: an upper bound of the rows' L2 norms, when the caller knows one (e.g.
            :func:`unit_row_norm` for normalised rows); default ``None`` = computed.

    Returns:
        float32 ``(m, n)``, or ``(n,)`` for a single ``(d,)`` query.

    Raises:
        InvalidInputError: the queries' dimension differs from the rows'.
    """
    X = np.asarray(X, dtype=np.float32)
    Q = np.ascontiguousarray(queries, dtype=np.float32)
    single = Q.ndim == 1
    Q = Q.reshape(1, -1) if single else Q
    n, d = X.shape if X.ndim == 2 else (0, Q.shape[1])
    if Q.shape[1] != d and n:
        raise InvalidInputError(f"queries have dimension {Q.shape[1]}, rows {d}.")
    out = np.empty((len(Q), n), dtype=np.float32)
    if n and len(Q):
        Q64 = Q.astype(np.float64)
        QT = np.ascontiguousarray(Q64.T)
        qn = np.sqrt(np.einsum("ij,ij->i", Q64, Q64))
        if row_norm is None:
            row_norm = float(np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64).max()))
        gamma = d * _U / (1.0 - d * _U)  # d - 1 roundings of the additions: gamma_{d-1} < gamma_d
        # plus the rounding of S -/+ err themselves (2u |S|, |S| <= |x| |q|), with room for the
        # rounding of the norms
        err = (gamma + 4 * _U) * float(row_norm) * qn * (1.0 + 1e-3) + 4.0 * _TINY
        step = max(1, _CHUNK_VALUES // max(d + len(Q), 1))  # a block and its products fit the budget
        for s in range(0, n, step):
            e = min(n, s + step)
            B = _block(e - s, d)
            np.copyto(B, X[s:e])
            S = _products64(B, QT)  # (rows, m), float64, within err of the exact values
            lo = (S - err).astype(np.float32)
            hi = (S + err).astype(np.float32)
            out[:, s:e] = lo.T  # = the rounding of S and of the exact value, where lo == hi
            unsure = np.argwhere((lo != hi) & np.isfinite(S))
            for i, j in unsure.tolist():
                out[j, s + i] = exact_dot(X[s + i], Q[j])
    return out[0] if single else out


@dataclass
class _Journal:
    """What a rollback needs: the row count before the transaction, the previous vector of every id
    overwritten or removed, and (after the first removal) the previous ids in row order."""

    n: int
    old: dict[int, np.ndarray] = field(default_factory=dict)
    ids: np.ndarray | None = None


class NodeIndex:
    """Vector index over node ids.

    Args:
        dim: vector dimension (e.g. 384 for all-MiniLM-L6-v2).

    Vectors passed in are ``float32`` arrays of shape ``(n, dim)``; they are normalised on the way in.

    References:
        FAISS ``IndexIDMap2`` / ``IndexFlatIP`` / ``IDSelectorBatch`` (Douze et al., 2024, "The Faiss
        library").
    """

    def __init__(self, dim: int) -> None:
        if int(dim) < 1:
            raise EmbeddingError(f"Vector dimension must be >= 1, got {dim}.")
        self.dim = int(dim)
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        self._row_of: dict[int, int] = {}
        self._row_arr = np.full(0, -1, dtype=np.int64)  # id -> row for ids in [0, len): vectorised reads
        self._ids = np.zeros(0, dtype=np.int64)  # row -> id
        self._tx: _Journal | None = None

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return int(self._index.ntotal)

    def __contains__(self, nid: object) -> bool:
        return nid in self._row_of

    @property
    def ids(self) -> np.ndarray:
        """Node ids in row order, ``int64`` array ``(n,)`` (a view; do not modify)."""
        return self._ids[: len(self)]

    def _matrix(self) -> np.ndarray:
        return self._raw_matrix(len(self))

    def _check(self, vecs: np.ndarray, n: int, normalize: bool = True) -> np.ndarray:
        vecs = np.asarray(vecs, dtype=np.float32)
        if vecs.ndim == 1:
            vecs = vecs[None, :]
        if vecs.shape != (n, self.dim):
            raise EmbeddingError(f"Expected vectors of shape ({n}, {self.dim}), got {vecs.shape}.")
        if not np.isfinite(vecs).all():
            raise EmbeddingError("Vectors contain NaN or infinite values.")
        return normalize_rows(vecs) if normalize else np.ascontiguousarray(vecs)

    # ------------------------------------------------------------------ transactions
    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        return self._tx is not None

    def begin(self) -> None:
        """Open a transaction: later :meth:`upsert` / :meth:`remove` calls can be undone by :meth:`rollback`.

        Costs O(1); each overwritten or removed row is copied once (O(dim)) before it changes.

        Raises:
            RuntimeError: a transaction is already open.
        """
        if self._tx is not None:
            raise RuntimeError("NodeIndex transaction already open")
        self._tx = _Journal(n=len(self))

    def commit(self) -> None:
        """Close the transaction, keeping its changes (no-op when none is open)."""
        self._tx = None

    def rollback(self) -> None:
        """Undo every change since :meth:`begin`: same ids, vectors and row order (no-op when none is open).

        The contents are read back from FAISS itself, so an update interrupted between FAISS and this
        class's bookkeeping (e.g. by ``KeyboardInterrupt``) is undone as well. Costs O(rows changed)
        without removals, O(n) after one.
        """
        j, self._tx = self._tx, None
        if j is None:
            return
        cur = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        if j.ids is None:  # rows [0, n) are the rows before the transaction, in order
            if len(cur) > j.n:
                self._index.remove_ids(np.ascontiguousarray(cur[j.n :]))
            mat = self._raw_matrix(min(len(cur), j.n))
            row = {int(nid): r for r, nid in enumerate(cur[: j.n].tolist())}
            for nid, vec in j.old.items():
                r = row.get(nid)
                if r is not None:
                    mat[r] = vec
        else:
            mat = self._raw_matrix(len(cur))
            row = {int(nid): r for r, nid in enumerate(cur.tolist())}
            vecs = (
                np.stack([j.old[i] if i in j.old else mat[row[i]] for i in j.ids.tolist()])
                if len(j.ids)
                else np.zeros((0, self.dim), np.float32)
            )
            self._index.reset()
            if len(j.ids):
                self._index.add_with_ids(np.ascontiguousarray(vecs, dtype=np.float32), j.ids)
        self._ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        self._reindex()

    def _reindex(self) -> None:
        """Rebuild the id -> row maps from the ids in row order (after a removal or a rollback)."""
        self._row_of = {int(nid): r for r, nid in enumerate(self._ids.tolist())}
        self._row_arr = np.full(0, -1, dtype=np.int64)
        self._note_rows(self._ids, np.arange(len(self._ids), dtype=np.int64))

    def _note_rows(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Record rows in the array map for ids in ``[0, 4 (n + 16384))``; others are in the dict only."""
        ids = np.asarray(ids, dtype=np.int64)
        cap = 4 * (len(self._row_of) + 16384)
        ok = (ids >= 0) & (ids < cap)
        if not ok.any():
            return
        self._row_arr = grow(self._row_arr, int(ids[ok].max()) + 1, fill=-1)
        self._row_arr[ids[ok]] = rows[ok]

    def _raw_matrix(self, n: int) -> np.ndarray:
        """The first ``n`` stored rows as a writable view of FAISS's storage."""
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        flat = faiss.downcast_index(self._index.index)
        return faiss.rev_swig_ptr(flat.get_xb(), n * self.dim).reshape(n, self.dim)

    # ------------------------------------------------------------------ writing
    def upsert(self, ids: Sequence[int], vecs: np.ndarray, *, normalized: bool = False) -> None:
        """Add new ids and overwrite existing ones.

        Args:
            ids: node ids, ``n`` distinct ints.
            vecs: ``float32`` ``(n, dim)``.

        Raises:
            EmbeddingError: wrong shape or non-finite values (nothing is written).
        """
        ids = [int(i) for i in ids]
        if not ids:
            return
        vecs = self._check(vecs, len(ids), normalize=not normalized)
        new_rows: list[int] = []
        mat = self._matrix()
        tx = self._tx
        for j, nid in enumerate(ids):
            row = self._row_of.get(nid)
            if row is None:
                new_rows.append(j)
            else:
                if tx is not None and nid not in tx.old:
                    tx.old[nid] = mat[row].copy()
                mat[row] = vecs[j]
        if new_rows:
            new_ids = np.asarray([ids[j] for j in new_rows], dtype=np.int64)
            start = len(self)
            self._index.add_with_ids(vecs[new_rows], new_ids)
            if len(self._ids) < start + len(new_ids):
                grown = np.zeros(max(2 * len(self._ids), start + len(new_ids), 16), dtype=np.int64)
                grown[:start] = self._ids[:start]
                self._ids = grown
            self._ids[start : start + len(new_ids)] = new_ids
            for k, nid in enumerate(new_ids.tolist()):
                self._row_of[nid] = start + k
            self._note_rows(new_ids, np.arange(start, start + len(new_ids), dtype=np.int64))

    def remove(self, ids: Iterable[int]) -> None:
        """Remove ids (unknown ids are ignored)."""
        ids = [int(i) for i in ids if int(i) in self._row_of]
        if not ids:
            return
        tx = self._tx
        if tx is not None:
            if tx.ids is None:
                tx.ids = self._ids[: tx.n].copy()
            mat = self._matrix()
            for nid in ids:
                if nid not in tx.old:
                    tx.old[nid] = mat[self._row_of[nid]].copy()
        self._index.remove_ids(np.asarray(ids, dtype=np.int64))
        self._ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        self._reindex()

    # ------------------------------------------------------------------ reading
    def matrix(self) -> np.ndarray:
        """Every stored (normalised) vector in row order (aligned with :attr:`ids`), float32 ``(n, dim)``.

        A read-only view of FAISS's storage: copy it to keep it past the next change."""
        mat = self._matrix()
        mat.flags.writeable = False
        return mat

    def get(self, ids: Sequence[int]) -> np.ndarray:
        """Stored (normalised) vectors, ``float32`` ``(len(ids), dim)``.

        Raises:
            KeyError: an id is not indexed.
        """
        rows = self.rows(ids)
        if (rows < 0).any():
            raise KeyError(int(np.asarray(ids, dtype=np.int64)[np.argmax(rows < 0)]))
        return self._matrix()[rows] if len(rows) else np.zeros((0, self.dim), np.float32)  # copies

    def rows(self, ids: Iterable[int] | np.ndarray) -> np.ndarray:
        """Row positions of ids (``-1`` for an id that is not indexed), ``int64`` array in the order given."""
        ids = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).reshape(-1)
        out = lookup(self._row_arr, ids, -1)
        for j in np.flatnonzero(out < 0).tolist():  # not indexed, or kept in the dict only
            out[j] = self._row_of.get(int(ids[j]), -1)
        return out

    def scores_all(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cosine of one query with every stored vector (:func:`inner_products`).

        Args:
            query: ``float32`` ``(dim,)`` (normalised here).

        Returns:
            ``(ids int64 (n,), scores float32 (n,))`` in row order.
        """
        return self.ids.copy(), self.scores_at(np.arange(len(self)), query)

    def scores_at(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Cosine of one query with the vectors at the given rows: bitwise the values of
        :meth:`scores_all` at those rows (the same query normalisation, the same exact-then-rounded
        product), so a ranking over a part of the nodes agrees with the ranking over all of them.

        Args:
            rows: row positions ``int64 (r,)`` (see :meth:`rows`). query: ``float32 (dim,)``.

        Returns:
            ``float32 (r,)``.
        """
        q = self._check(query, 1)[0]
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        mat = self._matrix()
        X = mat if len(rows) == len(mat) and bool(np.all(rows == np.arange(len(mat)))) else mat[rows]
        return inner_products(X, q, row_norm=unit_row_norm(self.dim))

    def search(
        self, query: np.ndarray, k: int, subset: Iterable[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids by cosine, optionally restricted to ``subset`` ids.

        Exact: every (subset) row is scored by :meth:`scores_at`; the best ``k`` are taken by score,
        ties by node id ascending (the same list on every CPU).

        Returns:
            ``(ids int64 (<=k,), scores float32 (<=k,))``, best first.
        """
        n = len(self)
        if n == 0 or k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        q = self._check(query, 1)[0]
        if subset is None:
            rows = np.arange(n, dtype=np.int64)
        else:
            rows = self.rows(np.fromiter((int(i) for i in subset), dtype=np.int64))
            rows = np.unique(rows[rows >= 0])
        ids = self.ids[rows]
        scores = self.scores_at(rows, q)
        top = top_k(ids, scores, k)
        return ids[top], scores[top]

    # ------------------------------------------------------------------ persistence
    def write(self, path: Path) -> None:
        """Write the FAISS index file (``faiss.write_index``)."""
        faiss.write_index(self._index, str(path))

    @classmethod
    def read(cls, path: Path, dim: int, expected_ids: Iterable[int]) -> NodeIndex:
        """Read an index written by :meth:`write` and check it holds exactly ``expected_ids``.

        Raises:
            PersistenceError: unreadable file, wrong dimension or ids that do not match the tree.
        """
        try:
            raw = faiss.read_index(str(path))
        except Exception as e:  # faiss raises RuntimeError with a C++ message
            raise PersistenceError(f"Cannot read the vector index {path.name}: {e}") from None
        if raw.d != dim:
            raise PersistenceError(f"Vector index has dimension {raw.d}, expected {dim}.")
        try:
            idmap = faiss.downcast_index(raw)
            ids = faiss.vector_to_array(idmap.id_map).astype(np.int64)
            flat = faiss.downcast_index(idmap.index)
            mat = faiss.rev_swig_ptr(flat.get_xb(), len(ids) * dim).reshape(len(ids), dim).copy()
        except Exception as e:
            raise PersistenceError(f"Vector index {path.name} is not an id-mapped flat index: {e}") from None
        if sorted(ids.tolist()) != sorted(int(i) for i in expected_ids):
            raise PersistenceError("Vector index ids do not match the saved tree; the save is corrupt.")
        if not np.isfinite(mat).all():
            raise PersistenceError("Vector index holds non-finite values; the save is corrupt.")
        if len(mat) and float(np.einsum("ij,ij->i", mat, mat, dtype=np.float64).max()) > 1.0 + 2e-3:
            raise PersistenceError("Vector index holds vectors that are not normalised; the save is corrupt.")
        out = cls(dim)
        out.upsert(ids.tolist(), mat, normalized=True)
        return out
