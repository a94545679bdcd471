"""A :class:`~langchain_hiermem.store.HierMemStore` that survives restarts: items and memories in a database.

Open it with ``HierMemStore.from_conn_string(conn)``: ``conn`` is the path of an SQLite file or a
``postgresql://`` URL. Two things are kept:

- **items** (namespace, key, value as JSON, timestamps, the order of insertion and the memory leaves that
  index each item) in three tables, created by :meth:`DurableHierMemStore.setup` (also on first open),
  in the SQLite file itself or in the PostgreSQL schema ``hiermem_langgraph``; their layout is in
  :mod:`langchain_hiermem.store_items`.

- **the memory of each namespace**, through :class:`~shared_core.namespaces.MemoryStore`: one SQLite
  store per namespace in the directory ``<file>.memories`` next to the SQLite file, or the ``hiermem``
  schema of the same PostgreSQL database. The memory of the LangGraph namespace ``("users", "ann")`` is
  the MemoryStore namespace ``("langgraph", "users", "ann")``, so a namespace has at most 7 labels.

A run of puts first adds the new texts to each namespace's memory (each add is committed by the
memory's store), then writes the items and their leaves in ONE transaction, then deletes the replaced
texts from the memories. If the item transaction fails, the new texts are deleted again: items and
memories are as before. If its ``COMMIT`` got no reply, the server is asked whether it landed: if it
did, the put succeeded; if the server cannot tell (:class:`~shared_core.types.CommitUnknownError`), the
new texts are kept and the store reloads its items from the database before its next operation, which
reconciles the memories with them as a reopen does. A process killed between two of these steps leaves
memory leaves that no item records; they are deleted when the namespace's memory is next opened, so a
reopened store has exactly the items whose write was committed, each indexed by its own texts.

SQLite: one process owns a store at a time (an exclusive lock on the file), so the items kept in RAM
never go stale; a second opener gets :class:`PersistenceError`. PostgreSQL: many processes share a
store. Before each operation a process reads the items of the namespaces other processes wrote since
its last look, and only those (the memories catch up by themselves); a run of puts, a sweep of a
namespace, a refreshed TTL and any repair of a memory run under the write locks of the namespaces they
write, after that catch-up, so they never overwrite another process's write, writers of other
namespaces never wait for them, and texts a killed writer left in a memory are deleted by the next
writer of that namespace. A lock is waited for at most the URL's ``lock_timeout=`` seconds (default
60), then :class:`~shared_core.types.NamespaceBusyError`.
Values must be JSON-serialisable: they are stored and returned as JSON (tuples become lists).

References:
    LangGraph ``PostgresStore.from_conn_string`` / ``SqliteStore.from_conn_string``;
    :mod:`shared_core.namespaces`; :mod:`shared_core.stores`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

from langgraph.store.base import IndexConfig, InvalidNamespaceError, Item, Op, PutOp, Result, TTLConfig

from shared_core.memories.base import HierarchicalMemory
from shared_core.namespaces import DEFAULT_MAX_RESIDENT, MemoryStore, check_max_resident
from shared_core.stores.namespace import MAX_PARTS, namespace_key, normalize_namespace
from shared_core.types import (
    CommitUnknownError,
    HierMemError,
    InvalidInputError,
    NodeNotFoundError,
    PersistenceError,
)

from .retrievers import HierMemRetriever
from .store import (
    HierMemStore,
    MemoryFactory,
    Namespace,
    _Added,
    _as_namespace,
    _Space,
    register_durable_store,
)
from .store_items import (
    _ADD_SPACE,
    _DELETE_ITEM,
    _SET_EXPIRY,
    _SET_LEAVES,
    _UPSERT_ITEM,
    FORMAT,
    KIND,
    SCHEMA,
    Statement,
    _dumps,
    _ItemsDB,
    _PostgresItems,
    _SQLiteItems,
    _target,
)
from .store_semantics import json_form
from .store_ttl import Expiry

__all__ = ["FORMAT", "KIND", "MEMORY_PREFIX", "SCHEMA", "DurableHierMemStore"]

#: First label of the MemoryStore namespace of every LangGraph namespace.
MEMORY_PREFIX = "langgraph"


@register_durable_store
class DurableHierMemStore(HierMemStore):
    """A :class:`HierMemStore` whose items and memories are kept in a database (see the module docstring).

    Open it with ``HierMemStore.from_conn_string(conn, ...)`` (closed at the end of the ``with``
    block), or construct it and call :meth:`close`. Everything else is :class:`HierMemStore`: the same
    text fields, search, filters and ordering, and the same results after a reopen.

    Args:
        conn: the path of an SQLite file (created when absent; the memories go to the directory
            ``<file>.memories`` next to it) or a ``postgresql://user:password@host:5432/dbname`` URL.
        index: LangGraph's ``IndexConfig`` (``dims``, ``embed``, ``fields``).
        memory_factory: builds the memory of a namespace (see :class:`HierMemStore`); it must build the
            same configuration every time, since a stored memory is reopened with it.
        embedder: a core embedder or a LangChain ``Embeddings`` (instead of ``index``).
        fields: default text fields (instead of ``index``).
        memory_kwargs: keyword arguments of the default ``SegTreeMem``.
        policy: retrieval policy of query searches.
        search_kwargs: the policy's parameters.
        synchronous: SQLite's ``synchronous`` for the items and the memories: ``"FULL"`` (default; an
            acknowledged put survives power loss), ``"EXTRA"`` or ``"NORMAL"`` (survives a process crash).
            A PostgreSQL server decides its own durability; only ``"FULL"`` is accepted with a URL.
        pool_size: most connections of each of the memories' two PostgreSQL pools, default 8.
        score: what ``SearchItem.score`` holds (see :class:`HierMemStore`), default ``"similarity"``.
        ttl: LangGraph's ``TTLConfig`` (see :class:`HierMemStore`), default ``None``. Each item's TTL and
            expiry are stored with it, so they hold across a reopen; a read that refreshes a TTL writes
            the new expiry.
        max_resident: most namespace memories kept open at once, default 256
            (:data:`~shared_core.namespaces.DEFAULT_MAX_RESIDENT`); ``None``: no limit. The least recently
            used ones beyond it are closed (their SQLite files or PostgreSQL registration released) and
            dropped by the store, and reopened from the database on their next use: nodes and vectors are
            read back, nothing is embedded again. The items (keys, values, leaves) of every namespace stay
            in RAM; only the memories are bounded. See :class:`~shared_core.namespaces.MemoryStore`.

    Raises:
        InvalidInputError: a malformed path or URL, a bad argument (see :class:`HierMemStore`),
            ``max_resident`` not a positive integer or ``None``.
        PersistenceError: the file or database is not a hiermem LangGraph store, the SQLite file is in
            use by another process, the server cannot be reached or refuses the login.
        VersionMismatchError: the items or the memories were written by another layout version.
    """

    def __init__(
        self,
        conn: str | os.PathLike[str],
        *,
        index: IndexConfig | None = None,
        memory_factory: MemoryFactory | None = None,
        embedder: Any = None,
        fields: list[str] | None = None,
        memory_kwargs: dict[str, Any] | None = None,
        policy: str | None = None,
        search_kwargs: dict[str, Any] | None = None,
        synchronous: str = "FULL",
        pool_size: int = 8,
        score: str = "similarity",
        ttl: TTLConfig | None = None,
        max_resident: int | None = DEFAULT_MAX_RESIDENT,
    ) -> None:
        max_resident = check_max_resident(max_resident)
        super().__init__(
            ttl=ttl,
            score=score,
            memory_factory=memory_factory,
            embedder=embedder,
            fields=fields,
            memory_kwargs=memory_kwargs,
            policy=policy,
            search_kwargs=search_kwargs,
            index=index,
        )
        kind, where = _target(conn)
        if not isinstance(synchronous, str) or synchronous.upper() not in ("FULL", "EXTRA", "NORMAL"):
            raise InvalidInputError(f"synchronous must be 'FULL', 'EXTRA' or 'NORMAL', got {synchronous!r}.")
        if kind == "postgres" and synchronous.upper() != "FULL":
            raise InvalidInputError(
                "synchronous= applies to SQLite stores; a PostgreSQL server's durability is its "
                "synchronous_commit setting."
            )
        self._closed = True
        self._pending: Iterable[_Added] = ()
        self._created: list[tuple[Namespace, HierarchicalMemory]] = []
        self._probed: set[Namespace] = set()
        self._held: set[Namespace] = set()  # namespaces whose space holds its memory
        self._evictions_seen = -1  # the MemoryStore's evictions at the last _let_go
        self._reconciled: set[Namespace] = set()
        self._shared = kind == "postgres"  # several processes may use the store
        self._writers = 0  # depth of _writing() in this process
        self._space_pos: dict[Namespace, int] = {}
        self._item_pos: dict[tuple[Namespace, str], int] = {}
        self._next_space = self._next_item = 0
        self._seq = 0
        self._resync = False  # an item COMMIT's outcome is unknown: reload the items first
        self._db: _ItemsDB
        self._memories: MemoryStore | None = None
        if kind == "sqlite":
            memdir = where.with_name(where.name + ".memories")
            if memdir.exists() and not memdir.is_dir():
                raise PersistenceError(
                    f"{memdir} is a file; the store keeps its memories in a directory of that name. Move "
                    "the file away or give another path."
                )
            self._db = _SQLiteItems(where, synchronous.upper())
            self.location = str(where)
        else:
            self._db = _PostgresItems(where)
            self.location = self._db.location
        try:
            if kind == "sqlite":
                self._memories = MemoryStore(
                    self._memory_for,
                    memdir,
                    durable=True,
                    synchronous=synchronous.upper(),
                    max_resident=max_resident,
                )
            else:
                self._memories = MemoryStore(
                    self._memory_for, url=where, pool_size=pool_size, max_resident=max_resident
                )
            self._db.setup()
            self._load()
        except BaseException:
            self._shut()
            raise
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Create the item tables when absent, else check them (idempotent; also done on open).

        Raises:
            PersistenceError: the database is not a hiermem LangGraph store or cannot be written.
            VersionMismatchError: another item format.
        """
        with self._lock:
            self._check_open()
            self._db.setup()

    def close(self) -> None:
        """Stop the TTL sweeper, close the memories' stores and the item database, releasing the store
        (idempotent)."""
        self.stop_ttl_sweeper()
        with self._lock:
            self._closed = True
            self._shut()

    def _shut(self) -> None:
        mems, self._memories = self._memories, None
        try:
            if mems is not None:
                mems.close()
        finally:
            self._db.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> DurableHierMemStore:
        """The store itself; :meth:`close` at the end of the ``with`` block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    def __repr__(self) -> str:
        return f"DurableHierMemStore({self.location!r}, namespaces={len(self._spaces)})"

    def _check_open(self) -> MemoryStore:
        """The MemoryStore; raises :class:`PersistenceError` once the store is closed."""
        if self._closed or self._memories is None:
            raise PersistenceError(f"The LangGraph store {self.location} is closed; open it again.")
        return self._memories

    def _start(self) -> None:
        """Before an operation: the store is open, and its items are those of the database (reloaded
        after a write whose outcome was unknown; each memory is then reconciled with them on first use,
        as after a reopen).

        Raises:
            PersistenceError: the store is closed, or the items cannot be reloaded (tried again next time).
        """
        self._check_open()
        if self._resync:
            self._reload()
        elif self._shared:
            self._catch_up()

    def _catch_up(self) -> None:
        """Apply what other processes committed since this one last looked (PostgreSQL): the items of
        the namespaces written since are read again, no other (see :meth:`_PostgresItems.changes`); the
        memories open in this process stay open (they catch up by themselves).

        Raises:
            PersistenceError: the changes cannot be read (nothing changes; tried again next time), or
                hold a malformed row (the whole store is read again before the next operation).
        """
        got = self._db.changes()  # type: ignore[attr-defined]
        if got is None:
            return
        keys, spaces, items = got
        try:
            changed = [tuple(normalize_namespace(json.loads(k))) for k in keys]
        except (TypeError, ValueError, InvalidInputError) as e:
            self._resync = True
            raise PersistenceError(
                f"{self.location} holds a malformed row ({e}); the store is corrupt."
            ) from None
        new = False
        for ns in changed:
            space = self._spaces.get(ns)
            if space is None:
                new = True
                continue
            for key in space.items:
                self._item_pos.pop((ns, key), None)
            for part in (space.items, space.leaves, space.texts, space.expiry):
                part.clear()  # refilled in place: a space object keeps its identity
            if space.memory is None:
                self._probed.discard(ns)  # another process may have created its memory
        try:
            self._fill(spaces, items)
        except PersistenceError:
            self._resync = True
            raise
        if new:  # namespaces in order of creation, as a full load gives them
            order = sorted(self._spaces, key=lambda ns: (self._space_pos.get(ns, 0), namespace_key(ns)))
            self._spaces = {ns: self._spaces[ns] for ns in order}

    def _reload(self) -> None:
        """Read the items again (another process wrote, or a write's outcome was unknown); the memories
        open in this process stay open (they catch up by themselves), and are reconciled with the items
        by the next writer that uses them.

        Raises:
            PersistenceError: the items cannot be read (nothing changes; tried again next time).
        """
        saved = (dict(self._spaces), dict(self._space_pos), dict(self._item_pos), set(self._probed))
        opened = {ns: sp.memory for ns, sp in self._spaces.items() if sp.memory is not None}
        for table in (self._spaces, self._space_pos, self._item_pos, self._probed):
            table.clear()
        try:
            self._load()
        except BaseException:
            self._spaces, self._space_pos, self._item_pos, self._probed = saved
            raise
        self._held.clear()
        self._evictions_seen = -1
        for ns, mem in opened.items():
            if ns in self._spaces:
                self._spaces[ns].memory = mem
                self._probed.add(ns)
                self._held.add(ns)
        self._reconciled.clear()
        self._resync = False

    @contextmanager
    def _writing(self, namespaces: Iterable[Namespace]) -> Iterator[None]:
        """Hold the write locks of ``namespaces`` (PostgreSQL; reentrant) with their items as the
        database holds them: a writer catches up with what other processes wrote and repairs the memories
        it uses (see :meth:`_reconcile`). Writers of other namespaces never wait for it.

        Raises:
            NamespaceBusyError: another process kept writing one of them for longer than the URL's
                ``lock_timeout`` (default 60 s); no lock is kept.
            PersistenceError: the store is closed or the database failed.
        """
        if not self._shared:
            yield
            return
        self._check_open()
        wanted = {namespace_key(ns): ns for ns in namespaces}
        taken = self._db.lock_namespaces(wanted)  # type: ignore[attr-defined]
        self._writers += 1
        try:
            for key in taken:  # a writer killed since may have left texts in its memory
                self._reconciled.discard(wanted[key])
            if taken or self._writers == 1:
                self._start()
            yield
        finally:
            self._writers -= 1
            self._db.unlock_namespaces(taken)  # type: ignore[attr-defined]

    def _let_go(self) -> None:
        """Drop the memories the MemoryStore evicted (to stay within ``max_resident``), so their RAM is
        freed; the next use of such a namespace opens its memory again from the database. Called at the
        end of each operation, with the store's lock held (no run of puts holds a memory then)."""
        mems = self._memories
        if mems is None or mems.stats()["evictions"] == self._evictions_seen:
            return  # nothing evicted since the last look: every memory held is still resident
        self._evictions_seen = mems.stats()["evictions"]
        for ns in list(self._held):
            space = self._spaces.get(ns)
            if space is None or space.memory is None:
                self._held.discard(ns)
            elif not mems.is_resident(self._memory_ns(ns)):
                space.memory = None
                self._probed.discard(ns)
                self._held.discard(ns)

    # ------------------------------------------------------------------ loading
    def _load(self) -> None:
        """Read every namespace and item (memories open on first use)."""
        seq, spaces, items = self._db.load()
        self._fill(spaces, items)
        self._seq = seq
        self._next_space = max(self._space_pos.values(), default=-1) + 1
        self._next_item = max(self._item_pos.values(), default=-1) + 1

    def _fill(self, spaces: list[Any], items: list[Any]) -> None:
        """Add rows of the spaces and items tables (in pos order) to the spaces in RAM.

        Raises:
            PersistenceError: a malformed row.
        """
        try:
            for ns_text, pos in spaces:
                ns = tuple(normalize_namespace(json.loads(ns_text)))
                self._spaces.setdefault(ns, _Space())
                self._space_pos[ns] = int(pos)
                self._next_space = max(self._next_space, int(pos) + 1)
            for ns_text, key, value, created, updated, pos, leaves, minutes, expires in items:
                ns = tuple(normalize_namespace(json.loads(ns_text)))
                space = self._spaces.get(ns)
                if space is None:  # never written without its namespace row; kept readable all the same
                    space = self._spaces[ns] = _Space()
                    self._space_pos[ns] = max(self._space_pos.values(), default=-1) + 1
                val = json.loads(value)
                if not isinstance(val, dict):
                    raise ValueError(f"the value of {key!r} is not an object")
                space.items[str(key)] = Item(
                    value=val,
                    key=str(key),
                    namespace=ns,
                    created_at=datetime.fromisoformat(created),
                    updated_at=datetime.fromisoformat(updated),
                )
                pairs = json.loads(leaves)
                if pairs:
                    space.leaves[str(key)] = [int(lid) for lid, _ in pairs]
                    space.texts[str(key)] = [str(text) for _, text in pairs]
                self._item_pos[(ns, str(key))] = int(pos)
                self._next_item = max(self._next_item, int(pos) + 1)
                if minutes is not None:
                    at = datetime.fromisoformat(expires)
                    if at.tzinfo is None:
                        raise ValueError(f"the expiry of {key!r} has no time zone")
                    space.expiry[str(key)] = (float(minutes), at)
        except (TypeError, ValueError, InvalidInputError) as e:
            raise PersistenceError(
                f"{self.location} holds a malformed row ({e}); the store is corrupt."
            ) from None

    # ------------------------------------------------------------------ memories
    @staticmethod
    def _memory_ns(ns: Namespace) -> Namespace:
        """The MemoryStore namespace of a LangGraph namespace."""
        return (MEMORY_PREFIX, *ns)

    def _memory_for(self, memory_ns: Namespace) -> HierarchicalMemory:
        """The MemoryStore's factory: the store's checked factory, for the LangGraph namespace."""
        return self._build_memory(tuple(memory_ns[1:]), self._pending)

    def _memory(self, namespace: Namespace, space: _Space) -> HierarchicalMemory | None:
        """The namespace's memory, opened from the database on first use (then reconciled with the items)."""
        if space.memory is None and namespace not in self._probed:
            mems = self._check_open()
            space.memory = mems.get(self._memory_ns(namespace))
            self._probed.add(namespace)
        if space.memory is not None:
            self._held.add(namespace)
        if namespace not in self._reconciled and (
            not self._shared or self._db.holds(namespace_key(namespace))  # type: ignore[attr-defined]
        ):
            self._reconcile(namespace, space, space.memory)
            self._reconciled.add(namespace)
        return space.memory

    def _new_memory(self, namespace: Namespace, pending: Iterable[_Added] = ()) -> HierarchicalMemory:
        """The namespace's memory in the MemoryStore, created there (and recorded, so a failed run of puts
        drops it again); one found stored after all is reconciled with the items."""
        mems = self._check_open()
        mem_ns = self._memory_ns(namespace)
        existed = mem_ns in mems
        self._pending = pending
        try:
            mem = mems.get_or_create(mem_ns)
        finally:
            self._pending = ()
        self._held.add(namespace)
        if not existed:
            self._created.append((namespace, mem))
        elif len(mem):
            self._reconcile(namespace, self._spaces.get(namespace) or _Space(), mem)
        self._probed.add(namespace)
        self._reconciled.add(namespace)
        return mem

    def _reconcile(self, ns: Namespace, space: _Space, mem: HierarchicalMemory | None) -> None:
        """Make the items' leaves and the memory agree after a reopen.

        An item keeps only the leaves that are in the memory under its key (the others are forgotten, in
        the database as well); leaves no item records (left by a process killed in the middle of a put)
        are deleted from the memory.

        Raises:
            PersistenceError: the corrected leaves cannot be written (nothing changes).
        """
        if mem is not None and self._shared:
            mem.refresh()  # what other processes committed to the memory
        view = mem.tree_view() if mem is not None else None
        present = set(view.leaves) if view is not None else set()
        by_source = view.by_source if view is not None else {}
        fixes: dict[str, list[tuple[int, str]]] = {}
        for key, lids in space.leaves.items():
            mine = set(by_source.get(key, ()))
            keep = [
                (lid, t) for lid, t in zip(lids, space.texts.get(key, [])) if lid in present and lid in mine
            ]
            if len(keep) != len(lids):
                fixes[key] = keep
        if fixes:
            nsk = namespace_key(ns)
            stmts = [
                (_SET_LEAVES, (_dumps([list(p) for p in keep]), nsk, key)) for key, keep in fixes.items()
            ]
            self._seq = self._db.write(self._seq, stmts)
            for key, keep in fixes.items():
                if keep:
                    space.leaves[key] = [lid for lid, _ in keep]
                    space.texts[key] = [t for _, t in keep]
                else:
                    space.leaves.pop(key, None)
                    space.texts.pop(key, None)
        if mem is None or view is None:
            return
        referenced = {lid for lids in space.leaves.values() for lid in lids}
        for lid in [lid for lid in view.leaves if lid not in referenced]:
            try:
                mem.delete(lid)
            except NodeNotFoundError:
                continue
            except HierMemError as e:
                warnings.warn(
                    f"Could not remove a text no item of namespace {ns!r} holds any more ({e}); it is "
                    "removed when the store is next opened.",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def get_memory(self, namespace: tuple[str, ...]) -> HierarchicalMemory | None:
        """The core memory of a namespace (``None`` until something was indexed in it), caught up
        with what other processes committed to it (PostgreSQL).

        Raises:
            InvalidNamespaceError: a string or otherwise invalid namespace.
            PersistenceError: the store is closed, or the memory cannot be opened.
        """
        with self._lock:
            self._start()
            try:
                mem = super().get_memory(namespace)
                if mem is not None and self._shared:
                    mem.refresh()  # what other processes committed to it
                return mem
            finally:
                self._let_go()

    def as_retriever(self, namespace: tuple[str, ...], **kwargs: Any) -> HierMemRetriever:
        """A retriever over one namespace's memory (created, and the namespace recorded, when new).

        Args:
            namespace: the namespace.
            **kwargs: ``HierMemRetriever`` fields (``k``, ``policy``, ``max_tokens``, ``search_kwargs``).

        Returns:
            The retriever.

        Raises:
            InvalidNamespaceError: an invalid namespace, or one the memories cannot name.
            PersistenceError: the store is closed, or the memory cannot be opened or created.
        """
        ns = self._durable_namespace(_as_namespace(namespace))
        with self._lock, self._writing([ns]):
            self._start()
            self._created = []
            retriever = super().as_retriever(ns, **kwargs)
            if ns not in self._space_pos:
                pos = self._next_space
                self._seq = self._db.write(self._seq, [(_ADD_SPACE, (namespace_key(ns), pos))])
                self._space_pos[ns], self._next_space = pos, pos + 1
            return retriever

    # ------------------------------------------------------------------ batches
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run operations in order, as :meth:`HierMemStore.batch`; every run of puts is committed to
        the database before the next operation runs.

        Raises:
            PersistenceError: the store is closed, or the database failed (a failed run of puts leaves
                the items and the memories as before).
            InvalidInputError: a put value that is not JSON-serialisable, a key with a NUL character; see
                :meth:`HierMemStore.batch`.
            InvalidNamespaceError: see :meth:`HierMemStore.batch`; also a namespace the memories cannot
                name (more than 7 labels, a blank label, control characters, over 256 characters).
        """
        ops = list(ops)
        with self._lock:
            if self._shared and ops and all(isinstance(op, PutOp) for op in ops):
                self._check_open()  # puts alone: they catch up under their namespaces' locks
            else:
                self._start()
            try:
                return super().batch(ops)
            finally:
                self._let_go()

    @staticmethod
    def _durable_namespace(ns: Namespace) -> Namespace:
        """``ns`` when the MemoryStore can name its memory, else :class:`InvalidNamespaceError`."""
        try:
            normalize_namespace((MEMORY_PREFIX, *ns))
        except InvalidInputError as e:
            raise InvalidNamespaceError(
                f"A namespace of a durable HierMemStore has 1 to {MAX_PARTS - 1} labels of printable text, "
                f"none blank or over 256 characters; {ns!r} is not one ({e})."
            ) from None
        return ns

    def _check_put(self, op: PutOp) -> PutOp:
        """Check the namespace and key, and turn the value into its JSON form (as a reopen returns it)."""
        self._durable_namespace(tuple(op.namespace))
        key = op.key
        if not isinstance(key, str) or "\x00" in key:
            raise InvalidInputError(f"A key is a string without NUL characters, got {key!r}.")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInputError(f"The key {key!r} holds a lone surrogate; use valid text.") from None
        if op.value is None:
            return op
        try:
            value = json.loads(_dumps(op.value))
        except (TypeError, ValueError, RecursionError) as e:
            raise InvalidInputError(
                f"The value of {key!r} cannot be stored as JSON ({e}); use dicts, lists, strings, numbers "
                "(not NaN or infinity), booleans and None."
            ) from None
        return op._replace(value=value)

    @staticmethod
    def _filter_form(flt: Mapping[str, Any]) -> Mapping[str, Any]:
        """The filter in JSON form (tuples as lists), as the stored values are: ``("x", "y")`` matches a
        value put as a tuple, which comes back as a list."""
        return json_form(flt)

    def _apply_puts(self, ops: list[PutOp]) -> None:
        """:meth:`HierMemStore._apply_puts` under the write locks of its namespaces, recording the memories
        the run creates."""
        with self._writing({tuple(op.namespace) for op in ops}):
            self._created = []
            try:
                super()._apply_puts(ops)
            finally:
                self._created = []

    def _add_texts(self, ns: Namespace, ops: list[PutOp], pending: list[_Added]) -> _Added:
        """:meth:`HierMemStore._add_texts`, telling the MemoryStore's factory which memories are pending."""
        self._pending = pending
        try:
            return super()._add_texts(ns, ops, pending)
        finally:
            self._pending = ()

    def _commit_puts(self, added: list[_Added], now: datetime) -> None:
        """Write the run's items, their leaves and new namespaces in one transaction."""
        stmts: list[Statement] = []
        space_pos: dict[Namespace, int] = {}
        next_space = self._next_space
        for a in added:
            if a.ns not in self._space_pos and a.ns not in space_pos:
                space_pos[a.ns], next_space = next_space, next_space + 1
                stmts.append((_ADD_SPACE, (namespace_key(a.ns), space_pos[a.ns])))
        item_pos: dict[tuple[Namespace, str], int] = {}
        gone: list[tuple[Namespace, str]] = []
        next_item = self._next_item
        stamp = now.isoformat()
        for a in added:  # the same moves as _finish_puts makes in RAM
            nsk = namespace_key(a.ns)
            final = {op.key: op for op in a.ops}
            for key in a.removed:
                gone.append((a.ns, key))
                if final[key].value is None:
                    stmts.append((_DELETE_ITEM, (nsk, key)))
            kept = [
                k
                for k, op in final.items()
                if op.value is not None and k in a.space.items and k not in a.removed
            ]
            kept_set = set(kept)
            for key in [*kept, *a.appended]:
                prev = a.space.items.get(key) if key in kept_set else None
                pos = self._item_pos.get((a.ns, key)) if prev is not None else None
                if pos is None:
                    pos, next_item = next_item, next_item + 1
                item_pos[(a.ns, key)] = pos
                leaves = [[lid, t] for lid, t in zip(a.leaves.get(key, []), a.texts.get(key, []))]
                created = prev.created_at.isoformat() if prev is not None else stamp
                value = _dumps(final[key].value)
                expiry = self._expiry_of(final[key], now)
                ttl = (expiry[0], expiry[1].isoformat()) if expiry is not None else (None, None)
                stmts.append((_UPSERT_ITEM, (nsk, key, value, created, stamp, pos, _dumps(leaves), *ttl)))
        if not stmts:
            return
        try:
            self._seq = self._db.write(self._seq, stmts)
        except CommitUnknownError:
            # the items may be stored: keep the new texts (and the memories created for them), and
            # reload the items before the next operation, which reconciles the memories with them
            self._resync = True
            self._created = []
            for a in added:
                a.leaves.clear()
                a.texts.clear()
            raise
        self._space_pos.update(space_pos)
        self._next_space = next_space
        for k in gone:
            self._item_pos.pop(k, None)
        self._item_pos.update(item_pos)
        self._next_item = next_item

    def sweep_ttl(self) -> int:
        """:meth:`~langchain_hiermem.store_ttl.TTLMixin.sweep_ttl`, one namespace at a time (PostgreSQL:
        each under its write lock, its expired items found again there, those other processes wrote
        included; an item another process refreshed or put again meanwhile stays).

        Raises:
            PersistenceError: the store is closed or the database failed (see :meth:`batch`).
            NamespaceBusyError: another process kept writing too long.
        """
        with self._lock:
            try:
                self._start()
                now = self._clock()
                todo = [
                    ns for ns, sp in self._spaces.items() if self._expired_keys(sp, now) & sp.items.keys()
                ]
                swept = 0
                for ns in todo:  # one namespace at a time, each under its own lock, checked again there
                    with self._writing([ns]):
                        space, now = self._spaces[ns], self._clock()
                        keys = sorted(k for k in self._expired_keys(space, now) if k in space.items)
                        if keys:
                            self._apply_puts([PutOp(ns, key, None) for key in keys])
                            swept += len(keys)
                return swept
            finally:
                self._let_go()

    def _before_sweep(self) -> None:
        """A sweep needs the store open, with the database's items."""
        self._start()

    def _write_expiry(self, changed: Mapping[Namespace, Mapping[str, Expiry]]) -> None:
        """Write the refreshed expiries of read items in one transaction.

        Raises:
            PersistenceError: the write failed (the expiries stay as they were).
            CommitUnknownError: its outcome is unknown; the items are reloaded before the next operation.
        """
        stmts: list[Statement] = [
            (_SET_EXPIRY, (at.isoformat(), namespace_key(ns), key))
            for ns, keys in changed.items()
            for key, (_, at) in keys.items()
        ]
        try:
            with self._writing(changed):
                self._seq = self._db.write(self._seq, stmts)
        except CommitUnknownError:
            self._resync = True
            raise

    def _undo_puts(self, added: list[_Added]) -> None:
        """Drop the memories this failed run created (the namespaces had none before)."""
        mems = self._memories
        for ns, mem in self._created:
            space = self._spaces.get(ns)
            if space is not None and space.memory is mem:
                space.memory = None
            if mems is not None:
                with suppress(Exception):
                    mems.delete_namespace(self._memory_ns(ns))
