"""The PNG of a tree's shape (matplotlib's object-oriented API, no pyplot backend), optionally explaining
a query: nodes shaded by their cosine similarity to it, the top-k hits marked with rank and score, the
paths from the root to them, and a legend.
"""

from __future__ import annotations

import textwrap
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..types import InvalidInputError, parse_timestamp
from .layout import LANE_OFFSETS, LayoutNode, TreeLayout, anchor, mark_lanes, runs, tree_layout
from .query import MARK_COLOR, SCALE, QueryView, legend, query_view, scale_color

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..memories.base import HierarchicalMemory

__all__ = ["plot_tree_shape", "tree_figure"]

_X_AXES = ("index", "time")
#: width in inches of the side panel (legend, hit list, colour bar) of a picture with a query
_SIDE_W = 4.4


def _leaf_positions(lay: TreeLayout, x: str) -> tuple[list[float], float, float, float]:
    """x coordinate of each leaf rank, the bar width, and the x range ``(lo, hi)``."""
    import matplotlib.dates as mdates

    n_leaves = lay.n_leaves
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
        return filled, width, lo, hi
    return [float(i) for i in range(n_leaves)], 0.9, -0.5, max(0.5, n_leaves - 0.5)


def tree_figure(
    memory: HierarchicalMemory,
    title: str | None = None,
    *,
    x: str = "index",
    query: str | None = None,
    k: int = 10,
    policy: str | None = None,
) -> Figure:
    """The picture :func:`plot_tree_shape` saves, as a matplotlib ``Figure`` (e.g. to show in a notebook).

    Arguments and errors as :func:`plot_tree_shape` (without ``path`` and ``dpi``).
    """
    if x not in _X_AXES:
        raise InvalidInputError(f"x must be one of {_X_AXES}, got {x!r}.")
    view = query_view(memory, query, k, policy)  # checks k and policy, with or without a query
    # the object-oriented API without pyplot: no backend is selected or changed (safe in notebooks,
    # threads and headless servers)
    import matplotlib
    from matplotlib.figure import Figure

    lay = tree_layout(memory)
    n_rows = max(1, len(lay.row_names))
    xs, width, lo, hi = _leaf_positions(lay, x)
    fig_w = min(18.0, 6.0 + lay.n_leaves / 40.0)
    fig_h = 1.3 + 0.5 * n_rows
    if view is None:
        fig = Figure(figsize=(fig_w, fig_h))
        ax = fig.add_subplot()
    else:
        side = [1.7, 0.42, 0.3 + 0.16 * len(view.hits)]  # legend, colour bar, hit list (inches)
        fig_h = max(fig_h + 0.3, 1.0 + sum(side))  # + the title and margins
        fig = Figure(figsize=(fig_w + _SIDE_W, fig_h), layout="constrained")
        grid = fig.add_gridspec(
            4, 2, width_ratios=[fig_w, _SIDE_W], height_ratios=[*side, max(0.05, fig_h - 1.0 - sum(side))]
        )
        ax = fig.add_subplot(grid[:, 0])
    cmap = matplotlib.colormaps["viridis"]
    theme_cmap = matplotlib.colormaps["tab20"]
    theme_color = {g: theme_cmap(i % 20) for i, g in enumerate(lay.groups)}
    # thin grey edges keep pale bars visible; past 200 leaves they would hide the shades
    edge = 0.3 if lay.n_leaves <= 200 else 0.0
    for ln in lay.nodes:
        if not ln.ranks:
            continue
        bars = [(xs[a] - width / 2, xs[b] - xs[a] + width) for a, b in runs(ln.ranks)]
        if view is not None:
            color = scale_color(view.scores.get(ln.id, 0.0))
            ax.broken_barh(bars, (-ln.row - 0.4, 0.8), facecolors=color, edgecolor="0.6", linewidth=edge)
            continue
        if lay.kind == "xmemory":
            color = theme_color.get(ln.group, (0.6, 0.6, 0.6, 1.0)) if ln.group is not None else "0.6"
        else:
            color = cmap(ln.row / max(1, n_rows - 1))
        chain = not ln.is_leaf and ln.children == 1
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
        if view is None:
            fig.autofmt_xdate()
        else:  # autofmt_xdate would move every axis of the figure
            for label in ax.get_xticklabels():
                label.set(rotation=30, horizontalalignment="right")
    else:
        ax.set_xlabel("leaf (message) insertion rank")
        ax.set_xlim(lo - 0.5, hi + 0.5)
    if title is None:
        s = memory.stats()
        title = f"{type(memory).__name__}: {s['leaves']} leaves, {s['nodes']} nodes, depth {s['max_depth']}"
        if lay.kind == "xmemory":
            title += f", {len(lay.groups)} themes"
    if view is not None:
        q = view.query if len(view.query) <= 70 else view.query[:69] + "…"
        title += f'\nquery "{q}" · top {view.k} by {view.policy}'
        x_lo, x_hi = ax.get_xlim()
        _draw_hits(ax, lay, view, xs, width, (x_hi - x_lo) / max(1.0, fig_w - 1.1))
        _draw_side(fig, grid, view, lay)
    ax.set_title(title, parse_math=False)
    if view is None:
        fig.tight_layout()
    return fig


def _draw_hits(
    ax: Axes, lay: TreeLayout, view: QueryView, xs: list[float], width: float, x_per_inch: float
) -> None:
    """Outline the paths from the root to the hits, join them with lines and mark each hit (rank in a
    red disc, score beside it; ``x_per_inch``: x data units per inch of the axes, to keep marks apart)."""
    import matplotlib.patheffects as pe
    from matplotlib.transforms import offset_copy

    by_id = {ln.id: ln for ln in lay.nodes}
    outlined: dict[tuple[int, int, int], float] = {}  # (node, first, last rank of the run) -> line width
    for hit in view.hits:
        node = by_id.get(hit.node_id)
        if node is None or not node.ranks:
            continue
        first = node.ranks[0]
        prev: tuple[float, int] | None = None
        for nid in hit.path:
            ln = by_id.get(nid)
            if ln is None or not ln.ranks:  # a structural root without text is not drawn
                continue
            a, b = anchor(ln.ranks, first)  # the bar the path passes through (scattered nodes have several)
            cx = (xs[a] + xs[b]) / 2
            if prev is not None:
                ax.plot([prev[0], cx], [-prev[1] - 0.4, -ln.row + 0.4], color=MARK_COLOR, lw=1.3, zorder=4)
            prev = (cx, ln.row)
            key = (nid, a, b)
            outlined[key] = max(outlined.get(key, 0.0), 2.2 if nid == hit.node_id else 1.2)
    for (nid, a, b), lw in outlined.items():
        row = by_id[nid].row
        ax.broken_barh([(xs[a] - width / 2, xs[b] - xs[a] + width)], (-row - 0.4, 0.8), facecolors="none",
                       edgecolor=MARK_COLOR, linewidth=lw, zorder=3)  # fmt: skip
    halo = [pe.withStroke(linewidth=2.2, foreground="white")]
    marks = []
    for hit in view.hits:
        ln = by_id.get(hit.node_id)
        if ln is not None and ln.ranks:
            a, b = anchor(ln.ranks, ln.ranks[0])
            marks.append((hit, ln.row, (xs[a] + xs[b]) / 2))
    # a mark and its score take about 0.45 inch: closer marks on one row go to other heights
    lanes = mark_lanes([(row, cx) for _, row, cx in marks], 0.45 * x_per_inch)
    for (hit, row, cx), lane in zip(marks, lanes):
        dy = -LANE_OFFSETS[lane] * 12.0  # points; lane -1 is above the middle
        at = offset_copy(ax.transData, fig=ax.figure, x=0.0, y=dy, units="points")
        ax.scatter(
            [cx], [-row], s=150, c=MARK_COLOR, edgecolors="white", linewidths=0.8, zorder=5, transform=at
        )
        ax.annotate(str(hit.rank), (cx, -row), xytext=(0, dy), textcoords="offset points", color="white",
                    fontsize=6.5, weight="bold", ha="center", va="center", zorder=6)  # fmt: skip
        ax.annotate(f"{hit.score:.2f}", (cx, -row), xytext=(6, dy), textcoords="offset points", fontsize=6.5,
                    color=MARK_COLOR, weight="bold", va="center", zorder=6, path_effects=halo)  # fmt: skip


def _draw_side(fig: Figure, grid: Any, view: QueryView, lay: TreeLayout) -> None:
    """The legend, the list of hits (rank, score, node, text) and the colour bar of the score scale."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    words = legend(view)
    leg_ax = fig.add_subplot(grid[0, 1])
    leg_ax.axis("off")
    handles = [
        Patch(facecolor=scale_color(0.6), edgecolor="0.6"),
        Line2D([], [], marker="o", color=MARK_COLOR, markersize=9, linestyle="None"),
        Line2D([], [], color=MARK_COLOR, lw=1.5),
    ]
    labels = [textwrap.fill(words[key], 60) for key in ("shade", "mark", "path")]
    leg_ax.legend(handles, labels, loc="upper left", frameon=False, fontsize=7.5, title="Legend",
                  title_fontsize=8.5, alignment="left")  # fmt: skip
    hits_ax = fig.add_subplot(grid[2, 1])
    hits_ax.axis("off")
    by_id: dict[int, LayoutNode] = {ln.id: ln for ln in lay.nodes}
    lines = [f"top {view.k} by {view.policy}: rank, score, node, text"]
    for h in view.hits:
        ln = by_id.get(h.node_id)
        where = "leaf" if h.is_leaf else (ln.level_name if ln is not None else f"depth {h.depth}")
        text = " ".join(h.text.split())
        text = text if len(text) <= 34 else text[:33] + "…"
        lines.append(f"#{h.rank:<2} {h.score:.2f}  {where} {h.node_id}: {text}")
    if not view.hits:
        lines.append("(no hits)")
    hits_ax.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", fontsize=7, family="monospace",
                 transform=hits_ax.transAxes, parse_math=False)  # fmt: skip
    cax = fig.add_subplot(grid[1, 1])
    cmap = LinearSegmentedColormap.from_list("hiermem_score", [(s, c) for s, c in SCALE])
    bar = fig.colorbar(ScalarMappable(norm=Normalize(0.0, 1.0), cmap=cmap), cax=cax, orientation="horizontal")
    bar.set_label("cosine similarity of query and node text (fixed 0–1)", fontsize=7.5)
    cax.tick_params(labelsize=7)


def plot_tree_shape(
    memory: HierarchicalMemory,
    path: str | Path,
    title: str | None = None,
    *,
    x: str = "index",
    dpi: int = 110,
    query: str | None = None,
    k: int = 10,
    policy: str | None = None,
) -> Path:
    """Draw every node as bars over the leaves below it (x) on its row (y): the tree's segmentation.

    Leaves sit on the bottom row. A node whose leaves are contiguous (SegTreeMem, HAT) is one bar over
    its span; a node whose leaves are scattered (MemTree's semantic clusters, xMemory's themes) is one
    bar per run of consecutive leaves, so the picture shows which parts of the conversation it gathers.
    Single-child chain nodes are drawn lighter. Rows are depths below the root; for xMemory they are the
    tiers theme / semantic / episode / message, and every node takes the colour of its theme (grey: not
    under a theme yet, e.g. the open episode).

    With a ``query``, every node is shaded instead by its cosine similarity to the query (the readable
    score of :class:`~shared_core.types.Hit`, on a fixed 0-1 scale, see
    :data:`shared_core.viz.query.SCALE`); the top ``k`` hits of ``memory.retrieve(query, k=k,
    policy=policy)`` get a red mark with their rank and score; the nodes of each hit's ``Hit.path``
    are outlined in red and joined by red lines from the root down; a side panel holds the legend,
    the list of hits (rank, score, node, text) and the colour bar.

    Args:
        memory: any hiermem memory.
        path: PNG file to write (parent directories are created).
        title: figure title (default: the memory's class and size; with a query, a second line names
            the query, ``k`` and the policy).
        x: ``"index"`` (default): leaves at their insertion rank; ``"time"``: leaves at their messages'
            timestamps (see :func:`parse_timestamp`), so spans are drawn on a time axis; a leaf without a
            readable timestamp takes the previous leaf's time.
        dpi: resolution of the PNG in dots per inch, default 110.
        query: optional query to explain (embedded with the memory's embedder).
        k: hits to mark, a positive integer, default 10 (checked also without a query).
        policy: the retrieval policy, one of ``memory.policies``; default ``None`` = the memory's
            ``default_policy``.

    Returns:
        The PNG path.

    Raises:
        InvalidInputError: ``x`` is not ``"index"`` or ``"time"``, or ``x="time"`` and no leaf has a
            readable timestamp; ``k`` not a positive integer; an empty query.
        UnknownPolicyError: a policy the memory does not have.
        LLMRequiredError: an LLM-only policy on a memory without an LLM.
        Nothing is written when an error is raised.

    References:
        SegTreeMem paper Sec. 4.1 (interval nodes); xMemory paper Sec. 3.1 (hierarchy of themes).
    """
    fig = tree_figure(memory, title, x=x, query=query, k=k, policy=policy)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
