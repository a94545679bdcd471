"""The stand-in store of a memory whose durable store a :class:`~shared_core.namespaces.MemoryStore`
closed to keep its number of resident namespaces bounded.

An evicted memory keeps every node in RAM for as long as something still references it (a caller holding
the memory returned by ``MemoryStore.get_or_create``); only its store is closed, which releases the file
descriptors (SQLite) or the registration (PostgreSQL). The memory's ``_durable`` is then an
:class:`EvictedStore`: the first call that needs the store (``add``, ``delete``, ``retrieve``, ``len``,
``stats``, ``refresh``; every one of them holds the memory's lock) opens the store again, puts it in
place and carries on, so a memory evicted under a caller's feet keeps working and stays durable. Nothing
is embedded again: a store reopened with the change sequence the memory already reflects is simply put
back; any other store (PostgreSQL, or an SQLite file changed meanwhile) loads its stored rows and
vectors into the memory. A PostgreSQL namespace another process deleted (or deleted and created again)
meanwhile raises :class:`~shared_core.stores.namespace.NamespaceDeletedError`, as the memory would have
had it stayed open.

Nothing here imports :mod:`shared_core.memories.base`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..types import PersistenceError
from .base import Store
from .namespace import NamespaceDeletedError

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory

__all__ = ["EvictedStore"]


class EvictedStore(Store):
    """The closed store of an evicted memory, reopened on the memory's next use.

    Args:
        store: the store being closed (its location, path, change sequence and PostgreSQL namespace
            id are kept; it is not closed here).
        reopen: opens the store again; called with the memory's lock held.
        revived: called with the memory once its store is open again (the owner counts it resident
            again); must not block on any memory's lock.

    The store's methods are called with the memory's lock held (see ``HierarchicalMemory``); after
    :meth:`close` (the memory's ``close_store``, or the owner closing) it never reopens.
    """

    FORMAT = 0

    def __init__(
        self,
        store: Store,
        reopen: Callable[[], Store],
        revived: Callable[[HierarchicalMemory], None],
    ) -> None:
        self.location = store.location
        self.path: Path | None = getattr(store, "path", None)
        self._ns: Any = getattr(store, "_ns", None)  # the PostgreSQL namespace id (see MemoryStore)
        self._seq = store.seq
        self._reopen: Callable[[], Store] | None = reopen
        self._revived = revived

    def __repr__(self) -> str:
        return f"EvictedStore({self.location!r})"

    @property
    def seq(self) -> int:
        """The change sequence number the memory reflects."""
        return self._seq

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the store then never reopens)."""
        return self._reopen is None

    def landed(self, seq: int) -> bool:
        """Nothing is written through a closed store: ``False``."""
        return False

    def abort(self) -> None:
        """Nothing is open: a no-op."""

    def close(self) -> None:
        """Never reopen (idempotent)."""
        self._reopen = None

    def open_for(self, mem: HierarchicalMemory) -> Store:
        """Open the store again and put it in place as ``mem``'s store (``mem``'s lock held).

        Returns:
            The open store.

        Raises:
            PersistenceError: the store was closed for good, or cannot be opened (``mem`` unchanged).
            NamespaceDeletedError: the PostgreSQL namespace was deleted by another process.
        """
        if self._reopen is None:
            raise PersistenceError(
                f"The store {self.location} was closed with its MemoryStore; get the namespace's memory "
                "from an open MemoryStore again."
            )
        if mem._durable is not self:
            raise PersistenceError(f"The store {self.location} is no longer this memory's store.")
        store = self._reopen()
        if self._ns is not None and getattr(store, "_ns", None) != self._ns:
            store.close()  # PostgreSQL: deleted (or deleted and created again) by another process
            raise NamespaceDeletedError(
                f"{self.location} was deleted (delete_namespace) by another process; open it again to "
                "start a new memory there."
            )
        try:
            if store.seq != self._seq or not store.seq:
                store.load_into(mem)  # changed since it was closed: the stored memory wins
        except BaseException:
            store.close()
            raise
        mem._durable = store
        self._reopen = None
        self._revived(mem)
        return store

    # every use of the store: open it, then do what was asked
    def meta(self) -> dict[str, Any] | None:
        """Not asked of a bound memory's store (only while binding one).

        Raises:
            PersistenceError: always; the store is closed.
        """
        raise PersistenceError(f"The store {self.location} is closed.")

    def load_into(self, mem: HierarchicalMemory) -> None:
        """Reopen the store and load it into ``mem``."""
        self.open_for(mem).load_into(mem)

    def sync(self, mem: HierarchicalMemory) -> None:
        """Reopen the store, then catch ``mem`` up with it."""
        self.open_for(mem).sync(mem)

    def initialize(self, mem: HierarchicalMemory) -> bool:
        """Reopen the store, then write the whole of ``mem``."""
        return self.open_for(mem).initialize(mem)

    def begin(self, mem: HierarchicalMemory) -> None:
        """Reopen the store, then prepare a write."""
        self.open_for(mem).begin(mem)

    def commit(self, mem: HierarchicalMemory) -> None:
        """Reopen the store, then write the open transaction of ``mem``."""
        self.open_for(mem).commit(mem)

    def clear(self, mem: HierarchicalMemory) -> None:
        """Reopen the store, then forget every node and vector."""
        self.open_for(mem).clear(mem)
