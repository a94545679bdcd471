"""Pictures of memory trees (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import HierarchicalMemory

__all__ = ["plot_tree_shape", "render_html"]


def plot_tree_shape(memory: HierarchicalMemory, path: str | Path, title: str | None = None) -> Path:
    """Draw every node as a bar over its span (x: insertion index of the leaves) at its depth (y).

    Leaves sit on the bottom row; an internal node's bar covers the leaves it summarises, so the
    picture shows how the conversation was segmented at each level. Single-child chain nodes are drawn
    lighter.

    Args:
        memory: any hiermem memory.
        path: PNG file to write (parent directories are created).
        title: figure title (default: the memory's kind and size).

    Returns:
        The PNG path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = memory.to_dict()["tree"]
    nodes = {n["id"]: n for n in data["nodes"]}
    depth: dict[int, int] = {}
    if data["root"] is not None:
        stack = [(data["root"], 0)]
        while stack:
            nid, d = stack.pop()
            depth[nid] = d
            stack.extend((c, d + 1) for c in nodes[nid]["children"])
    max_depth = max(depth.values(), default=0)
    n_leaves = sum(1 for n in nodes.values() if n["is_leaf"])
    fig_w = min(18.0, 6.0 + n_leaves / 40.0)
    fig, ax = plt.subplots(figsize=(fig_w, 1.2 + 0.45 * (max_depth + 1)))
    cmap = plt.get_cmap("viridis")
    for nid, d in depth.items():
        n = nodes[nid]
        if not n["text"]:
            continue
        left, right = n["span"]
        chain = not n["is_leaf"] and len(n["children"]) == 1
        color = cmap(d / max(1, max_depth))
        ax.broken_barh(
            [(left - 0.45, right - left + 0.9)],
            (-(d) - 0.4, 0.8),
            facecolors=color,
            alpha=0.25 if chain else 0.85,
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks([-d for d in range(max_depth + 1)])
    ax.set_yticklabels([f"depth {d}" for d in range(max_depth + 1)])
    ax.set_xlabel("leaf (message) insertion index")
    s = memory.stats()
    ax.set_title(
        title or f"{type(memory).__name__}: {s['leaves']} leaves, {s['nodes']} nodes, depth {s['max_depth']}"
    )
    ax.set_xlim(-1, max(1, n_leaves))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }}
#tree {{ flex: 3; overflow: auto; border-right: 1px solid #ccc; }}
#panel {{ flex: 1; padding: 1em; overflow: auto; min-width: 18em; }}
rect.node {{ cursor: pointer; stroke: #fff; stroke-width: 0.5; }}
rect.node.selected {{ stroke: #d00; stroke-width: 2; }}
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
  const svg = document.getElementById("svg");
  const W = Math.max(800, data.leaves * 6), rowH = 34, pad = 20;
  svg.setAttribute("width", W + 2 * pad);
  svg.setAttribute("height", (data.max_depth + 1) * rowH + 2 * pad);
  const unit = W / Math.max(1, data.leaves);
  const maxScore = Math.max(1e-12, ...data.nodes.map(n => n.score || 0));
  let selected = null;
  for (const n of data.nodes) {{
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    r.setAttribute("class", "node");
    r.setAttribute("id", "node-" + n.id);
    r.setAttribute("x", pad + n.x0 * unit);
    r.setAttribute("y", pad + n.depth * rowH);
    r.setAttribute("width", Math.max(2, (n.x1 - n.x0 + 1) * unit - 1));
    r.setAttribute("height", rowH - 6);
    const s = (n.score || 0) / maxScore;
    const plain = n.is_leaf ? "#4a90d9" : "#7fb77e";
    r.setAttribute("fill", data.has_scores ? `rgba(200, 40, 40, ${{0.15 + 0.85 * s}})` : plain);
    const t = document.createElementNS("http://www.w3.org/2000/svg", "title");
    t.textContent = n.text.slice(0, 120);
    r.appendChild(t);
    r.addEventListener("click", () => {{
      if (selected) selected.classList.remove("selected");
      selected = r; r.classList.add("selected");
      document.getElementById("info").textContent =
        `node ${{n.id}} · depth ${{n.depth}} · span [${{n.span[0]}}, ${{n.span[1]}}] · ` +
        (n.is_leaf ? "leaf" : `${{n.children}} children`) +
        (data.has_scores ? ` · score ${{(n.score || 0).toFixed(4)}}` : "") +
        (n.source ? ` · source ${{n.source}}` : "");
      document.getElementById("text").textContent = n.text;
    }});
    svg.appendChild(r);
  }}
}})();
</script></body></html>
"""


def render_html(
    memory: HierarchicalMemory, path: str | Path, query: str | None = None, title: str | None = None
) -> Path:
    """Write a single self-contained HTML page of the tree: a node shows its text, span and score.

    Nodes are drawn as boxes over their spans (x: leaf insertion index) at their depth (y). With a
    ``query``, nodes are shaded by the memory's local relevance of their text to the query
    (``max(cos, 0)`` with the memory's embedder) and the score appears in the panel.

    Args:
        memory: any hiermem memory.
        path: the HTML file to write.
        query: optional query whose relevance colours the nodes.
        title: page title (default: the memory's class and size).

    Returns:
        The HTML path. The page needs no network and no external files.
    """
    import html
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = memory.to_dict()["tree"]
    nodes = {n["id"]: n for n in data["nodes"]}
    scores: dict[int, float] = {}
    if query:
        ids, r = memory.relevance(query, "dense")
        scores = {int(i): float(v) for i, v in zip(ids.tolist(), r.tolist())}
    depth: dict[int, int] = {}
    if data["root"] is not None:
        stack = [(data["root"], 0)]
        while stack:
            nid, d = stack.pop()
            depth[nid] = d
            stack.extend((c, d + 1) for c in nodes[nid]["children"])
    # x positions: rank of the leaf among live leaves (spans are insertion indices, which may have gaps)
    leaf_idx = sorted(n["span"][0] for n in nodes.values() if n["is_leaf"])
    rank = {i: j for j, i in enumerate(leaf_idx)}

    def x_of(i: int) -> int:
        import bisect

        return rank.get(i, bisect.bisect_left(leaf_idx, i))

    items = []
    for nid, d in depth.items():
        n = nodes[nid]
        if not n["text"]:
            continue
        msg = n.get("message") or {}
        items.append(
            {
                "id": nid,
                "depth": d,
                "span": n["span"],
                "x0": x_of(n["span"][0]),
                "x1": max(x_of(n["span"][0]), min(x_of(n["span"][1]), len(leaf_idx) - 1)),
                "is_leaf": n["is_leaf"],
                "children": len(n["children"]),
                "text": n["text"],
                "score": scores.get(nid),
                "source": msg.get("id"),
            }
        )
    payload = {
        "nodes": items,
        "leaves": len(leaf_idx),
        "max_depth": max(depth.values(), default=0),
        "has_scores": bool(query),
    }
    text = json.dumps(payload, ensure_ascii=False).replace("</", "<\\/")
    page_title = title or f"{type(memory).__name__}: {len(leaf_idx)} leaves, {len(items)} nodes"
    path.write_text(
        _HTML.format(
            title=html.escape(page_title),
            query_line=html.escape(f"query: {query}") if query else "",
            data=text,
        ),
        encoding="utf-8",
    )
    return path
