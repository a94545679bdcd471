"""Pictures of memory trees: a PNG of the tree's shape (matplotlib, headless) and a self-contained HTML page.

Both read only :meth:`HierarchicalMemory.to_dict` for the tree, so they work for every memory kind and
for a memory loaded from a save. Rows are depths below the root, except for xMemory, whose rows are its
four tiers (theme, semantic, episode, message) and whose nodes are coloured by the theme they belong to.
Given a query, both explain the memory's own retrieval: nodes shaded by their cosine similarity to the
query on a fixed 0-1 scale, the top-k hits of a policy marked with rank and score, the path from the root
to each hit, and a legend.

Modules: :mod:`.layout` (rows and leaf positions), :mod:`.query` (hits, scores, colour scale, legend),
:mod:`.png` (:func:`plot_tree_shape`, :func:`tree_figure`), :mod:`.html` (:func:`render_html`).
"""

from __future__ import annotations

from ..types import parse_timestamp
from .html import render_html
from .layout import LayoutNode, TreeLayout, tree_layout
from .png import plot_tree_shape, tree_figure
from .query import QueryView, query_view

__all__ = [
    "LayoutNode",
    "QueryView",
    "TreeLayout",
    "parse_timestamp",
    "plot_tree_shape",
    "query_view",
    "render_html",
    "tree_figure",
    "tree_layout",
]
