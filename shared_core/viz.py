"""Pictures of memory trees (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import HierarchicalMemory

__all__ = ["plot_tree_shape"]


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
