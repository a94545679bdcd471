"""Saving, loading and durable stores: the persistence surface of every memory.

A mixin of :class:`~shared_core.memories.base.HierarchicalMemory`: :meth:`~StoreBinding.save` /
:meth:`~StoreBinding.load` write and read a directory (:mod:`shared_core.stores.files`);
:meth:`~StoreBinding.open`, :meth:`~StoreBinding.attach_store` and :meth:`~StoreBinding.close_store` bind
the memory to an SQLite file or a PostgreSQL namespace (:mod:`shared_core.stores`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..models.base import LLM, Embedder
from ..search.index import NodeIndex
from ..stores import Store, attach_store, connect, open_memory
from ..stores.files import load_memory, save_memory
from ..tree.nodes import NodeStore
from ..types import InvalidInputError, Usage
from .registry import memory_classes

if TYPE_CHECKING:
    from .base import HierarchicalMemory

__all__ = ["StoreBinding"]

M = TypeVar("M", bound="StoreBinding")


class StoreBinding:
    """Mixin: save / load and the durable store of a memory (see the module)."""

    # set by HierarchicalMemory.__init__
    contiguous_spans: bool
    _lock: threading.RLock
    _durable: Store | None
    _store: NodeStore
    _index: NodeIndex | None
    _lexical: Any
    _usage: Usage
    _version: int

    if TYPE_CHECKING:

        def _set_state(self, state: dict[str, Any]) -> None: ...
        def _check_open(self) -> None: ...

    def _mem(self) -> HierarchicalMemory:
        return cast("HierarchicalMemory", self)

    def save(self, path: str | Path) -> Path:
        """Save to a directory (plain JSON + the FAISS index file; never pickle).

        The save is written beside the previous one and switched in by an atomic rename, so an
        interrupted save leaves the previous save readable.

        Returns:
            The directory path.

        Raises:
            PersistenceError: the path is a file or a non-empty directory that is not a hiermem save.
        """
        with self._lock:
            return save_memory(self._mem(), Path(path))

    @classmethod
    def load(cls: type[M], path: str | Path, embedder: Embedder | None = None, llm: LLM | None = None) -> M:
        """Load a memory saved by :meth:`save`.

        Args:
            path: the save directory.
            embedder: the embedder to use from now on (must have the saved dimension); default local.
            llm: the LLM to use from now on, or ``None``.

        Raises:
            PersistenceError: not a saved memory, or corrupt.
            VersionMismatchError: saved by an incompatible format version or as another memory kind.
        """
        return load_memory(cls, Path(path), embedder=embedder, llm=llm, classes=memory_classes)

    # ------------------------------------------------------------------ durable store
    @classmethod
    def open(
        cls: type[M],
        path: str | Path,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        *,
        synchronous: str = "FULL",
        namespace: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> M:
        """Open the memory in a durable store, creating it when new: an SQLite file, or one namespace of
        a PostgreSQL database shared by any number of processes.

        A new store is created with ``cls(embedder, llm, **kwargs)``. An existing store is reopened with
        its stored kind and configuration (``HierarchicalMemory.open`` dispatches on the kind); its node
        store and FAISS index are rebuilt from the database. From then on every acknowledged ``add`` /
        ``delete`` / ``clear`` is committed to the store before it returns. With PostgreSQL, every
        ``add``, ``delete`` and ``retrieve`` first applies what other processes committed (see
        :mod:`shared_core.stores.postgres`).

        Args:
            path: the SQLite file, e.g. ``"memory.sqlite"``, or a libpq URL
                ``"postgresql://user:password@host:port/dbname"``.
            embedder: the embedder (must give the stored dimension); default the local model.
            llm: the LLM, or ``None``.
            synchronous: SQLite only: ``"FULL"`` (default: survives power loss), ``"EXTRA"`` or
                ``"NORMAL"`` (survives a process crash).
            namespace: PostgreSQL only: the memory's namespace, a string or a tuple of strings, default
                ``("default",)``.
            **kwargs: constructor arguments for a new store; for an existing one, arguments outside the
                stored configuration (e.g. ``summarizer``); stored values must not be contradicted.

        Returns:
            The memory, bound to the store (release it with :meth:`close`, or open it in a ``with``
            statement).

        Raises:
            InvalidInputError: a new store opened through ``HierarchicalMemory`` itself, an argument
                that contradicts the stored configuration, a malformed URL or namespace, or an option
                of the other backend.
            PersistenceError: not a hiermem store, corrupt, in use by another process (SQLite), another
                kind, or the server cannot be reached (PostgreSQL).
            VersionMismatchError: written by another format version.

        References:
            SQLite "Write-Ahead Logging"; PostgreSQL "Advisory Locks"; see :mod:`shared_core.stores`.
        """
        store = connect(path, synchronous=synchronous, namespace=namespace)
        return open_memory(cls, store, memory_classes, embedder=embedder, llm=llm, **kwargs)

    def attach_store(
        self,
        path: str | Path | Store,
        *,
        synchronous: str = "FULL",
        namespace: str | Sequence[str] | None = None,
    ) -> None:
        """Make this memory durable in a store: an SQLite file, a ``postgresql://`` URL (with
        ``namespace``, default ``("default",)``) or an open :class:`~shared_core.stores.Store`.

        A new (or empty) store receives the whole memory in one transaction; a store that already holds a
        memory of the same kind and configuration is loaded into this memory, which must be empty.

        Raises:
            InvalidInputError: a store is already attached, or see :meth:`open`.
            MemoryClosedError: the memory was closed.
            PersistenceError: see :meth:`open`; also both this memory and the store hold a memory.
        """
        with self._lock:
            self._check_open()
            if self._durable is not None:
                raise InvalidInputError(
                    f"A store is already attached ({self._durable.location}); call close_store() first."
                )
            store = connect(path, synchronous=synchronous, namespace=namespace)
            try:
                attach_store(self._mem(), store)
            except BaseException:
                store.close()
                raise

    def close_store(self) -> None:
        """Close the durable store (the memory stays usable in memory only; idempotent)."""
        with self._lock:
            store, self._durable = self._durable, None
        if store is not None:
            store.close()

    @property
    def store_path(self) -> Path | None:
        """Path of the attached SQLite store, or ``None`` (no store, or a PostgreSQL one)."""
        return getattr(self._durable, "path", None)

    @property
    def store_location(self) -> str | None:
        """What the attached store is called: its path, or its URL (without the password) and namespace;
        ``None`` without a store."""
        return self._durable.location if self._durable is not None else None

    def refresh(self) -> None:
        """Apply now what other processes committed to the attached shared store (PostgreSQL); ``add``,
        ``delete``, ``retrieve``, ``len()`` and ``stats()`` do this themselves. A no-op
        without a store or with an SQLite one.

        Raises:
            PersistenceError: the store cannot be read (the memory is unchanged).
        """
        with self._lock:
            self._sync_store()

    def _sync_store(self) -> None:
        self._check_open()
        if self._durable is not None:
            self._durable.sync(self)

    def _restore(self, data: dict[str, Any], index: NodeIndex | None) -> None:
        self._store = NodeStore.from_dict(data["tree"], self.contiguous_spans)
        self._set_state(data.get("state") or {})
        self._usage = Usage(**data.get("usage", {}))
        self._index = index
        self._lexical = None
        self._version += 1
        self._query_memo = None
