"""The memory classes by ``kind`` (the name a save or a store records), for dispatch on open and load.

Each memory class registers itself with :func:`register_memory` where it is defined, so the base class
never imports its subclasses; importing :mod:`shared_core` registers the four memories.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .base import HierarchicalMemory

__all__ = ["memory_classes", "register_memory"]

_M = TypeVar("_M", bound="type[HierarchicalMemory]")
_CLASSES: dict[str, type[HierarchicalMemory]] = {}


def register_memory(cls: _M) -> _M:
    """Class decorator: record ``cls`` under ``cls.kind`` (a later class of the same kind replaces it).

    Returns:
        ``cls`` unchanged.
    """
    _CLASSES[cls.kind] = cls
    return cls


def memory_classes() -> dict[str, type[HierarchicalMemory]]:
    """Memory classes by their ``kind`` (the name stored in saves), sorted by kind (whatever the import
    order)."""
    return dict(sorted(_CLASSES.items()))
