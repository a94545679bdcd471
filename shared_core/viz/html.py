"""The self-contained HTML page of a tree: click or hover a node to read it; with a query, the nodes are
shaded by their cosine similarity to it and the top-k hits are marked with rank, score and path.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .layout import LANE_OFFSETS, LayoutNode, anchor, mark_lanes, tree_layout
from .query import MARK_COLOR, SCALE, QueryView, legend, query_view, scale_color

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory

__all__ = ["render_html"]

_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }}
#tree {{ flex: 3; overflow: auto; border-right: 1px solid #ccc; }}
#panel {{ flex: 1; padding: 1em; overflow: auto; min-width: 20em; max-width: 34em; }}
rect.node {{ cursor: pointer; stroke: #fff; stroke-width: 0.5; }}
rect.node.scored {{ stroke: #999; }}
rect.node.on-path {{ stroke: {mark}; stroke-width: 1.5; }}
rect.node.hit {{ stroke: {mark}; stroke-width: 3; }}
rect.node.selected {{ stroke: #000; stroke-width: 3; stroke-dasharray: 4 2; }}
line.path-edge {{ stroke: {mark}; stroke-width: 1.5; pointer-events: none; }}
g.hit-mark {{ pointer-events: none; }}
g.hit-mark circle {{ fill: {mark}; stroke: #fff; stroke-width: 1; }}
g.hit-mark text {{ font-size: 10px; font-weight: bold; }}
g.hit-mark text.rank {{ fill: #fff; }}
g.hit-mark text.score {{ fill: {mark}; paint-order: stroke; stroke: #fff; stroke-width: 3px; }}
text.row {{ font-size: 11px; fill: #555; }}
#text, #info {{ white-space: pre-wrap; }}
.meta {{ color: #555; font-size: 0.9em; }}
#legend {{ font-size: 0.85em; border: 1px solid #ddd; padding: 0.5em; margin-bottom: 0.8em; }}
#legend .scale {{ height: 0.8em; background: linear-gradient(to right, {gradient}); border: 1px solid #bbb; }}
#legend .ticks {{ display: flex; justify-content: space-between; color: #555; }}
#legend .dot {{ display: inline-block; width: 1.3em; height: 1.3em; border-radius: 50%; background: {mark};
  color: #fff; text-align: center; font-weight: bold; font-size: 0.8em; line-height: 1.3em; }}
#legend .line {{ display: inline-block; width: 1.6em; border-top: 2px solid {mark}; vertical-align: middle; }}
#hits {{ font-size: 0.85em; padding-left: 0; list-style: none; }}
#hits li {{ cursor: pointer; margin: 0.15em 0; }}
#hits li:hover {{ background: #f0f0f0; }}
#tip {{ position: fixed; display: none; max-width: 28em; background: #fffff4; border: 1px solid #999;
  padding: 0.3em 0.5em; font-size: 0.8em; pointer-events: none; white-space: pre-wrap; }}
</style></head>
<body>
<div id="tree"><svg id="svg" xmlns="http://www.w3.org/2000/svg"></svg></div>
<div id="panel"><h3 id="heading">{title}</h3><p class="meta" id="query">{query_line}</p>
<div id="legend"></div><ol id="hits"></ol>
<p class="meta">Hover a node for its scores; click it to read its text.</p>
<div class="meta" id="info"></div><div id="text"></div></div>
<div id="tip"></div>
<script id="data" type="application/json">{data}</script>
<script>
(function () {{
  const data = JSON.parse(document.getElementById("data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.getElementById("svg");
  const W = Math.max(800, data.leaves * 6), rowH = 40, pad = 24, left = 70;
  const rows = Math.max(1, data.rows.length);
  svg.setAttribute("width", W + left + pad);
  svg.setAttribute("height", rows * rowH + 2 * pad);
  const unit = W / Math.max(1, data.leaves);
  const X = a => left + (a + 0.5) * unit;
  const el = (tag, attrs, parent) => {{
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    (parent || svg).appendChild(e);
    return e;
  }};
  const f = (v, d) => (v === undefined || v === null) ? "" : v.toFixed(d);
  const byId = new Map(data.nodes.map(n => [n.id, n]));
  function figures(n) {{
    if (!data.has_scores) return "";
    const c = n.components || {{}}, parts = [];
    if (n.hit) parts.push(`hit #${{n.hit.rank}} by ${{data.policy}}`);
    parts.push(`score ${{f(n.score, 4)}} (cosine similarity)`);
    if (c.bm25 !== undefined) parts.push(`BM25 ${{f(c.bm25, 2)}}`);
    if (c.rank !== undefined) parts.push(`rank score ${{f(c.rank, 4)}}`);
    return parts.join(" · ");
  }}
  function describe(n) {{
    return `node ${{n.id}} · ${{n.row_name}} · span [${{n.span[0]}}, ${{n.span[1]}}] · ` +
      (n.is_leaf ? "leaf" : `${{n.children}} children, ${{n.leaves}} leaves`) +
      (data.has_scores ? " · " + figures(n) : "") + (n.source ? ` · source ${{n.source}}` : "");
  }}
  data.rows.forEach((name, i) => {{
    el("text", {{class: "row", x: 4, y: pad + i * rowH + rowH / 2}}).textContent = name;
  }});
  let selected = null;
  const rects = new Map();
  function select(n) {{
    const r = rects.get(n.id);
    if (selected) selected.classList.remove("selected");
    selected = r; r.classList.add("selected");
    document.getElementById("info").textContent =
      describe(n) + (n.hit ? "\\n" + n.hit.explain : "");
    document.getElementById("text").textContent = n.text;
  }}
  const tip = document.getElementById("tip");
  for (const n of data.nodes) {{
    const cls = ["node"];
    if (data.has_scores) cls.push("scored");
    if (n.on_path) cls.push("on-path");
    if (n.hit) cls.push("hit");
    const r = el("rect", {{
      class: cls.join(" "), id: "node-" + n.id, x: left + n.x0 * unit, y: pad + n.row * rowH + 3,
      width: Math.max(2, (n.x1 - n.x0 + 1) * unit - 1), height: rowH - 10,
      fill: data.has_scores ? n.fill : (n.is_leaf ? "#4a90d9" : "#7fb77e"),
    }});
    el("title", {{}}, r).textContent = n.text.slice(0, 120);
    rects.set(n.id, r);
    r.addEventListener("click", () => select(n));
    r.addEventListener("mouseenter", ev => {{
      tip.textContent = describe(n) + "\\n" + n.text.slice(0, 160) + (n.text.length > 160 ? "…" : "");
      tip.style.display = "block";
      tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 300) + "px";
      tip.style.top = (ev.clientY + 12) + "px";
    }});
    r.addEventListener("mouseleave", () => {{ tip.style.display = "none"; }});
  }}
  for (const e of data.edges) {{
    el("line", {{class: "path-edge", x1: X(e.x_from), y1: pad + e.row_from * rowH + rowH - 7,
      x2: X(e.x_to), y2: pad + e.row_to * rowH + 3}});
  }}
  for (const h of data.hits) {{
    const n = byId.get(h.node_id);
    if (!n) continue;
    const g = el("g", {{class: "hit-mark", id: "hit-" + h.rank}});
    const cx = X(h.x), cy = pad + n.row * rowH + rowH / 2 - 2 + h.dy;
    el("circle", {{cx: cx, cy: cy, r: 8}}, g);
    el("text", {{class: "rank", x: cx, y: cy + 3.5, "text-anchor": "middle"}}, g).textContent = h.rank;
    el("text", {{class: "score", x: cx + 10, y: cy + 3.5}}, g).textContent = h.score.toFixed(2);
  }}
  const legend = document.getElementById("legend");
  if (data.has_scores) {{
    legend.innerHTML = '<b>Legend</b><div class="scale"></div>' +
      '<div class="ticks"><span>0</span><span>0.5</span><span>1</span></div>' +
      '<p id="legend-shade"></p><p><span class="dot">1</span> <span id="legend-mark"></span></p>' +
      '<p><span class="line"></span> <span id="legend-path"></span></p>';
    for (const key of ["shade", "mark", "path"])
      document.getElementById("legend-" + key).textContent = data.legend[key];
    const list = document.getElementById("hits");
    for (const h of data.hits) {{
      const li = document.createElement("li");
      li.id = "hit-item-" + h.rank;
      li.textContent = `#${{h.rank}} · ${{h.score.toFixed(2)}} · node ${{h.node_id}}: ` +
        h.text.slice(0, 80) + (h.text.length > 80 ? "…" : "");
      li.addEventListener("click", () => select(byId.get(h.node_id)));
      list.appendChild(li);
    }}
  }} else {{
    legend.innerHTML = '<b>Legend</b><p>Blue: a message (leaf); green: a node above messages ' +
      '(its box spans the messages below it). Run with a query to see scores and hits.</p>';
  }}
}})();
</script></body></html>
"""


def _script_safe_json(payload: Any) -> str:
    """JSON for a ``<script type="application/json">`` element: no ``<``, ``>`` or ``&`` appear raw."""
    text = json.dumps(payload, ensure_ascii=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _centre(ln: LayoutNode, rank: int) -> float:
    """x (in leaf ranks) of a node's bar over the leaf of rank ``rank``."""
    a, b = anchor(ln.ranks, rank)
    return (a + b) / 2


def _hits_and_edges(
    view: QueryView, nodes: dict[int, LayoutNode], n_leaves: int
) -> tuple[list[dict], list[dict]]:
    """The hits (rank, node id, score, components, path, text, explanation, mark position ``x`` in
    leaf ranks and ``dy`` in pixels) and the path edges between drawn nodes (a structural root without
    text is skipped)."""
    hits, edges, seen = [], [], set()
    for h in view.hits:
        ln = nodes.get(h.node_id)
        first = ln.ranks[0] if ln is not None and ln.ranks else 0
        hits.append(
            {
                "rank": h.rank,
                "node_id": h.node_id,
                "score": h.score,
                "components": h.components,
                "path": h.path,
                "text": h.text,
                "explain": h.explain(),
                "x": _centre(ln, first) if ln is not None else 0.0,
            }
        )
        drawn = [nodes[i] for i in h.path if i in nodes and nodes[i].ranks]
        for p, c in zip(drawn, drawn[1:]):
            if (p.id, c.id) in seen:
                continue
            seen.add((p.id, c.id))
            edges.append(
                {
                    "from": p.id,
                    "to": c.id,
                    "x_from": _centre(p, first),
                    "x_to": _centre(c, first),
                    "row_from": p.row,
                    "row_to": c.row,
                }
            )
    # the page draws a leaf every max(800, 6 n) / n pixels; a mark and its score take about 46 pixels
    unit = max(800, 6 * n_leaves) / max(1, n_leaves)
    rows = [nodes[h["node_id"]].row if h["node_id"] in nodes else -1 for h in hits]
    lanes = mark_lanes([(r, h["x"]) for r, h in zip(rows, hits)], 46 / unit)
    for h, lane in zip(hits, lanes):
        h["dy"] = -LANE_OFFSETS[lane] * 15
    return hits, edges


def render_html(
    memory: HierarchicalMemory,
    path: str | Path,
    query: str | None = None,
    title: str | None = None,
    *,
    k: int = 10,
    policy: str | None = None,
) -> Path:
    """Write a single self-contained HTML page of the tree: a node shows its text, span and scores.

    Nodes are drawn as boxes over the range of leaves below them (x: leaf insertion rank) on their row
    (depth; xMemory: tier). Every text-bearing node is one SVG ``rect`` with id ``node-<node id>``;
    hovering it shows its figures in a tooltip (``#tip``); clicking it shows the node's text, row, span,
    number of children and leaves, source id and figures in the side panel (``#info``, ``#text``).

    With a ``query``: every node is shaded by its cosine similarity to the query (the readable score of
    :class:`~shared_core.types.Hit`, clipped to ``[0, 1]``, on a fixed scale: see
    :data:`shared_core.viz.query.SCALE`); the top ``k`` hits of ``memory.retrieve(query, k=k,
    policy=policy)`` get a red mark (``g#hit-<rank>``) with their rank and score; the nodes of each hit's
    ``Hit.path`` are outlined in red and joined by red lines from the root down; the panel lists the hits
    (``#hits``, click one to select its node) and a legend (``#legend``) says what shades, marks and lines
    mean. A node's figures are a hit's ``Hit.components`` (rank score, cosine, BM25 when the memory's
    relevance reads it) and ``Hit.explain()``, another node's cosine (and BM25 when read).

    The page's data is one JSON element (``script#data``): ``nodes`` (id, row, row_name, depth, span,
    x0, x1, is_leaf, children, leaves, text, source, score, fill, components, on_path, hit),
    ``rows``, ``leaves``, ``has_scores``, and with a query ``query``, ``policy``, ``k``, ``hits`` (rank,
    node_id, score, components, path, text, explain, x, dy), ``edges`` and ``legend``. Texts are embedded with
    ``<``, ``>`` and ``&`` escaped, so no text can end the script element.

    Args:
        memory: any hiermem memory.
        path: the HTML file to write (parent directories are created).
        query: optional query to explain (embedded with the memory's embedder).
        title: page title (default: the memory's class and size).
        k: hits to mark, a positive integer, default 10 (checked also without a query).
        policy: the retrieval policy, one of ``memory.policies``; default ``None`` = the memory's
            ``default_policy``.

    Returns:
        The HTML path. The page needs no network and no external files.

    Raises:
        InvalidInputError: ``k`` not a positive integer, an empty query.
        UnknownPolicyError: a policy the memory does not have.
        LLMRequiredError: an LLM-only policy on a memory without an LLM.
        Nothing is written when an error is raised.

    References:
        Node spans as in SegTreeMem paper Sec. 4.1; the hits are the memory's own ``retrieve``.
    """
    view = query_view(memory, query, k, policy)
    lay = tree_layout(memory)
    nodes = {ln.id: ln for ln in lay.nodes}
    hit_of = view.hit_of() if view is not None else {}
    on_path = view.on_path() if view is not None else set()
    items = []
    for ln in lay.nodes:
        x0 = ln.ranks[0] if ln.ranks else 0
        x1 = ln.ranks[-1] if ln.ranks else x0
        score = view.scores.get(ln.id, 0.0) if view is not None else None
        hit = hit_of.get(ln.id)
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
                "score": score,
                "fill": scale_color(score) if score is not None else None,
                "components": view.components(ln.id) if view is not None else {},
                "on_path": ln.id in on_path,
                "hit": {"rank": hit.rank, "explain": hit.explain()} if hit is not None else None,
                "source": ln.source,
            }
        )
    payload: dict[str, Any] = {
        "nodes": items,
        "rows": lay.row_names,
        "leaves": lay.n_leaves,
        "has_scores": view is not None,
        "hits": [],
        "edges": [],
    }
    if view is not None:
        hits, edges = _hits_and_edges(view, nodes, lay.n_leaves)
        payload.update(
            query=view.query, policy=view.policy, k=view.k, hits=hits, edges=edges, legend=legend(view)
        )
    page_title = title or f"{type(memory).__name__}: {lay.n_leaves} leaves, {len(items)} nodes"
    query_line = f"query: {view.query} · top {view.k} by {view.policy}" if view is not None else ""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        _HTML.format(
            title=html.escape(page_title),
            query_line=html.escape(query_line),
            data=_script_safe_json(payload),
            mark=MARK_COLOR,
            gradient=", ".join(f"{c} {s * 100:.0f}%" for s, c in SCALE),
        ),
        encoding="utf-8",
    )
    return path
