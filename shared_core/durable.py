"""Durable store: every acknowledged change of a memory committed to a database before it returns.

The stores live in :mod:`shared_core.stores` (one interface, an SQLite and a PostgreSQL backend); this
module keeps the names it always had::

    mem = SegTreeMem.open("memory.sqlite", embedder=emb)        # create, or reopen with the stored config
    mem.add("I adopted a dog named Luna")                        # durable when add returns
    mem.close_store()
    mem = HierarchicalMemory.open("memory.sqlite", embedder=emb)  # reopen, dispatching on the stored kind

    mem = HAT(embedder=emb, M=4); mem.attach_store("hat.sqlite")  # attach to an existing instance

    mem = SegTreeMem.open("postgresql://app@db/app", namespace=("alice",), embedder=emb)  # shared store

See :mod:`shared_core.stores.sqlite` for the SQLite layout and guarantees and
:mod:`shared_core.stores.postgres` for PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .stores import Store, attach_store
from .stores.sqlite import FORMAT, SYNCHRONOUS, DurableStore, SQLiteStore

if TYPE_CHECKING:
    from .memories.base import HierarchicalMemory
    from .models.base import LLM, Embedder

__all__ = ["FORMAT", "SYNCHRONOUS", "DurableStore", "SQLiteStore", "Store", "attach_store", "open_memory"]

M = TypeVar("M", bound="HierarchicalMemory")


def open_memory(
    cls: type[M],
    path: str | Path,
    *,
    embedder: Embedder | None = None,
    llm: LLM | None = None,
    synchronous: str = "FULL",
    **kwargs: Any,
) -> M:
    """Open (or create) the memory stored at ``path``: ``cls.open(path, ...)`` (see
    :meth:`HierarchicalMemory.open`)."""
    return cls.open(path, embedder=embedder, llm=llm, synchronous=synchronous, **kwargs)
