"""Durable stores of memories: one interface, an SQLite and a PostgreSQL backend sharing one row encoding.

- :class:`SQLiteStore` (``shared_core.durable.DurableStore``): one memory in one database file, owned
  by one process (exclusive lock).
- :class:`PostgresStore`: one memory per namespace of a PostgreSQL database, shared by any number of
  processes and machines (needs the ``postgres`` extra: ``pip install 'hiermem[postgres]'``).

:func:`connect` picks the backend from its target: a ``postgresql://`` URL or a file path. Use through
the memories: ``SegTreeMem.open("mem.sqlite")``, ``SegTreeMem.open("postgresql://...", namespace=...)``,
``SegTreeMem(store="postgresql://...")`` or ``MemoryStore(factory, url="postgresql://...")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..types import InvalidInputError
from .base import Store, WriteConflictError, attach_store, check_embedder_dim, open_memory
from .namespace import Namespace, NamespaceLike, normalize_namespace
from .sqlite import SYNCHRONOUS, DurableStore, SQLiteStore

if TYPE_CHECKING:
    from .postgres import PostgresDatabase, PostgresStore

__all__ = [
    "DEFAULT_NAMESPACE",
    "SYNCHRONOUS",
    "DurableStore",
    "Namespace",
    "NamespaceLike",
    "PostgresDatabase",
    "PostgresStore",
    "SQLiteStore",
    "Store",
    "WriteConflictError",
    "attach_store",
    "check_embedder_dim",
    "connect",
    "is_postgres_url",
    "normalize_namespace",
    "open_memory",
]

#: Namespace of a memory opened from a PostgreSQL URL without ``namespace=``.
DEFAULT_NAMESPACE: Namespace = ("default",)


def is_postgres_url(target: Any) -> bool:
    """Whether ``target`` is a PostgreSQL URL (a string starting with ``postgresql://`` or ``postgres://``)."""
    return isinstance(target, str) and target.strip().lower().startswith(("postgresql://", "postgres://"))


def connect(
    target: str | Path | Store,
    *,
    synchronous: str = "FULL",
    namespace: NamespaceLike | None = None,
) -> Store:
    """Open the store named by ``target``.

    Args:
        target: a ``postgresql://`` URL, the path of an SQLite file, or an open :class:`Store` (returned
            as it is).
        synchronous: SQLite's ``synchronous`` (``"FULL"``, ``"EXTRA"`` or ``"NORMAL"``); a PostgreSQL
            server decides its own durability (``synchronous_commit``), so only ``"FULL"`` is accepted
            with a URL.
        namespace: the namespace of a PostgreSQL store, a string or a tuple of strings, default
            ``("default",)``; not accepted with a path (use ``MemoryStore`` for one file per namespace).

    Returns:
        The store.

    Raises:
        InvalidInputError: a malformed URL or namespace, an option the backend does not have, or the
            ``postgres`` extra is not installed.
        PersistenceError: the store cannot be opened (see the backends).
        VersionMismatchError: the store has another layout version.
    """
    if isinstance(target, Store):
        if namespace is not None:
            raise InvalidInputError("namespace= is given by the store itself; drop it or pass a URL.")
        return target
    if is_postgres_url(target):
        if not isinstance(synchronous, str) or synchronous.upper() != "FULL":
            raise InvalidInputError(
                "synchronous= applies to SQLite stores; a PostgreSQL server's durability is its "
                "synchronous_commit setting."
            )
        from .postgres import PostgresStore

        return PostgresStore(str(target), namespace if namespace is not None else DEFAULT_NAMESPACE)
    if isinstance(target, str) and "://" in target:
        raise InvalidInputError(
            f"Unknown store URL scheme in {target.split('://', 1)[0]!r}://...; give a postgresql:// URL or "
            "the path of an SQLite file."
        )
    if not isinstance(target, (str, Path)):
        raise InvalidInputError(
            f"A store is a postgresql:// URL or a file path, got {type(target).__name__}."
        )
    if namespace is not None:
        raise InvalidInputError(
            "namespace= applies to PostgreSQL stores; an SQLite file holds one memory (use "
            "MemoryStore(factory, root_dir, durable=True) for one file per namespace)."
        )
    return SQLiteStore(target, synchronous=synchronous)


def __getattr__(name: str) -> Any:  # the PostgreSQL backend loads psycopg only when used
    if name in ("PostgresStore", "PostgresDatabase"):
        from . import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module 'shared_core.stores' has no attribute {name!r}")
