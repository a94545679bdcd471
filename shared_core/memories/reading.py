"""Consistent reads of a memory for the code above it (adapters, viewers): its size, shape and cost
(:meth:`Reading.stats`, ``len``), which sources it holds, and :meth:`Reading.tree_view`.

A mixin of :class:`~shared_core.memories.base.HierarchicalMemory`. The view is taken under the memory's
lock after catching up with a shared store, and holds copies: it stays as it was while the memory changes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..types import Message, Usage

if TYPE_CHECKING:
    from ..tree.nodes import NodeStore

__all__ = ["NodeView", "Reading", "TreeView"]


@dataclass(frozen=True)
class NodeView:
    """One node of a :class:`TreeView`.

    Attributes:
        id: the node id (``Hit.node_id``). parent: its parent's id, ``None`` for a root.
        children: the children's ids, left to right.
        is_leaf: whether the node stores a message. text: the message (as stored) or the summary.
        span: ``(first, last)`` insertion index of the leaves below. level: the memory's ``Node.level``.
        message: a copy of the stored message (leaves only), else ``None``.
    """

    id: int
    parent: int | None
    children: tuple[int, ...]
    is_leaf: bool
    text: str
    span: tuple[int, int]
    level: int
    message: Message | None

    @property
    def source_id(self) -> str | None:
        """The caller's id of a leaf's message (``Message.id``), else ``None``."""
        return self.message.id if self.message is not None else None


@dataclass(frozen=True)
class TreeView:
    """A memory's tree as it was when :meth:`Reading.tree_view` was called.

    Attributes:
        kind: the memory's kind. root: the root's id (``None`` when empty).
        nodes: every node by id, in id order.
        leaves: the leaves' ids in insertion order.
        by_source: leaf ids by the caller's source id (``Message.id``), in insertion order.
    """

    kind: str
    root: int | None
    nodes: Mapping[int, NodeView]
    leaves: tuple[int, ...]
    by_source: Mapping[str, tuple[int, ...]]


class Reading:
    """Mixin: consistent, copied reads of the tree (see the module)."""

    # set by HierarchicalMemory.__init__
    kind: str
    _lock: threading.RLock
    _store: NodeStore
    _usage: Usage
    _query_usage: Usage

    if TYPE_CHECKING:

        def _sync_store(self) -> None: ...

        def _extra_stats(self) -> dict[str, Any]: ...

    def __len__(self) -> int:
        """Number of stored messages (leaves), after catching up with a shared store (see :meth:`refresh`)."""
        with self._lock:
            self._sync_store()
            return self._store.n_leaves

    def stored_sources(self, ids: Iterable[str]) -> set[str]:
        """Which of the caller's source ids (``Message.id``) the memory holds a message of, after catching
        up with a shared store (see :meth:`refresh`).

        Args:
            ids: source ids to look up.

        Returns:
            The subset of ``ids`` stored (an empty set when none is).

        Raises:
            PersistenceError: a shared store cannot be read (the memory is unchanged).
        """
        with self._lock:
            self._sync_store()
            known = self._store.by_source
            return {i for i in ids if i in known}

    @property
    def usage(self) -> Usage:
        """Cumulative model usage of construction (adds and deletes)."""
        return self._usage.copy()

    def stats(self) -> dict[str, Any]:
        """Shape and cost figures.

        Returns:
            dict with ``nodes``, ``leaves`` (ints), ``max_depth``, ``mean_depth`` (over leaves),
            ``mean_branching`` (children per internal node), ``internal_nodes``, ``usage`` (cumulative
            construction usage), ``query_usage``, plus algorithm-specific figures; read after catching
            up with a shared store (see :meth:`refresh`).
        """
        with self._lock:
            self._sync_store()
            st = self._store
            depths = st.depths()
            leaf_depths = [depths[i] for i in st.leaf_at.values() if i in depths]
            internal = [n for n in st.nodes.values() if not n.is_leaf]
            out: dict[str, Any] = {
                "kind": self.kind,
                "nodes": len(st.nodes),
                "leaves": st.n_leaves,
                "internal_nodes": len(internal),
                "max_depth": max(depths.values(), default=0),
                "mean_depth": float(np.mean(leaf_depths)) if leaf_depths else 0.0,
                "mean_branching": float(np.mean([len(n.children) for n in internal])) if internal else 0.0,
                "usage": self._usage.to_dict(),
                "query_usage": self._query_usage.to_dict(),
            }
            out.update(self._extra_stats())
            return out

    def tree_view(self) -> TreeView:
        """The tree as it is now: nodes, links, texts and messages, copied, after catching up with a shared
        store.

        Returns:
            A :class:`TreeView` (O(nodes) to build; it does not change when the memory does).

        Raises:
            PersistenceError: a shared store cannot be read (the memory is unchanged).
        """
        with self._lock:
            self._sync_store()
            st = self._store
            nodes = {
                nid: NodeView(
                    id=nid,
                    parent=n.parent,
                    children=tuple(n.children),
                    is_leaf=n.is_leaf,
                    text=n.text,
                    span=n.span,
                    level=n.level,
                    message=None if n.message is None else Message.from_dict(n.message.to_dict()),
                )
                for nid, n in sorted(st.nodes.items())
            }
            return TreeView(
                kind=self.kind,
                root=st.root,
                nodes=nodes,
                leaves=tuple(st.leaves()),
                by_source={k: tuple(v) for k, v in st.by_source.items()},
            )
