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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from ..arrays import grow, lookup, unique_ints
from ..scores import UNIT_ROW_NORM, exact_dot, inner_products, normalize_rows, top_k, unit_row_norm
from ..types import EmbeddingError, PersistenceError

__all__ = [
    "NodeIndex",
    "UNIT_ROW_NORM",
    "exact_dot",
    "inner_products",
    "normalize_rows",
    "top_k",
    "unit_row_norm",
]


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
            rows = unique_ints(rows[rows >= 0])
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
