"""The store interface every durable backend implements, and binding a store to a memory.

A memory with a store calls it at fixed points of every transaction (see ``HierarchicalMemory``):

- ``begin(mem)`` before an ``add`` / ``delete`` starts: a shared store brings ``mem`` up to date with
  what other processes committed (it holds no lock and no transaction while the memory computes);
- ``commit(mem)`` with the transaction complete in memory: writes it in one database transaction (the
  change is acknowledged only when this returns). A shared store raises :class:`WriteConflictError`
  when another process committed since ``begin``; the memory then rolls back and runs the transaction
  again from ``begin(mem, exclusive=True)``, which holds the store's writer lock until the write ends
  (at most :attr:`Store.write_attempts` attempts in all);
- ``abort()`` when the transaction failed before or inside ``commit``;
- ``landed(seq)`` when ``commit`` or ``clear`` raised: whether the write was committed all the same
  (``True`` / ``False``), or :class:`~shared_core.types.CommitUnknownError` when that cannot be told;
- ``sync(mem)`` before a retrieval: brings ``mem`` up to date without taking any lock;
- ``clear(mem)``, ``initialize(mem)``, ``meta()``, ``load_into(mem)``, ``close()``.

The encoding of rows is shared (:mod:`shared_core.stores.encoding`); backends differ only in their SQL,
their locking and their error types. Nothing here imports :mod:`shared_core.memories.base`.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..types import InvalidInputError, NamespaceBusyError, PersistenceError, UnknownPolicyError
from .encoding import check_memory_format, dumps

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory
    from ..models.base import LLM, Embedder

__all__ = ["Store", "WriteConflictError", "attach_store", "check_embedder_dim", "open_memory"]

M = TypeVar("M", bound="HierarchicalMemory")


class WriteConflictError(NamespaceBusyError):
    """Raised by a shared store's :meth:`Store.commit`: another process committed to the store since
    :meth:`Store.begin`, so the change was computed from an old state; nothing was written. The memory
    rolls back and computes the change again; when every attempt is overtaken the caller gets this
    error (a :class:`~shared_core.types.NamespaceBusyError`)."""


class Store(abc.ABC):
    """A durable home of one memory: every acknowledged change of the memory is committed here.

    Attributes:
        FORMAT: version of the backend's layout (the ``format`` metadata key).
        location: what the store is called in messages (a path, or a URL without its password).
    """

    FORMAT: ClassVar[int]
    location: str
    #: How many times a memory computes a write whose :meth:`commit` raises :class:`WriteConflictError`
    #: (a store that one process owns never raises it).
    write_attempts: int = 1

    # ------------------------------------------------------------------ change sequence
    @property
    @abc.abstractmethod
    def seq(self) -> int:
        """Number of the last committed write this process's memory reflects."""

    @abc.abstractmethod
    def landed(self, seq: int) -> bool:
        """After a write raised: whether it was committed all the same (then :attr:`seq` counts it).

        Args:
            seq: the number the write was to get (:attr:`seq` + 1 before it started).

        Returns:
            ``True`` when the database holds that write, ``False`` when it does not.

        Raises:
            CommitUnknownError: the store cannot tell (a shared store whose server went away during
                the ``COMMIT``); it then reloads the memory from the database at its next catch-up.
        """

    # ------------------------------------------------------------------ reading
    @abc.abstractmethod
    def meta(self) -> dict[str, Any] | None:
        """The stored metadata (decoded JSON), or ``None`` for a new, empty store.

        Raises:
            PersistenceError: malformed metadata or an unreadable store.
            VersionMismatchError: another store layout.
        """

    @abc.abstractmethod
    def load_into(self, mem: HierarchicalMemory) -> None:
        """Rebuild ``mem``'s node store, state and FAISS index from the store (one consistent snapshot).

        Raises:
            PersistenceError: the stored tree or vectors are malformed or inconsistent.
        """

    def sync(self, mem: HierarchicalMemory) -> None:  # noqa: B027
        """Apply to ``mem`` what other writers committed since :attr:`seq` (a no-op for a store one
        process owns). Never waits for a writer.

        Raises:
            PersistenceError: the store cannot be read (``mem`` is unchanged).
        """

    # ------------------------------------------------------------------ writing
    @abc.abstractmethod
    def initialize(self, mem: HierarchicalMemory) -> bool:
        """Write the whole of ``mem`` (config, state, every node and vector) in one transaction.

        Returns:
            ``True`` when written; ``False`` when another writer initialised the store first (nothing
            is written; load the stored memory instead).

        Raises:
            PersistenceError: the write failed (nothing is written).
        """

    def begin(self, mem: HierarchicalMemory, exclusive: bool = False) -> None:  # noqa: B027
        """Prepare a write of ``mem``: a shared store catches up with what other writers committed.

        Args:
            mem: the memory.
            exclusive: the write is computed again after a :class:`WriteConflictError`: a shared store
                then holds its writer lock until the write ends, so it cannot be overtaken again.

        Raises:
            NamespaceBusyError: (exclusive) the writer lock was not free in time.
            PersistenceError: the store cannot be reached (nothing is held, ``mem`` is unchanged).
        """

    @abc.abstractmethod
    def commit(self, mem: HierarchicalMemory) -> None:
        """Write the open transaction of ``mem`` (nodes touched, created or removed, vectors of nodes
        whose text changed, state, usage and counters) in one database transaction.

        Raises:
            WriteConflictError: another writer committed since :meth:`begin` (nothing is written; the
                caller rolls back and may compute the change again).
            PersistenceError: the write failed; the caller asks :meth:`landed`, and rolls back unless
                it landed.
        """

    def abort(self) -> None:  # noqa: B027
        """The transaction of the memory failed: roll back whatever the store holds open (idempotent)."""

    @abc.abstractmethod
    def clear(self, mem: HierarchicalMemory) -> None:
        """Forget every node and vector; configuration and usage stay.

        Raises:
            PersistenceError: the write failed (nothing is written).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's connections and locks (idempotent)."""


# --------------------------------------------------------------------------- memory integration
def check_embedder_dim(mem: Any, dim: int, stored: str, verb: str) -> None:
    """Raise :class:`PersistenceError` when the memory's embedder does not give ``dim``-d vectors.

    An embedder that cannot tell its dimension is let through (its first vectors are checked then).
    The message reads ``"<stored> <dim>-d vectors but the embedder gives <n>-d; <verb> it with the embedder
    it was built with."``.
    """
    try:
        edim = int(mem.embedder.dim)
    except Exception:
        return
    if edim != dim:
        raise PersistenceError(
            f"{stored} {dim}-d vectors but the embedder gives {edim}-d; {verb} it with the embedder it "
            "was built with."
        )


def _check_config(mem: HierarchicalMemory, meta: dict[str, Any], location: str) -> None:
    if meta["kind"] != mem.kind:
        raise PersistenceError(
            f"{location} holds a {meta['kind']} memory, not a {mem.kind} one; open it with "
            "HierarchicalMemory.open(...) or use another store."
        )
    mine = json.loads(dumps(mem._config()))
    stored = json.loads(dumps(mem.stored_config(meta["config"])))
    if mine != stored:
        diff = sorted(k for k in set(mine) | set(stored) if mine.get(k) != stored.get(k))
        raise PersistenceError(
            f"{location} was created with another configuration ({', '.join(diff)} differ); open it with "
            f"{type(mem).__name__}.open(...) to use the stored configuration."
        )


def attach_store(mem: HierarchicalMemory, store: Store) -> None:
    """Bind ``store`` to ``mem``: load the stored memory into an empty ``mem``, or write ``mem`` into a
    new store. Call with ``mem``'s lock held; on success ``mem._durable`` is ``store``.

    Raises:
        PersistenceError: both hold a memory, or the stored kind / config / dimension differ from
            ``mem``'s, or the store is corrupt.
        VersionMismatchError: the store holds another memory format.
    """
    meta = store.meta()
    if meta is None and store.initialize(mem):
        mem._durable = store
        return
    meta = meta if meta is not None else store.meta()
    if meta is None:  # initialised by another writer, then cleared away again: start over
        raise PersistenceError(f"{store.location} changed while it was being opened; open it again.")
    check_memory_format(meta, mem.FORMAT_VERSION, store.location)
    if mem._store.nodes or mem._store.n_inserted:
        raise PersistenceError(
            f"{store.location} already holds a memory and this one is not empty; attach a new store, or "
            "open the stored memory with HierarchicalMemory.open(...)."
        )
    _check_config(mem, meta, store.location)
    dim = meta.get("dim")
    if isinstance(dim, int):
        check_embedder_dim(mem, dim, f"{store.location} holds", "open")
    store.load_into(mem)
    mem._durable = store


def open_memory(
    cls: type[M],
    store: Store,
    classes: Mapping[str, type[HierarchicalMemory]] | Callable[[], Mapping[str, type[HierarchicalMemory]]],
    *,
    embedder: Embedder | None = None,
    llm: LLM | None = None,
    **kwargs: Any,
) -> M:
    """Open (or create) the memory held by ``store`` (see :meth:`HierarchicalMemory.open`).

    Args:
        cls: the class ``open`` was called on (``HierarchicalMemory`` dispatches on the stored kind).
        store: an open store; closed again when this raises.
        classes: the memory classes by kind (or a callable returning them).
        embedder: the embedder.
        llm: the LLM.
        **kwargs: constructor arguments (see :meth:`HierarchicalMemory.open`).

    Returns:
        The memory, bound to ``store``.

    Raises:
        InvalidInputError: a new store opened through ``HierarchicalMemory`` itself, or an argument
            that contradicts the stored configuration.
        PersistenceError: the store holds another or an unknown kind, or is corrupt.
        VersionMismatchError: written by another format version.
    """
    try:
        meta = store.meta()
        if meta is None:
            if cls.kind == "memory":
                raise InvalidInputError(
                    f"{store.location} is a new store; create it with a memory class, e.g. "
                    "SegTreeMem.open(..., embedder=...)."
                )
            mem = cls(embedder, llm, **kwargs)
        else:
            check_memory_format(meta, cls.FORMAT_VERSION, store.location)
            known = classes() if callable(classes) else classes
            klass: type[HierarchicalMemory] | None = (
                cls if cls.kind == meta["kind"] else known.get(meta["kind"])
            )
            if klass is None:
                raise PersistenceError(f"{store.location} holds an unknown memory kind {meta['kind']!r}.")
            if cls.kind not in ("memory", klass.kind):
                raise PersistenceError(
                    f"{store.location} holds a {meta['kind']} memory; open it with {klass.__name__}.open or "
                    "HierarchicalMemory.open."
                )
            config = klass.stored_config(meta["config"])
            clash = sorted(k for k, v in kwargs.items() if k in config and json.loads(dumps(v)) != config[k])
            if clash:
                raise InvalidInputError(
                    f"{store.location} was created with {', '.join(f'{k}={config[k]!r}' for k in clash)}; "
                    "the stored configuration is kept: drop these arguments or use a new store."
                )
            extra = {k: v for k, v in kwargs.items() if k not in config}
            try:
                mem = klass(embedder, llm, **config, **extra)  # type: ignore[assignment]
            except (TypeError, InvalidInputError, UnknownPolicyError) as e:
                raise PersistenceError(f"The stored config does not fit {klass.__name__}: {e}") from None
        with mem._lock:
            attach_store(mem, store)
    except BaseException:
        store.close()
        raise
    return mem  # type: ignore[return-value]
