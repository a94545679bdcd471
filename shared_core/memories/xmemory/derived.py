"""Structures xMemory derives from its node store and vectors: the semantic ids and vectors, the
themes' statistics, the two kNN graphs, and the stacked matrices the construction multiplies with.

References:
    xMemory Sec. 3.2 (themes, kNN graphs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...arrays import grow, positions
from ...search.ann import NeighbourSearch
from ...search.index import normalize_rows
from .knn import KNNGraph, Search


class _Themes(dict):  # type: ignore[type-arg]
    """``theme_stats``: a dict that records which themes were set or removed since the last read.

    ``dirty`` and ``removed`` are read (and reset) by the theme matrix; ``changed`` and ``dropped``
    collect the ids set and removed until the theme kNN graph takes them; ``searched`` and ``unsearched``
    the same until the theme neighbour search takes them.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.dirty: set[int] = set(self)
        self.removed = True
        self.changed: set[int] = set(self)
        self.dropped: set[int] = set()
        self.searched: set[int] = set(self)
        self.unsearched: set[int] = set()

    def __setitem__(self, key: int, value: Any) -> None:
        super().__setitem__(key, value)
        self.dirty.add(key)
        self.changed.add(key)
        self.searched.add(key)

    def __delitem__(self, key: int) -> None:
        super().__delitem__(key)
        self.removed = True
        self.dropped.add(key)
        self.unsearched.add(key)

    def pop(self, key: int, *default: Any) -> Any:
        if key in self:
            self.removed = True
            self.dropped.add(key)
            self.unsearched.add(key)
        return super().pop(key, *default)


@dataclasses.dataclass
class _Derived:
    """Structures derived from the node store and vectors; rebuilt after a rollback or a load.

    The stacked semantic matrix (float32) and its ids grow in place as semantics are added; the
    normalised theme centroid matrix is updated row by row as ``theme_stats`` changes (rebuilt after a
    theme is removed or when a theme id comes before an existing one). The arrays they return are views
    that later updates change: read them before the next change.

    ``sem_search`` and ``theme_search`` find nearest-neighbour candidates once a set outgrows their
    ``exact_max`` (:class:`~shared_core.search.ann.NeighbourSearch`); :meth:`sem_searcher` /
    :meth:`theme_searcher` bring them up to date and return their search, or ``None`` while the set is
    scanned exhaustively.
    """

    sem_ids: list[int]
    sem_vec: dict[int, np.ndarray]
    theme_stats: dict[int, tuple[int, float, np.ndarray]]  # size, cohesion, centroid (mean of unit rows)
    sem_graph: KNNGraph
    theme_graph: KNNGraph
    _buf: np.ndarray | None = None
    _sid: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _spos: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _n: int = 0
    _tids: list[int] = dataclasses.field(default_factory=list)
    _tbuf: np.ndarray | None = None
    _tid: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _tposa: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _tsize: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    _tcoh: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    sem_search: NeighbourSearch = dataclasses.field(default_factory=lambda: NeighbourSearch(None))
    theme_search: NeighbourSearch = dataclasses.field(default_factory=lambda: NeighbourSearch(None))
    _searched_n: int = 0  # semantics the semantic search holds (a prefix of sem_ids)

    def __post_init__(self) -> None:
        self.theme_stats = _Themes(self.theme_stats)

    def _sem_sync(self) -> None:
        # sem_ids only grows while a cache lives (a deletion drops the cache): new rows are appended
        n = len(self.sem_ids)
        if n == self._n:
            return
        new = np.stack([self.sem_vec[i] for i in self.sem_ids[self._n :]]).astype(np.float32, copy=False)
        if self._buf is None:
            self._buf = np.empty((0, new.shape[1]), dtype=np.float32)
        self._buf = grow(self._buf, n, minimum=64)
        self._buf[self._n : n] = new
        self._sid = grow(self._sid, n, minimum=64)
        self._sid[self._n : n] = self.sem_ids[self._n : n]
        added = self._sid[self._n : n]
        self._spos = grow(self._spos, int(added.max()) + 1, fill=-1, minimum=64)
        self._spos[added] = np.arange(self._n, n, dtype=np.int64)
        self._n = n

    def sem_matrix(self) -> np.ndarray:
        """The semantic vectors, float32 ``(len(sem_ids), d)`` in ``sem_ids`` order."""
        if not self.sem_ids:
            return np.zeros((0, 1), dtype=np.float32)
        self._sem_sync()
        assert self._buf is not None
        return self._buf[: self._n]

    def sem_id_array(self) -> np.ndarray:
        """``sem_ids`` as an ``int64`` array ``(len(sem_ids),)`` (a view, grown in place)."""
        self._sem_sync()
        return self._sid[: len(self.sem_ids)]

    def sem_positions(self) -> np.ndarray:
        """The inverse of :meth:`sem_id_array`: ``int64`` by semantic id, its position, ``-1`` for other ids
        (as :func:`~shared_core.arrays.positions`, possibly longer; kept in place, not rebuilt per call)."""
        self._sem_sync()
        return self._spos

    def theme_positions(self) -> np.ndarray:
        """The inverse of :meth:`theme_id_array` as of the last :meth:`theme_matrix` (``-1`` for other ids;
        kept in place while themes are only added or changed)."""
        return self._tposa

    def theme_pos(self, t: int) -> int:
        """Row of theme ``t`` in the last :meth:`theme_matrix`, ``-1`` when it has none."""
        return int(self._tposa[t]) if 0 <= t < len(self._tposa) else -1

    def theme_id_array(self) -> np.ndarray:
        """The theme ids of the last :meth:`theme_matrix` as an ``int64`` array (a view)."""
        return self._tid[: len(self._tids)]

    def theme_sizes_cohesions(self) -> tuple[np.ndarray, np.ndarray]:
        """Sizes and cohesions of the themes of the last :meth:`theme_matrix`, float64 ``(T,)`` each
        (views, in the same order)."""
        return self._tsize[: len(self._tids)], self._tcoh[: len(self._tids)]

    def theme_matrix(self) -> tuple[list[int], np.ndarray]:
        """Theme ids ascending and their normalised centroids, float32 ``(T, d)``."""
        ts = self.theme_stats
        assert isinstance(ts, _Themes)
        if not ts:
            ts.dirty, ts.removed = set(), True
            self._tids = []
            self._tposa = np.zeros(0, dtype=np.int64)
            return [], np.zeros((0, 1))
        new = sorted(t for t in ts.dirty if self.theme_pos(t) < 0)
        if ts.removed or self._tbuf is None or (new and self._tids and new[0] < self._tids[-1]):
            ids = sorted(ts)
            mat = normalize_rows(np.stack([ts[t][2] for t in ids]).astype(np.float32))
            self._tids = ids
            self._tbuf = grow(np.empty((0, mat.shape[1]), dtype=np.float32), len(ids), minimum=64)
            self._tbuf[: len(ids)] = mat
            self._tid = np.asarray(ids, dtype=np.int64)
            self._tposa = positions(self._tid)
            self._tsize = np.asarray([ts[t][0] for t in ids], dtype=np.float64)
            self._tcoh = np.asarray([ts[t][1] for t in ids], dtype=np.float64)
        elif ts.dirty:
            self._tid = grow(self._tid, len(self._tids) + len(new), minimum=64)
            if new:
                self._tposa = grow(self._tposa, new[-1] + 1, fill=-1, minimum=64)
            for t in new:
                self._tposa[t] = len(self._tids)
                self._tid[len(self._tids)] = t
                self._tids.append(t)
            self._tbuf = grow(self._tbuf, len(self._tids), minimum=64)
            self._tsize = grow(self._tsize, len(self._tids), minimum=64)
            self._tcoh = grow(self._tcoh, len(self._tids), minimum=64)
            rows = sorted(ts.dirty)
            at = self._tposa[rows]
            self._tbuf[at] = normalize_rows(np.stack([ts[t][2] for t in rows]).astype(np.float32))
            self._tsize[at] = [ts[t][0] for t in rows]
            self._tcoh[at] = [ts[t][1] for t in rows]
        ts.dirty, ts.removed = set(), False
        return self._tids, self._tbuf[: len(self._tids)]

    def sem_searcher(self) -> Search | None:
        """The semantic neighbour search, holding every current semantic, or ``None`` (exhaustive)."""
        n, done = len(self.sem_ids), self._searched_n
        ns = self.sem_search
        used = ns.sync(
            n,
            lambda: (self.sem_id_array(), self.sem_matrix()),
            live=self.sem_id_array()[done:],
            vectors=lambda _: self.sem_matrix()[done:],
        )
        self._searched_n = n
        return ns.search if used else None

    def theme_searcher(self) -> Search | None:
        """The theme neighbour search, holding every current theme centroid, or ``None`` (exhaustive)."""
        tids, tmat = self.theme_matrix()
        ts = self.theme_stats
        assert isinstance(ts, _Themes)
        ns = self.theme_search
        used = ns.sync(
            len(tids),
            lambda: (self.theme_id_array(), tmat),
            gone=sorted(t for t in ts.unsearched if t not in ts),
            live=sorted(t for t in ts.searched if t in ts),
            vectors=lambda live: tmat[self._tposa[live]],
        )
        ts.searched, ts.unsearched = set(), set()
        return ns.search if used else None
