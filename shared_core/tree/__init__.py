"""The tree: the node store (ordered children, parent, depth, span), structure arrays, propagation.

Layer above :mod:`shared_core.types` and :mod:`shared_core.arrays`; knows nothing of embeddings or
memories.
"""

from .nodes import Node, NodeStore, TreeInvariantError

__all__ = ["Node", "NodeStore", "TreeInvariantError"]
