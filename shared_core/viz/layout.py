"""The layout both pictures draw: a row per depth (xMemory: per tier), leaves at their insertion rank.

It reads only :meth:`HierarchicalMemory.to_dict`, so it works for every memory kind and for a memory
loaded from a save.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory

__all__ = ["LANE_OFFSETS", "LayoutNode", "TreeLayout", "anchor", "mark_lanes", "runs", "tree_layout"]

#: xMemory tiers, top row first (``Node.level`` values of :mod:`shared_core.memories.xmemory`).
_XMEMORY_ROWS: dict[int, str] = {3: "theme", 2: "semantic", 1: "episode", 0: "message"}


@dataclass
class LayoutNode:
    """One drawable (text-bearing) node of a tree layout.

    Attributes:
        id: node id.
        row: row index from the top (0 = the highest drawn row).
        depth: depth below the root (root = 0).
        span: ``(first, last)`` insertion index of the leaves below.
        ranks: positions (0-based, among the live leaves in insertion order) of the leaves below, sorted.
        is_leaf: whether the node stores a message.
        children: number of children.
        level: the memory's ``Node.level``.
        level_name: the row's name (``"depth 2"``; xMemory: ``"theme"``, ``"semantic"``, ...).
        group: colour group: the xMemory theme the node belongs to (node id), else ``None``.
        text: the node's text.
        source: the caller id of a leaf's message, else ``None``.
    """

    id: int
    row: int
    depth: int
    span: tuple[int, int]
    ranks: list[int]
    is_leaf: bool
    children: int
    level: int
    level_name: str
    group: int | None
    text: str
    source: str | None


@dataclass
class TreeLayout:
    """Rows and leaf positions of a memory's tree (see :func:`tree_layout`).

    Attributes:
        kind: the memory's kind (``"segtree"``, ``"memtree"``, ``"hat"``, ``"xmemory"``).
        nodes: the text-bearing nodes, top rows first.
        row_names: name of each row, top first.
        n_leaves: live leaves.
        leaf_timestamps: the leaves' timestamps (raw strings or ``None``) in insertion order.
        groups: xMemory theme ids in order of first appearance (empty for other kinds).
    """

    kind: str
    nodes: list[LayoutNode] = field(default_factory=list)
    row_names: list[str] = field(default_factory=list)
    n_leaves: int = 0
    leaf_timestamps: list[str | None] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)


def tree_layout(memory: HierarchicalMemory | dict[str, Any]) -> TreeLayout:
    """Lay out a memory's tree for drawing: a row per depth (xMemory: per tier), leaves by insertion rank.

    Structural nodes (empty text, e.g. MemTree's and xMemory's roots) are left out, and so are rows that
    would hold none of the drawn nodes.

    Args:
        memory: a hiermem memory, or its :meth:`~shared_core.memories.base.HierarchicalMemory.to_dict` output.

    Returns:
        The :class:`TreeLayout`.

    References:
        Node store shape: ``shared_core.tree.nodes.NodeStore.to_dict``; xMemory tiers: xMemory paper Sec. 3.1.
    """
    data = memory if isinstance(memory, dict) else memory.to_dict()
    kind = str(data.get("kind", "memory"))
    tree = data["tree"]
    nodes = {int(n["id"]): n for n in tree["nodes"]}
    out = TreeLayout(kind=kind)
    root = tree.get("root")
    if root is None or root not in nodes:
        return out
    # depth and leaves below every node (iterative post-order: trees may be thousands of levels deep)
    depth: dict[int, int] = {root: 0}
    order: list[int] = []
    stack = [root]
    while stack:
        nid = stack.pop()
        order.append(nid)
        for c in nodes[nid]["children"]:
            depth[c] = depth[nid] + 1
            stack.append(c)
    leaf_spans = sorted(int(nodes[i]["span"][0]) for i in order if nodes[i]["is_leaf"])
    rank = {s: j for j, s in enumerate(leaf_spans)}
    below: dict[int, list[int]] = {}
    for nid in reversed(order):
        n = nodes[nid]
        if n["is_leaf"]:
            below[nid] = [rank[int(n["span"][0])]]
        else:
            acc: list[int] = []
            for c in n["children"]:
                acc.extend(below[c])
            below[nid] = sorted(acc)
    leaf_by_rank = {rank[int(nodes[i]["span"][0])]: i for i in order if nodes[i]["is_leaf"]}
    out.n_leaves = len(leaf_spans)
    out.leaf_timestamps = [
        ((nodes[leaf_by_rank[j]].get("message") or {}).get("timestamp")) for j in range(out.n_leaves)
    ]
    xmem = kind == "xmemory"
    group: dict[int, int | None] = {}
    if xmem:
        for nid in order:  # parents come before children in this order
            n = nodes[nid]
            parent = n["parent"]
            if int(n.get("level", -1)) == 3:
                group[nid] = nid
                out.groups.append(nid)
            else:
                group[nid] = group.get(parent) if parent is not None else None
    drawn = [nid for nid in order if nodes[nid]["text"]]
    if xmem:
        levels = sorted({int(nodes[i].get("level", 0)) for i in drawn}, reverse=True)
        names = {lv: _XMEMORY_ROWS.get(lv, f"level {lv}") for lv in levels}
        row_of = {lv: r for r, lv in enumerate(levels)}
        out.row_names = [names[lv] for lv in levels]
    else:
        depths = sorted({depth[i] for i in drawn})
        row_of = {d: r for r, d in enumerate(depths)}
        out.row_names = [f"depth {d}" for d in depths]
    for nid in sorted(drawn, key=lambda i: (depth[i], nodes[i]["span"][0], i)):
        n = nodes[nid]
        level = int(n.get("level", 0))
        key = level if xmem else depth[nid]
        out.nodes.append(
            LayoutNode(
                id=nid,
                row=row_of[key],
                depth=depth[nid],
                span=(int(n["span"][0]), int(n["span"][1])),
                ranks=below[nid],
                is_leaf=bool(n["is_leaf"]),
                children=len(n["children"]),
                level=level,
                level_name=out.row_names[row_of[key]],
                group=group.get(nid) if xmem else None,
                text=str(n["text"]),
                source=(n.get("message") or {}).get("id"),
            )
        )
    out.nodes.sort(key=lambda ln: (ln.row, ln.ranks[0] if ln.ranks else 0, ln.id))
    return out


def runs(ranks: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive integers in a sorted list, as ``(first, last)``."""
    out: list[tuple[int, int]] = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1] = (out[-1][0], r)
        elif not out or r > out[-1][1]:
            out.append((r, r))
    return out


def anchor(ranks: list[int], rank: int) -> tuple[int, int]:
    """The run of ``ranks`` (see :func:`runs`) that holds ``rank``, else the first run; ``(0, 0)`` when empty.

    Where a node is drawn for a leaf below it: a node whose leaves are scattered has one bar per run,
    and the path to a hit passes through the bar over the hit's leaves.
    """
    parts = runs(ranks)
    for a, b in parts:
        if a <= rank <= b:
            return a, b
    return parts[0] if parts else (0, 0)


#: vertical offset of each mark lane, in lane steps from the bar's middle (lane 0 in the middle)
LANE_OFFSETS = (0, -1, 1, -2, 2)


def mark_lanes(marks: list[tuple[int, float]], gap: float) -> list[int]:
    """A lane (index into :data:`LANE_OFFSETS`) for each mark ``(row, x)``, so that marks on one row
    closer than ``gap`` (in x units) sit at different heights instead of on top of one another.

    Marks are placed left to right (ties by input order), each in the first lane whose last mark on its
    row is at least ``gap`` to its left; when every lane is taken, the lane whose last mark is furthest
    left. Deterministic: the same marks give the same lanes.

    Returns:
        One lane index per mark, in input order.
    """
    last: dict[tuple[int, int], float] = {}
    out = [0] * len(marks)
    for i in sorted(range(len(marks)), key=lambda j: (marks[j][0], marks[j][1], j)):
        row, x = marks[i]
        free = [n for n in range(len(LANE_OFFSETS)) if (row, n) not in last or x - last[row, n] >= gap]
        lane = free[0] if free else min(range(len(LANE_OFFSETS)), key=lambda n: (last[row, n], n))
        last[row, lane] = x
        out[i] = lane
    return out
