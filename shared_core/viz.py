"""Pictures of memory trees: a PNG of the tree's shape (matplotlib, headless) and a self-contained HTML page.

Both read only :meth:`HierarchicalMemory.to_dict`, so they work for every memory kind and for a memory
loaded from a save. Rows are depths below the root, except for xMemory, whose rows are its four tiers
(theme, semantic, episode, message) and whose nodes are coloured by the theme they belong to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .types import InvalidInputError, parse_timestamp

if TYPE_CHECKING:
    from .memories.base import HierarchicalMemory

__all__ = ["parse_timestamp", "plot_tree_shape", "render_html", "tree_layout"]

#: xMemory tiers, top row first (``Node.level`` values of :mod:`shared_core.memories.xmemory`).
_XMEMORY_ROWS: dict[int, str] = {3: "theme", 2: "semantic", 1: "episode", 0: "message"}
_X_AXES = ("index", "time")


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


def _runs(ranks: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive integers in a sorted list, as ``(first, last)``."""
    out: list[tuple[int, int]] = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1] = (out[-1][0], r)
        elif not out or r > out[-1][1]:
            out.append((r, r))
    return out


def plot_tree_shape(
    memory: HierarchicalMemory,
    path: str | Path,
    title: str | None = None,
    *,
    x: str = "index",
    dpi: int = 110,
) -> Path:
    """Draw every node as bars over the leaves below it (x) on its row (y): the tree's segmentation.

    Leaves sit on the bottom row. A node whose leaves are contiguous (SegTreeMem, HAT) is one bar over
    its span; a node whose leaves are scattered (MemTree's semantic clusters, xMemory's themes) is one
    bar per run of consecutive leaves, so the picture shows which parts of the conversation it gathers.
    Single-child chain nodes are drawn lighter. Rows are depths below the root; for xMemory they are the
    tiers theme / semantic / episode / message, and every node takes the colour of its theme (grey: not
    under a theme yet, e.g. the open episode).

    Args:
        memory: any hiermem memory.
        path: PNG file to write (parent directories are created).
        title: figure title (default: the memory's class and size).
        x: ``"index"`` (default): leaves at their insertion rank; ``"time"``: leaves at their messages'
            timestamps (see :func:`parse_timestamp`), so spans are drawn on a time axis; a leaf without a
            readable timestamp takes the previous leaf's time.
        dpi: resolution of the PNG in dots per inch, default 110.

    Returns:
        The PNG path.

    Raises:
        InvalidInputError: ``x`` is not ``"index"`` or ``"time"``, or ``x="time"`` and no leaf has a
            readable timestamp.

    References:
        SegTreeMem paper Sec. 4.1 (interval nodes); xMemory paper Sec. 3.1 (hierarchy of themes).
    """
    if x not in _X_AXES:
        raise InvalidInputError(f"x must be one of {_X_AXES}, got {x!r}.")
    # the object-oriented API without pyplot: no backend is selected or changed (safe in notebooks,
    # threads and headless servers)
    import matplotlib
    import matplotlib.dates as mdates
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lay = tree_layout(memory)
    n_rows = max(1, len(lay.row_names))
    n_leaves = lay.n_leaves

    # x coordinate of each leaf rank, and a minimal bar width
    if x == "time":
        times: list[datetime | None] = [parse_timestamp(t) for t in lay.leaf_timestamps]
        if n_leaves and all(t is None for t in times):
            raise InvalidInputError(
                "x='time' needs message timestamps, and no leaf has a readable one "
                "(ISO 8601 or LoCoMo's '1:56 pm on 8 May, 2023'); use x='index'."
            )
        first = next((t for t in times if t is not None), None)
        filled: list[float] = []
        last = first
        for t in times:
            last = t or last
            filled.append(float(mdates.date2num(last)))
        lo, hi = (min(filled), max(filled)) if filled else (0.0, 1.0)
        width = max((hi - lo) / max(200, 4 * n_leaves), 1.0 / (24 * 60))
        xs = filled
    else:
        xs = [float(i) for i in range(n_leaves)]
        width = 0.9
        lo, hi = -0.5, max(0.5, n_leaves - 0.5)

    fig_w = min(18.0, 6.0 + n_leaves / 40.0)
    fig = Figure(figsize=(fig_w, 1.3 + 0.5 * n_rows))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"]
    theme_cmap = matplotlib.colormaps["tab20"]
    theme_color = {g: theme_cmap(i % 20) for i, g in enumerate(lay.groups)}
    for ln in lay.nodes:
        if not ln.ranks:
            continue
        if lay.kind == "xmemory":
            color = theme_color.get(ln.group, (0.6, 0.6, 0.6, 1.0)) if ln.group is not None else "0.6"
        else:
            color = cmap(ln.row / max(1, n_rows - 1))
        chain = not ln.is_leaf and ln.children == 1
        bars = [(xs[a] - width / 2, xs[b] - xs[a] + width) for a, b in _runs(ln.ranks)]
        ax.broken_barh(
            bars,
            (-ln.row - 0.4, 0.8),
            facecolors=color,
            alpha=0.3 if chain else 0.85,
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks([-r for r in range(n_rows)])
    ax.set_yticklabels(lay.row_names or ["(empty)"])
    ax.set_ylim(-n_rows + 0.4, 0.6)
    if x == "time":
        ax.xaxis_date()
        ax.set_xlabel("message time")
        ax.set_xlim(lo - width, hi + width)
        fig.autofmt_xdate()
    else:
        ax.set_xlabel("leaf (message) insertion rank")
        ax.set_xlim(lo - 0.5, hi + 0.5)
    if title is None:
        s = memory.stats()
        title = f"{type(memory).__name__}: {s['leaves']} leaves, {s['nodes']} nodes, depth {s['max_depth']}"
        if lay.kind == "xmemory":
            title += f", {len(lay.groups)} themes"
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }}
#tree {{ flex: 3; overflow: auto; border-right: 1px solid #ccc; }}
#panel {{ flex: 1; padding: 1em; overflow: auto; min-width: 18em; }}
rect.node {{ cursor: pointer; stroke: #fff; stroke-width: 0.5; }}
rect.node.selected {{ stroke: #d00; stroke-width: 2; }}
text.row {{ font-size: 11px; fill: #555; }}
#text {{ white-space: pre-wrap; }}
.meta {{ color: #555; font-size: 0.9em; }}
</style></head>
<body>
<div id="tree"><svg id="svg" xmlns="http://www.w3.org/2000/svg"></svg></div>
<div id="panel"><h3 id="heading">{title}</h3><p class="meta" id="query">{query_line}</p>
<p class="meta">Click a node to see its text, span and score.</p>
<div class="meta" id="info"></div><div id="text"></div></div>
<script id="data" type="application/json">{data}</script>
<script>
(function () {{
  const data = JSON.parse(document.getElementById("data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.getElementById("svg");
  const W = Math.max(800, data.leaves * 6), rowH = 34, pad = 20, left = 70;
  const rows = Math.max(1, data.rows.length);
  svg.setAttribute("width", W + left + pad);
  svg.setAttribute("height", rows * rowH + 2 * pad);
  const unit = W / Math.max(1, data.leaves);
  const maxScore = Math.max(1e-12, ...data.nodes.map(n => n.score || 0));
  data.rows.forEach((name, i) => {{
    const t = document.createElementNS(NS, "text");
    t.setAttribute("class", "row");
    t.setAttribute("x", 4);
    t.setAttribute("y", pad + i * rowH + rowH / 2);
    t.textContent = name;
    svg.appendChild(t);
  }});
  let selected = null;
  for (const n of data.nodes) {{
    const r = document.createElementNS(NS, "rect");
    r.setAttribute("class", "node");
    r.setAttribute("id", "node-" + n.id);
    r.setAttribute("x", left + n.x0 * unit);
    r.setAttribute("y", pad + n.row * rowH);
    r.setAttribute("width", Math.max(2, (n.x1 - n.x0 + 1) * unit - 1));
    r.setAttribute("height", rowH - 6);
    const s = (n.score || 0) / maxScore;
    const plain = n.is_leaf ? "#4a90d9" : "#7fb77e";
    r.setAttribute("fill", data.has_scores ? `rgba(200, 40, 40, ${{0.15 + 0.85 * s}})` : plain);
    const t = document.createElementNS(NS, "title");
    t.textContent = n.text.slice(0, 120);
    r.appendChild(t);
    r.addEventListener("click", () => {{
      if (selected) selected.classList.remove("selected");
      selected = r; r.classList.add("selected");
      document.getElementById("info").textContent =
        `node ${{n.id}} · ${{n.row_name}} · span [${{n.span[0]}}, ${{n.span[1]}}] · ` +
        (n.is_leaf ? "leaf" : `${{n.children}} children, ${{n.leaves}} leaves`) +
        (data.has_scores ? ` · score ${{(n.score || 0).toFixed(4)}}` : "") +
        (n.source ? ` · source ${{n.source}}` : "");
      document.getElementById("text").textContent = n.text;
    }});
    svg.appendChild(r);
  }}
}})();
</script></body></html>
"""


def _script_safe_json(payload: Any) -> str:
    """JSON for a ``<script type="application/json">`` element: no ``<``, ``>`` or ``&`` appear raw."""
    import json

    text = json.dumps(payload, ensure_ascii=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def render_html(
    memory: HierarchicalMemory, path: str | Path, query: str | None = None, title: str | None = None
) -> Path:
    """Write a single self-contained HTML page of the tree: a node shows its text, span and score.

    Nodes are drawn as boxes over the range of leaves below them (x: leaf insertion rank) on their row
    (depth; xMemory: tier). Every text-bearing node is one SVG ``rect`` with id ``node-<node id>``;
    clicking it shows the node's text, row, span, number of children and leaves, source id and score in
    the side panel. With a ``query``, nodes are shaded by the memory's local relevance of their text to
    the query (``max(cos, 0)`` with the memory's embedder) and the score appears in the panel. Node texts
    are embedded as JSON with ``<``, ``>`` and ``&`` escaped, so no text can end the script element.

    Args:
        memory: any hiermem memory.
        path: the HTML file to write (parent directories are created).
        query: optional query whose relevance colours the nodes.
        title: page title (default: the memory's class and size).

    Returns:
        The HTML path. The page needs no network and no external files.

    References:
        SegTreeMem paper Sec. 4.3 (local relevance ``max(cos, 0)``); node spans as in Sec. 4.1.
    """
    import html

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lay = tree_layout(memory)
    scores: dict[int, float] = {}
    if query:
        ids, r = memory.relevance(query, "dense")
        scores = {int(i): float(v) for i, v in zip(ids.tolist(), r.tolist())}
    items = []
    for ln in lay.nodes:
        x0 = ln.ranks[0] if ln.ranks else 0
        x1 = ln.ranks[-1] if ln.ranks else x0
        items.append(
            {
                "id": ln.id,
                "row": ln.row,
                "row_name": ln.level_name,
                "depth": ln.depth,
                "span": list(ln.span),
                "x0": x0,
                "x1": x1,
                "is_leaf": ln.is_leaf,
                "children": ln.children,
                "leaves": len(ln.ranks),
                "text": ln.text,
                "score": scores.get(ln.id),
                "source": ln.source,
            }
        )
    payload = {
        "nodes": items,
        "rows": lay.row_names,
        "leaves": lay.n_leaves,
        "has_scores": bool(query),
    }
    page_title = title or f"{type(memory).__name__}: {lay.n_leaves} leaves, {len(items)} nodes"
    path.write_text(
        _HTML.format(
            title=html.escape(page_title),
            query_line=html.escape(f"query: {query}") if query else "",
            data=_script_safe_json(payload),
        ),
        encoding="utf-8",
    )
    return path
