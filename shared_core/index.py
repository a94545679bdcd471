"""NodeIndex: node vectors in a FAISS ``IndexIDMap2(IndexFlatIP)`` over L2-normalised float32 vectors.

Inner product of normalised vectors is cosine similarity. Ids are node ids. An update of an existing id
overwrites its row in place (O(dim)), which equals remove + add for a flat index but does not shift rows;
removal compacts the index (O(n)), so it is kept for deletions. Scoring every node for one query uses a
numpy product over FAISS's own storage (no copy); top-k and restricted search (``IDSelectorBatch``) use
FAISS.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from threadpoolctl import ThreadpoolController

from .types import EmbeddingError, PersistenceError

__all__ = ["NodeIndex", "normalize_rows"]

_BLAS: ThreadpoolController | None = None


def _one_blas_thread() -> Any:
    """Context limiting BLAS to one thread: a single-query product is memory-bound, and on a busy
    machine a multi-threaded BLAS spends 10-100x longer synchronising its threads than computing."""
    global _BLAS
    if _BLAS is None:
        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """L2-normalise the rows of a float32 array ``(n, d)``; zero rows stay zero."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return x / norms


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
        self._ids = np.zeros(0, dtype=np.int64)  # row -> id

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
        n = len(self)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        flat = faiss.downcast_index(self._index.index)
        return faiss.rev_swig_ptr(flat.get_xb(), n * self.dim).reshape(n, self.dim)

    def _check(self, vecs: np.ndarray, n: int, normalize: bool = True) -> np.ndarray:
        vecs = np.asarray(vecs, dtype=np.float32)
        if vecs.ndim == 1:
            vecs = vecs[None, :]
        if vecs.shape != (n, self.dim):
            raise EmbeddingError(f"Expected vectors of shape ({n}, {self.dim}), got {vecs.shape}.")
        if not np.isfinite(vecs).all():
            raise EmbeddingError("Vectors contain NaN or infinite values.")
        return normalize_rows(vecs) if normalize else np.ascontiguousarray(vecs)

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
        for j, nid in enumerate(ids):
            row = self._row_of.get(nid)
            if row is None:
                new_rows.append(j)
            else:
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

    def remove(self, ids: Iterable[int]) -> None:
        """Remove ids (unknown ids are ignored)."""
        ids = [int(i) for i in ids if int(i) in self._row_of]
        if not ids:
            return
        self._index.remove_ids(np.asarray(ids, dtype=np.int64))
        self._ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        self._row_of = {int(nid): r for r, nid in enumerate(self._ids.tolist())}

    # ------------------------------------------------------------------ reading
    def get(self, ids: Sequence[int]) -> np.ndarray:
        """Stored (normalised) vectors, ``float32`` ``(len(ids), dim)``.

        Raises:
            KeyError: an id is not indexed.
        """
        mat = self._matrix()
        rows = [self._row_of[int(i)] for i in ids]
        return np.array(mat[rows], dtype=np.float32) if rows else np.zeros((0, self.dim), np.float32)

    def scores_all(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cosine of one query with every stored vector.

        Args:
            query: ``float32`` ``(dim,)`` (normalised here).

        Returns:
            ``(ids int64 (n,), scores float32 (n,))`` in row order.
        """
        q = self._check(query, 1)[0]
        with _one_blas_thread():
            scores = self._matrix() @ q
        return self.ids.copy(), scores

    def search(
        self, query: np.ndarray, k: int, subset: Iterable[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ids by cosine, optionally restricted to ``subset`` ids (``IDSelectorBatch``).

        Returns:
            ``(ids int64 (<=k,), scores float32 (<=k,))``, best first.
        """
        n = len(self)
        if n == 0 or k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        q = self._check(query, 1)
        params = None
        if subset is not None:
            sub = np.fromiter((int(i) for i in subset), dtype=np.int64)
            if sub.size == 0:
                return np.zeros(0, np.int64), np.zeros(0, np.float32)
            params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(sub))
            k = min(k, sub.size)
        k = min(k, n)
        dist, idx = self._index.search(q, k, params=params)
        keep = idx[0] >= 0
        return idx[0][keep].astype(np.int64), dist[0][keep].astype(np.float32)

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
        out = cls(dim)
        out.upsert(ids.tolist(), mat, normalized=True)
        return out
