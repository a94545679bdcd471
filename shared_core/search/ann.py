"""Approximate nearest-neighbour candidates over a changing set of unit vectors (FAISS IVF-Flat).

A structure that keeps every vector's nearest neighbours (a kNN graph, a nearest-theme lookup) can scan
every vector while the set is small; past a size that scan dominates every update. :class:`NeighbourSearch`
then keeps a FAISS ``IndexIVFFlat`` (inner product, hashtable direct map: vectors added, replaced and
removed by id in O(d)) and answers "the ``k`` nearest ids" by visiting ``nprobe`` of its ``nlist ~
2 sqrt(n)`` lists: about ``(nprobe / 2 + 2) * sqrt(n)`` rows (centroids included) instead of ``n``.
The caller recomputes the exact similarities of the candidates, so only which vectors are considered is
approximate.

References:
    Jégou, Douze, Schmid (2011), "Product Quantization for Nearest Neighbor Search", Sec. III-A
    (the inverted file with a coarse quantizer); Douze et al. (2024), "The Faiss library", Sec. 5.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import faiss
import numpy as np

from ..types import InvalidInputError

__all__ = ["CODES", "NeighbourSearch"]

#: how an index stores its vectors: ``"flat"`` (float32, 4 bytes per dimension) or ``"sq8"`` (8-bit
#: scalar quantised, 1 byte per dimension; candidates ranked by the decoded vectors)
CODES = ("flat", "sq8")


class NeighbourSearch:
    """Nearest-neighbour candidates by inner product: exhaustive up to ``exact_max`` vectors, IVF above.

    While the set holds at most ``exact_max`` vectors, :attr:`exhaustive` is ``True`` and the caller
    scans every vector itself (exact). Above it, :meth:`search` returns approximate candidates from an
    IVF index trained on the set (k-means, ``nlist`` = the power of two nearest ``lists_per_sqrt *
    sqrt(n)`` (default 2), at most 64 training points per list, 10 iterations, fixed seed: the same
    vectors give the same index).
    Measured on 72k unit vectors of 384 dimensions in 2,000 clusters: 512 lists, 0.11 ms per query
    against a scan of all 72k, the true 10 nearest all among 21 candidates; 1.6 s to train.
    The index is trained again when the set has doubled or shrunk to a quarter since the last training,
    and dropped when the set shrinks to ``exact_max // 2`` (:attr:`used` keeps that it has been used).

    Args:
        exact_max: largest set scanned exhaustively; ``None`` = always exhaustive (no index).
        nprobe: lists visited per query, default 8.
        seed: k-means seed, default 1234.
        codes: ``"flat"`` (default: the index holds a float32 copy of every vector) or ``"sq8"``
            (8-bit scalar quantiser, a quarter of the memory; the candidates are ranked by decoded
            vectors, so near ties may change places).
        lists_per_sqrt: ``nlist`` is the power of two nearest ``lists_per_sqrt * sqrt(n)``, default 2
            (fewer lists train faster: 512 instead of 1,024 lists at 254k vectors of 384 train and
            fill in 3.6 instead of 9.7 CPU-seconds).

    Raises:
        InvalidInputError: ``exact_max`` or ``nprobe`` below 1, unknown ``codes`` or ``lists_per_sqrt``
            not above 0.

    References:
        Jégou et al. (2011), Sec. III-A; Douze et al. (2024), "The Faiss library", Sec. 5.
    """

    def __init__(
        self,
        exact_max: int | None,
        nprobe: int = 8,
        seed: int = 1234,
        codes: str = "flat",
        lists_per_sqrt: float = 2.0,
    ) -> None:
        if exact_max is not None and int(exact_max) < 1:
            raise InvalidInputError("exact_max must be >= 1 (or None).")
        if int(nprobe) < 1:
            raise InvalidInputError("nprobe must be >= 1.")
        if codes not in CODES:
            raise InvalidInputError(f"codes must be one of {', '.join(CODES)}; got {codes!r}.")
        self.exact_max = None if exact_max is None else int(exact_max)
        self.nprobe = int(nprobe)
        self.seed = int(seed)
        self.codes = codes
        if not math.isfinite(float(lists_per_sqrt)) or float(lists_per_sqrt) <= 0:
            raise InvalidInputError("lists_per_sqrt must be > 0.")
        self.lists_per_sqrt = float(lists_per_sqrt)
        self._index: faiss.IndexIVF | None = None
        self._trained_n = 0
        #: whether an index has ever answered for this set (then neighbours found since are candidates')
        self.used = False

    @property
    def exhaustive(self) -> bool:
        """Whether the caller should scan every vector (no index is in use)."""
        return self._index is None

    def __len__(self) -> int:
        return 0 if self._index is None else int(self._index.ntotal)

    def _limit(self) -> int | None:
        """The largest set without an index: ``exact_max``, or half of it while an index is in use."""
        if self.exact_max is None:
            return None
        return self.exact_max if self._index is None else self.exact_max // 2

    def due(self, n: int) -> bool:
        """Whether a set of ``n`` vectors needs :meth:`reset` (index to build, drop or train again)."""
        limit = self._limit()
        if limit is None or n <= limit:
            return self._index is not None
        return self._index is None or n >= 2 * self._trained_n or 4 * n <= self._trained_n

    def reset(self, ids: np.ndarray, mat: np.ndarray) -> None:
        """Rebuild for the whole set: train an index and add every vector when the set has more than
        ``exact_max`` vectors (more than ``exact_max // 2`` when an index is in use), else drop it.

        Args:
            ids: distinct ``int64`` ids ``(n,)``. mat: their unit vectors, float32 ``(n, d)``.
        """
        n = len(ids)
        limit = self._limit()
        if limit is None or n <= limit:
            self._index, self._trained_n = None, 0
            return
        X = np.ascontiguousarray(mat[:n], dtype=np.float32)
        d = X.shape[1]
        nlist = min(1 << max(0, round(math.log2(self.lists_per_sqrt * math.sqrt(n)))), 1 << int(math.log2(n)))
        quantizer = faiss.IndexFlatIP(d)
        if self.codes == "sq8":
            qt = faiss.ScalarQuantizer.QT_8bit
            index = faiss.IndexIVFScalarQuantizer(quantizer, d, nlist, qt, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = 10
        index.cp.max_points_per_centroid = 64
        index.cp.min_points_per_centroid = 1  # no warning for small lists: sqrt(n) points each
        index.cp.seed = self.seed
        index.train(X)
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        index.add_with_ids(X, np.ascontiguousarray(ids[:n], dtype=np.int64))
        index.nprobe = min(self.nprobe, nlist)
        self.used = True
        self._index, self._trained_n = index, n

    def sync(
        self,
        n: int,
        whole: Callable[[], tuple[np.ndarray, np.ndarray]],
        gone: Sequence[int] | np.ndarray = (),
        live: Sequence[int] | np.ndarray = (),
        vectors: Callable[[Sequence[int] | np.ndarray], np.ndarray] | None = None,
    ) -> bool:
        """Bring the index to the current set of ``n`` vectors and say whether one is in use.

        When :meth:`due`, :meth:`reset` from ``whole()`` (``(ids, vectors)`` of the whole set); else,
        while an index is in use, :meth:`remove` the ids ``gone`` and :meth:`upsert` the ids ``live``
        (new or changed since the last call) with ``vectors(live)``.
        """
        if self.due(n):
            self.reset(*whole())
        elif self._index is not None:
            self.remove(gone)
            if len(live):
                assert vectors is not None
                self.upsert(live, vectors(live))
        return self._index is not None

    def remove(self, ids: Sequence[int] | np.ndarray) -> None:
        """Remove ids (unknown ids are ignored; nothing to do while exhaustive)."""
        if self._index is None or len(ids) == 0:
            return
        sel = np.ascontiguousarray(ids, dtype=np.int64)
        self._index.remove_ids(faiss.IDSelectorArray(len(sel), faiss.swig_ptr(sel)))

    def upsert(self, ids: Sequence[int] | np.ndarray, rows: np.ndarray) -> None:
        """Add vectors, or replace the vectors of ids already held.

        Args:
            ids: distinct ids ``(m,)``. rows: their unit vectors, float32 ``(m, d)``.
        """
        if self._index is None or len(ids) == 0:
            return
        sel = np.ascontiguousarray(ids, dtype=np.int64)
        self.remove(sel)
        self._index.add_with_ids(np.ascontiguousarray(rows, dtype=np.float32).reshape(len(sel), -1), sel)

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        """The ids of up to ``k`` approximate nearest vectors of each query.

        Args:
            queries: float32 ``(q, d)`` or ``(d,)``. k: candidates per query.

        Returns:
            ``int64 (q, k)``, nearest first, ``-1`` where fewer were found.

        Raises:
            InvalidInputError: called while exhaustive (no index).
        """
        if self._index is None:
            raise InvalidInputError("NeighbourSearch.search: no index while the set is scanned exhaustively.")
        Q = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self._index.d)
        _, ids = self._index.search(Q, int(k))
        return np.asarray(ids, dtype=np.int64)
