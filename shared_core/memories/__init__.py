"""The four hierarchical memories on one base class (layer above :mod:`shared_core.search`, the tree and
the stores).

* :mod:`.base`: :class:`HierarchicalMemory`, the shared surface (validation, atomic adds, retrieval
  policies on :class:`~shared_core.search.ranking.Ranking`, deletion, persistence);
* :mod:`.segtree`: SegTreeMem; :mod:`.memtree` (+ :mod:`.memtree_routes`): MemTree; :mod:`.hat`
  (+ :mod:`.hat_agent`): HAT; :mod:`.xmemory`: xMemory;
* :mod:`.registry`: the classes by ``kind``, filled by the classes themselves.
"""

from .base import HierarchicalMemory
from .hat import HAT
from .memtree import MemTree
from .registry import memory_classes, register_memory
from .segtree import SegTreeMem
from .xmemory import XMemory

__all__ = [
    "HAT",
    "HierarchicalMemory",
    "MemTree",
    "SegTreeMem",
    "XMemory",
    "memory_classes",
    "register_memory",
]
