"""The node store shared by every memory: ordered children, parent links, spans, leaf payloads.

The store knows nothing of any algorithm. It offers small mutation methods that are journaled while a
transaction is open, so a failed insertion can be rolled back exactly (``begin`` / ``commit`` /
``rollback``) at a cost proportional to what the insertion touched, not to the size of the tree.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..types import HierMemError, Message, NodeNotFoundError

__all__ = ["SUPERSEDES", "Node", "NodeStore", "TreeInvariantError"]

#: ``Node.data`` key of a leaf that supersedes earlier leaves: their node ids, ascending (a list of ints;
#: see :mod:`shared_core.memories.supersession`)
SUPERSEDES = "supersedes"


class TreeInvariantError(HierMemError, AssertionError):
    """The tree violates a structural invariant (a bug, never a user error)."""


@dataclass
class Node:
    """One node of a memory tree.

    Attributes:
        id: node id (int >= 0, never reused).
        parent: parent id, ``None`` for a root.
        children: ordered child ids (left to right).
        text: the leaf's message text or the internal node's annotation; ``""`` for a structural node
            that carries no text (MemTree's root), which is never indexed or returned.
        span: ``(first, last)`` insertion index (0-based) of the leaves below (a leaf: ``(i, i)``).
        is_leaf: whether the node stores a message.
        message: the stored message (leaves only).
        level: algorithm-defined level (SegTreeMem: 1 for leaves; HAT: layer; xMemory: tier).
        data: algorithm-specific JSON-serialisable extras.
    """

    id: int
    parent: int | None = None
    children: list[int] = field(default_factory=list)
    text: str = ""
    span: tuple[int, int] = (0, 0)
    is_leaf: bool = False
    message: Message | None = None
    level: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> Node:
        return replace(self, children=list(self.children), data=dict(self.data))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent": self.parent,
            "children": list(self.children),
            "text": self.text,
            "span": list(self.span),
            "is_leaf": self.is_leaf,
            "message": self.message.to_dict() if self.message is not None else None,
            "level": self.level,
            "data": copy.deepcopy(self.data),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Node:
        msg = d.get("message")
        return cls(
            id=int(d["id"]),
            parent=None if d["parent"] is None else int(d["parent"]),
            children=[int(c) for c in d["children"]],
            text=str(d["text"]),
            span=(int(d["span"][0]), int(d["span"][1])),
            is_leaf=bool(d["is_leaf"]),
            message=Message.from_dict(msg) if msg is not None else None,
            level=int(d.get("level", 0)),
            data=dict(d.get("data") or {}),
        )


_MISSING = object()


class ChildTexts(Sequence[str]):
    """Read-only view of the texts of a node's children, in child order, without copying them.

    An aggregate function that looks at a few children (e.g. the first and the last) then costs O(1)
    instead of O(branching); one that reads them all iterates the view as it would a list. Slicing
    returns a list. The view is for the duration of one call: it reads the store live.

    Args:
        store: the node store.
        nid: the parent node id.
    """

    def __init__(self, store: NodeStore, nid: int) -> None:
        self._nodes = store.nodes
        self._children = store.nodes[nid].children

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._nodes[c].text for c in self._children[i]]
        return self._nodes[self._children[i]].text

    def __iter__(self) -> Iterator[str]:
        return (self._nodes[c].text for c in self._children)


class NodeStore:
    """Nodes by id, the root, leaves by insertion index and by source id, with an undo journal.

    Every mutation goes through a method here; while a transaction is open each touched node's
    previous state is saved once, so :meth:`rollback` restores the store exactly.
    """

    def __init__(self, contiguous: bool = False) -> None:
        #: every node's leaves are exactly the live leaves with insertion index in its span
        #: (segment trees, HAT); lets leaves_under read a range instead of walking the subtree
        self.contiguous = contiguous
        self.nodes: dict[int, Node] = {}
        self.root: int | None = None
        self.next_id = 0
        self.n_inserted = 0  # leaves ever inserted (insertion index of the next leaf)
        self.leaf_at: dict[int, int] = {}  # insertion index -> leaf id (live leaves only)
        self.by_source: dict[str, list[int]] = {}
        self.source_at: list[str | None] = []  # insertion index -> source id of a live leaf (or None)
        # journal
        self._tx = False
        self._saved: dict[int, Any] = {}
        self._saved_scalars: tuple[int | None, int, int] | None = None
        self._journal: list[tuple[str, Any, Any]] = []
        self.changed: set[int] = set()  # nodes whose text was set or that were created in this tx
        self.removed: set[int] = set()
        # ids created, touched or deleted since the last take_changes(), in or out of a transaction
        # (a rollback adds the ids it restores): what per-node arrays must re-read
        self._since: set[int] = set()

    # ------------------------------------------------------------------ transactions
    def begin(self) -> None:
        if self._tx:
            raise TreeInvariantError("nested transaction")
        self._tx = True
        self._saved = {}
        self._saved_scalars = (self.root, self.next_id, self.n_inserted)
        self._journal = []
        self.changed = set()
        self.removed = set()

    def pending(self) -> tuple[set[int], set[int]]:
        """``(changed, removed)`` node ids of the open transaction (changed excludes removed)."""
        return {i for i in self.changed if i in self.nodes}, {i for i in self.removed if i not in self.nodes}

    def commit(self) -> tuple[set[int], set[int]]:
        """Close the transaction; returns ``(changed, removed)`` node ids (changed excludes removed)."""
        changed, removed = self.pending()
        self._tx = False
        self._saved = {}
        self._journal = []
        self.changed, self.removed = set(), set()
        return changed, removed

    def rollback(self) -> None:
        if not self._tx:
            return
        self._since.update(self._saved)
        for nid, old in self._saved.items():
            if old is _MISSING:
                self.nodes.pop(nid, None)
            else:
                self.nodes[nid] = old
        for op, key, val in reversed(self._journal):
            if op == "leaf_at+":
                self.leaf_at.pop(key, None)
            elif op == "leaf_at-":
                self.leaf_at[key] = val
            elif op == "src+":
                lst = self.by_source.get(key, [])
                if val in lst:
                    lst.remove(val)
                if not lst:
                    self.by_source.pop(key, None)
            elif op == "src-":
                self.by_source.setdefault(key, []).append(val)
            elif op == "srcat+":
                del self.source_at[key:]
            elif op == "srcat-":
                self.source_at[key] = val
            elif op == "kid+":
                del key[val]
            elif op == "kid-":
                key.insert(*val)
        assert self._saved_scalars is not None
        self.root, self.next_id, self.n_inserted = self._saved_scalars
        self._tx = False
        self._saved = {}
        self._journal = []
        self.changed, self.removed = set(), set()

    def note_changes(self, ids: Iterable[int]) -> None:
        """Report nodes changed by direct writes to :attr:`nodes` (e.g. applying another process's
        commits), so :meth:`take_changes` returns them too."""
        self._since.update(ids)

    def take_changes(self) -> set[int]:
        """Ids of the nodes created, changed, deleted or restored since the previous call (then cleared).

        For one consumer that keeps per-node arrays in step with the store
        (:class:`~shared_core.tree.structure.NodeArrays`): re-reading these ids is enough.
        """
        out, self._since = self._since, set()
        return out

    def _touch(self, nid: int) -> Node:
        node = self.get(nid)
        self._since.add(nid)
        if self._tx and nid not in self._saved:
            # the saved state shares the child list: its changes are journaled ("kid+" / "kid-") and
            # undone in place by a rollback, so a node with many children is not copied per transaction
            self._saved[nid] = replace(node, data=dict(node.data))
        return node

    # ------------------------------------------------------------------ reading
    def get(self, nid: int) -> Node:
        try:
            return self.nodes[nid]
        except KeyError:
            raise NodeNotFoundError(f"No node with id {nid}.") from None

    def __contains__(self, nid: object) -> bool:
        return nid in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def leaves(self) -> list[int]:
        """Live leaf ids in insertion order."""
        return [self.leaf_at[i] for i in sorted(self.leaf_at)]

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_at)

    def depth(self, nid: int) -> int:
        """Distance from the root (root = 0)."""
        d = 0
        p = self.get(nid).parent
        while p is not None:
            d += 1
            p = self.nodes[p].parent
        return d

    def ancestors(self, nid: int) -> list[int]:
        """Ancestor ids from the parent up to the root."""
        out = []
        p = self.get(nid).parent
        while p is not None:
            out.append(p)
            p = self.nodes[p].parent
        return out

    def iter_subtree(self, nid: int) -> Iterator[Node]:
        """Nodes of the subtree rooted at ``nid``, breadth first."""
        q = deque([nid])
        while q:
            n = self.nodes[q.popleft()]
            yield n
            q.extend(n.children)

    def leaves_under(self, nid: int) -> list[int]:
        """Leaf ids under ``nid`` in insertion order."""
        node = self.get(nid)
        if node.is_leaf:
            return [nid]
        if self.contiguous:
            at = self.leaf_at
            return [at[i] for i in range(node.span[0], node.span[1] + 1) if i in at]
        ids = [n.id for n in self.iter_subtree(nid) if n.is_leaf]
        ids.sort(key=lambda i: self.nodes[i].span[0])
        return ids

    def source_ids_under(self, nid: int, limit: int | None = None) -> list[str]:
        """Distinct caller ids of the leaves under ``nid`` in insertion order (at most ``limit``)."""
        node = self.get(nid)
        if self.contiguous or node.is_leaf:
            ids = dict.fromkeys(s for s in self.source_at[node.span[0] : node.span[1] + 1] if s is not None)
            return list(ids)[:limit] if limit is not None else list(ids)
        seen: dict[str, None] = {}
        for lid in self.leaves_under(nid):
            msg = self.nodes[lid].message
            if msg is not None and msg.id is not None:
                seen.setdefault(msg.id, None)
                if limit is not None and len(seen) >= limit:
                    break
        return list(seen)

    def depths(self) -> dict[int, int]:
        """Depth of every node reachable from the root (one pass)."""
        out: dict[int, int] = {}
        if self.root is None:
            return out
        q = deque([(self.root, 0)])
        while q:
            nid, d = q.popleft()
            out[nid] = d
            q.extend((c, d + 1) for c in self.nodes[nid].children)
        return out

    # ------------------------------------------------------------------ writing
    def new_node(
        self,
        *,
        text: str = "",
        is_leaf: bool = False,
        message: Message | None = None,
        level: int = 0,
        span: tuple[int, int] | None = None,
        data: dict[str, Any] | None = None,
    ) -> Node:
        """Create a detached node. A leaf gets the next insertion index as its span."""
        nid = self.next_id
        self.next_id += 1
        if is_leaf:
            idx = self.n_inserted
            self.n_inserted += 1
            span = (idx, idx)
            self.leaf_at[idx] = nid
            self._journal.append(("leaf_at+", idx, nid))
            self.source_at.append(message.id if message is not None else None)
            self._journal.append(("srcat+", idx, None))
            if message is not None and message.id is not None:
                self.by_source.setdefault(message.id, []).append(nid)
                self._journal.append(("src+", message.id, nid))
        node = Node(
            id=nid,
            text=text,
            is_leaf=is_leaf,
            message=message,
            level=level,
            span=span or (0, 0),
            data=data or {},
        )
        if self._tx:
            self._saved[nid] = _MISSING
        self.nodes[nid] = node
        self._since.add(nid)
        self.changed.add(nid)
        return node

    def set_text(self, nid: int, text: str) -> None:
        node = self._touch(nid)
        if node.text != text:
            node.text = text
            self.changed.add(nid)

    def set_span(self, nid: int, span: tuple[int, int]) -> None:
        self._touch(nid).span = span

    def set_level(self, nid: int, level: int) -> None:
        self._touch(nid).level = level

    def set_data(self, nid: int, key: str, value: Any) -> None:
        self._touch(nid).data[key] = value

    def set_root(self, nid: int | None) -> None:
        if nid is not None:
            self._touch(nid).parent = None
        self.root = nid

    def add_child(self, parent: int, child: int, index: int | None = None) -> None:
        """Attach ``child`` (detached) under ``parent`` at ``index`` (default: rightmost)."""
        p = self._touch(parent)
        c = self._touch(child)
        if c.parent is not None:
            raise TreeInvariantError(f"node {child} already has parent {c.parent}")
        if index is None:
            p.children.append(child)
        else:
            p.children.insert(index, child)
        if self._tx:
            self._journal.append(("kid+", p.children, len(p.children) - 1 if index is None else index))
        c.parent = parent

    def detach(self, child: int) -> None:
        """Remove ``child`` from its parent's children (the child subtree stays in the store)."""
        c = self._touch(child)
        if c.parent is not None:
            p = self._touch(c.parent)
            kids = p.children
            for i in range(len(kids) - 1, max(len(kids) - 9, -1), -1):  # recent children sit at the end
                if kids[i] == child:
                    break
            else:
                i = kids.index(child)
            del kids[i]
            if self._tx:
                self._journal.append(("kid-", kids, (i, child)))
            c.parent = None

    def delete_node(self, nid: int) -> None:
        """Delete one detached node with no children."""
        node = self._touch(nid)
        if node.children or node.parent is not None:
            raise TreeInvariantError(f"node {nid} must be detached and childless to be deleted")
        if node.is_leaf:
            idx = node.span[0]
            if self.leaf_at.get(idx) == nid:
                del self.leaf_at[idx]
                self._journal.append(("leaf_at-", idx, nid))
                self._journal.append(("srcat-", idx, self.source_at[idx]))
                self.source_at[idx] = None
            if node.message is not None and node.message.id is not None:
                lst = self.by_source.get(node.message.id, [])
                if nid in lst:
                    lst.remove(nid)
                    self._journal.append(("src-", node.message.id, nid))
                if not lst:
                    self.by_source.pop(node.message.id, None)
        del self.nodes[nid]
        if self.root == nid:
            self.root = None
        self.removed.add(nid)
        self.changed.discard(nid)

    def refresh_span(self, nid: int, ordered: bool = False) -> tuple[int, int]:
        """Set an internal node's span to (min first, max last) over its children; returns it.

        With ``ordered=True`` the children are known to be in insertion order (segment trees), so only
        the first and the last child are read: O(1) instead of O(children).
        """
        node = self._touch(nid)
        if node.children:
            if ordered:
                node.span = (self.nodes[node.children[0]].span[0], self.nodes[node.children[-1]].span[1])
            else:
                spans = [self.nodes[c].span for c in node.children]
                node.span = (min(s[0] for s in spans), max(s[1] for s in spans))
        return node.span

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "next_id": self.next_id,
            "n_inserted": self.n_inserted,
            "nodes": [self.nodes[i].to_dict() for i in sorted(self.nodes)],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], contiguous: bool = False) -> NodeStore:
        s = cls(contiguous)
        s.root = None if d["root"] is None else int(d["root"])
        s.next_id = int(d["next_id"])
        s.n_inserted = int(d["n_inserted"])
        s.source_at = [None] * s.n_inserted
        for nd in d["nodes"]:
            n = Node.from_dict(nd)
            s.nodes[n.id] = n
            if n.is_leaf:
                if not 0 <= n.span[0] < s.n_inserted:
                    raise TreeInvariantError(f"leaf {n.id} has an insertion index outside the tree")
                s.leaf_at[n.span[0]] = n.id
                s.source_at[n.span[0]] = n.message.id if n.message is not None else None
                if n.message is not None and n.message.id is not None:
                    s.by_source.setdefault(n.message.id, []).append(n.id)
        s.check_links()
        return s

    def check_links(self) -> None:
        """Check parent/child links are mutual, ids are known and the root has no parent.

        Raises:
            TreeInvariantError: a link is broken.
        """
        for n in self.nodes.values():
            for c in n.children:
                if c not in self.nodes or self.nodes[c].parent != n.id:
                    raise TreeInvariantError(f"child link {n.id}->{c} is broken")
            if n.parent is not None and (
                n.parent not in self.nodes or n.id not in self.nodes[n.parent].children
            ):
                raise TreeInvariantError(f"parent link {n.id}->{n.parent} is broken")
            if n.is_leaf and n.children:
                raise TreeInvariantError(f"leaf {n.id} has children")
        if self.root is not None and (
            self.root not in self.nodes or self.nodes[self.root].parent is not None
        ):
            raise TreeInvariantError("root is unknown or has a parent")
        if self.nodes and self.root is not None:
            reach = sum(1 for _ in self.iter_subtree(self.root))
            if reach != len(self.nodes):
                raise TreeInvariantError(f"{len(self.nodes) - reach} nodes are not reachable from the root")
