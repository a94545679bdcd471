"""MemTree's routing cache: each parent's children's vectors as one matrix, kept in step with commits.

An insertion descends from the root, comparing the new message with every child of the node it is at.
Gathering those children's vectors from the index at every step costs O(children) row copies; the
:class:`RouteCache` mixin keeps, per routed-through parent, a contiguous matrix of its children's
indexed vectors, refreshed row by row from the vectors each commit writes (the
:meth:`~shared_core.memories.base.HierarchicalMemory._vectors_written` hook), so a step costs O(children
changed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import grow, lookup

if TYPE_CHECKING:
    from ..search.index import NodeIndex
    from ..tree.nodes import NodeStore

__all__ = ["RouteCache"]

_ROUTE_CACHE = 4096  # parents whose child matrices are kept (cleared when full)
_PATCH_MAX = 8  # changed child positions patched in place; more: the matrix is read anew
_VEC_LOG = 256  # commits remembered for catching a child matrix up; older ones are read anew
_WALK_MAX = 16  # a route this many commits behind scans its children's last writes instead of the log


@dataclass
class _Route:
    """A parent's children (in order), their rows and their indexed vectors as one matrix, as of commit
    ``commit`` of the memory's index ``index``."""

    children: list[int]
    pos: dict[int, int]
    mat: np.ndarray
    commit: int
    index: Any
    kids: np.ndarray  # ``children`` as int64, with spare capacity at the end


class RouteCache:
    """Mixin of :class:`~shared_core.memories.memtree.MemTree`: cached child matrices for routing."""

    _store: NodeStore
    _index: NodeIndex | None
    _pending: dict[int, tuple[str, np.ndarray]]

    if TYPE_CHECKING:

        def _vectors(self, nids: Any) -> np.ndarray: ...

    def _init_routes(self) -> None:
        self._routes: dict[int, _Route] = {}  # parent id -> its children's vectors, for routing
        self._vec_log: list[tuple[int, list[int]]] = []  # (commit number, ids whose vectors it wrote)
        self._commits = 0
        self._log_floor = 0  # the newest commit dropped from the log
        self._written_at = np.full(0, -1, dtype=np.int64)  # node id -> the last commit that wrote it

    def _child_vectors(self, parent: int, ids: list[int]) -> np.ndarray:
        """Vectors of ``parent``'s children ``ids``, for routing.

        Each routed-through parent keeps its children's indexed vectors as one contiguous matrix
        (:class:`_Route`), read from the index once and then refreshed row by row as commits rewrite
        those children's vectors (:meth:`_vectors_written`). Children changed in the open transaction
        are read as :meth:`_vectors` reads them. Costs O(children changed) per step instead of a
        gather of every child's vector from the index.
        """
        st = self._store
        route = self._route(parent, ids)
        if route is None:
            return self._vectors(ids)
        tx = st.changed, self._pending
        if len(st.changed) + len(self._pending) <= len(ids):
            moved = [i for i in dict.fromkeys((*st.changed, *self._pending)) if i in route.pos]
        else:
            moved = [i for i in ids if i in tx[0] or i in tx[1]]
        if not moved:
            return route.mat
        mat = route.mat.copy()
        mat[[route.pos[i] for i in moved]] = self._vectors(moved)
        return mat

    def _route(self, parent: int, ids: list[int]) -> _Route | None:
        """The parent's cached child matrix, caught up with the commits since it was read, or ``None``
        when it cannot be read from the index now (a child is new in the open transaction)."""
        index = self._index
        if index is None:
            return None
        route = self._routes.get(parent)
        if route is not None and route.index is not index:
            route = None
        if route is not None and route.children != ids:
            self._patch_children(route, ids, index)
        if route is not None and route.children == ids:
            if route.commit == self._commits:
                return route
            rows: list[tuple[int, int]] = []
            far = self._commits - route.commit > _WALK_MAX
            if far:  # long ago: ask each child when it was written
                kids = route.kids[: len(route.children)]
                late = np.flatnonzero(lookup(self._written_at, kids, -1) > route.commit).tolist()
                rows = [(j, route.children[j]) for j in late]
            else:
                for commit, written in reversed(self._vec_log):  # newest first, back to the route's commit
                    if commit <= route.commit:
                        break
                    rows.extend((route.pos[i], i) for i in written if i in route.pos)
            # every commit since is in the log (or in the per-node record), every rewritten child indexed
            if (far or self._log_floor <= route.commit) and all(i in index for _, i in rows):
                if rows:
                    route.mat[[r for r, _ in rows]] = index.get([i for _, i in rows])
                route.commit = self._commits
                return route
        if any(i not in index for i in ids):
            return None
        if len(self._routes) >= _ROUTE_CACHE:
            self._routes.clear()
        kids = np.asarray(ids, dtype=np.int64)
        route = _Route(
            list(ids), {c: j for j, c in enumerate(ids)}, index.get(ids), self._commits, index, kids
        )
        self._routes[parent] = route
        return route

    @staticmethod
    def _patch_children(route: _Route, ids: list[int], index: NodeIndex) -> None:
        """Bring a route's child list to ``ids`` in place when few positions changed (an attach appends a
        child, an expansion replaces one); otherwise leave it to be read anew."""
        old = route.children
        if len(ids) < len(old):
            return
        n = len(old)
        if ids[:n] == old:  # children appended
            changed = list(range(n, len(ids)))
        else:
            diff = np.flatnonzero(np.asarray(old, dtype=np.int64) != np.asarray(ids[:n], dtype=np.int64))
            changed = diff.tolist() + list(range(n, len(ids)))
        if len(changed) > _PATCH_MAX or not all(ids[j] in index for j in changed):
            return
        route.mat = grow(route.mat, len(ids))[: len(ids)]
        route.mat[changed] = index.get([ids[j] for j in changed])
        route.kids = grow(route.kids, len(ids))
        route.kids[changed] = [ids[j] for j in changed]
        for j in changed:
            if j < len(old) and route.pos.get(old[j]) == j:
                del route.pos[old[j]]
        route.pos.update({ids[j]: j for j in changed})
        route.children = list(ids)

    def _vectors_written(self, ids: set[int]) -> None:
        super()._vectors_written(ids)  # type: ignore[misc]
        self._commits += 1
        if ids:
            arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
            self._written_at = grow(self._written_at, int(arr.max()) + 1, fill=-1)
            self._written_at[arr] = self._commits
            self._vec_log.append((self._commits, list(ids)))
            if len(self._vec_log) > _VEC_LOG:
                self._log_floor = self._vec_log.pop(0)[0]
