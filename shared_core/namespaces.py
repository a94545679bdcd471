"""MemoryStore: one hierarchical memory per namespace (user, agent, session...), never mixed.

Every namespace owns a separate memory built by a factory; adds, retrievals and deletions of one
namespace never see another's nodes. With a ``root_dir`` the memories are saved (``save()`` / lazy
loading on first access) or, with ``durable=True``, kept in one SQLite store each
(:mod:`shared_core.stores.sqlite`), so every acknowledged add is on disk. With a ``url`` every
namespace is kept in one PostgreSQL database (:mod:`shared_core.stores.postgres`) that any number of
processes and machines share: every acknowledged add is committed, and each process sees the others'
adds before its next add or retrieval.

With PostgreSQL the database, not the process, says which namespaces exist. A namespace that another
process deleted (``delete_namespace``), or deleted and created again, is noticed by the catch-up every
add and retrieval already does (the namespace's row is looked up by its id, and a re-created namespace
has a new id; no extra query): the process then forgets its stale memory of it and carries on as if it
had never opened it: a retrieval finds nothing (``[]``, as for a namespace that never existed), an add
creates the namespace again or adds to the one the other process created, ``delete`` raises
``NodeNotFoundError``, and ``list_namespaces``, ``in``, ``len``, ``get`` and ``get_or_create`` ask the
database.

A process that serves thousands of users keeps only ``max_resident`` namespaces resident (default 256:
an SQLite namespace holds two file descriptors, so 256 of them fit well under ``ulimit -n 1024``), the
least recently used durable ones are evicted: their stores are closed and the MemoryStore lets go of
them, so their RAM is freed unless the caller still holds the memory. The next access opens the
namespace again from its store (nodes and vectors are read back, nothing is embedded again). A memory
another thread is using (a MemoryStore call under way, or any call holding the memory's lock) is never
evicted; a memory a caller still holds after its eviction opens its store again on its next use (see
:mod:`shared_core.stores.resident`), so handles from ``get_or_create`` stay valid and durable. Memories
without a durable store (``root_dir=None``, or ``save()``-based ``root_dir``) are never evicted: their
data lives nowhere else.

Namespaces are tuples of strings, e.g. ``("alice", "support-bot", "2024-05-01")``; a plain string is a
one-part namespace. Any printable text is a valid part, including ``".."``, ``"/"``, ``"\\\\"`` or an
absolute path: on disk a namespace lives in a directory named from a filesystem-safe slug
(``[A-Za-z0-9_-]`` only) and a SHA-256 digest of the exact tuple, so a name can never address another
directory; the tuple itself is kept in ``namespace.json`` inside (a directory whose record names
another tuple, e.g. a copied one, is never opened as the namespace its name stands for). Control
characters (NUL included), lone surrogates, empty parts and parts over 256 characters are rejected.

Layout of ``root_dir`` (PostgreSQL keeps the namespace tuple in its ``hiermem.namespaces`` table)::

    ns-<slug>-<digest>/
        namespace.json     {"format": 1, "namespace": [...], "kind": "segtree"}
        memory/            a save (CURRENT + snapshot-*; see shared_core.stores.files), or
        memory.sqlite      the durable store (durable=True)
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import re
import shutil
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .memories.base import HierarchicalMemory
from .memories.management import check_listing
from .progress import ProgressLike, check_progress
from .stores import is_postgres_url
from .stores.base import Store
from .stores.namespace import (
    MAX_PART_CHARS,
    MAX_PARTS,
    Namespace,
    NamespaceDeletedError,
    NamespaceLike,
    normalize_namespace,
)
from .stores.resident import EvictedStore
from .types import AddReport, Hit, InvalidInputError, Message, MessageLike, PersistenceError

if TYPE_CHECKING:
    from .stores.postgres import PostgresDatabase

__all__ = [
    "DEFAULT_MAX_RESIDENT",
    "MAX_PART_CHARS",
    "MAX_PARTS",
    "MemoryStore",
    "Namespace",
    "check_max_resident",
    "NamespaceDeletedError",
    "namespace_dirname",
    "normalize_namespace",
]

#: Default ``max_resident`` of a :class:`MemoryStore`: 256 SQLite namespaces hold 512 file descriptors.
DEFAULT_MAX_RESIDENT = 256
_FORMAT = 1
_META = "namespace.json"
#: Attempts of one call whose namespace another process keeps deleting (each attempt reopens it).
_STALE_ATTEMPTS = 3
_MISSING: Any = object()
_SAVE = "memory"
_SQLITE = "memory.sqlite"


def check_max_resident(max_resident: Any) -> int | None:
    """``max_resident`` as a :class:`MemoryStore` takes it: a positive integer (most namespaces kept open
    at once) or ``None`` (no limit). Every layer that passes it on (the LangGraph store, the LlamaIndex
    memory block, the MCP server) validates it with this, so they all refuse the same values.

    Raises:
        InvalidInputError: a bool, a non-integer, or an integer below 1.
    """
    if max_resident is not None and (
        isinstance(max_resident, bool) or not isinstance(max_resident, int) or max_resident < 1
    ):
        raise InvalidInputError(
            f"max_resident must be a positive integer (namespaces kept open at once) or None (no "
            f"limit), got {max_resident!r}."
        )
    return max_resident


def namespace_dirname(ns: NamespaceLike) -> str:
    """The directory name of a namespace: ``ns-<slug>-<sha256 prefix>``, characters ``[A-Za-z0-9_-]`` only.

    The slug keeps the directory readable; the digest of the exact tuple keeps distinct namespaces
    apart (``("a/b",)``, ``("a", "b")`` and ``("a_b",)`` share a slug but not a digest).

    Raises:
        InvalidInputError: see :func:`normalize_namespace`.
    """
    parts = normalize_namespace(ns)
    slug = "-".join((re.sub(r"[^A-Za-z0-9]+", "_", p).strip("_")[:24] or "x") for p in parts)[:80]
    digest = hashlib.sha256(json.dumps(list(parts), ensure_ascii=True).encode("ascii")).hexdigest()[:20]
    return f"ns-{slug}-{digest}"


class MemoryStore:
    """Memories keyed by namespace; one memory per namespace, built by ``factory``.

    Args:
        factory: builds an empty memory; called with the namespace tuple when it takes a positional
            argument (``lambda ns: SegTreeMem(embedder=emb)``), else with none
            (``lambda: HAT(embedder=emb)``). Share one embedder between namespaces: the local model is
            loaded once that way.
        root_dir: directory for :meth:`save` and lazy loading (or the durable stores); ``None`` keeps
            everything in memory.
        durable: keep each namespace in its own SQLite store under ``root_dir`` (every acknowledged add
            is on disk; :meth:`save` then only writes what is not durable yet: nothing). Default False.
        synchronous: SQLite ``synchronous`` of the durable stores, default ``"FULL"``.
        url: keep every namespace in one PostgreSQL database instead, e.g.
            ``"postgresql://user:password@host:5432/dbname"`` (durable; shared with every other process
            that opens the same URL); not with ``root_dir``. The schema is created on first use.
        pool_size: most PostgreSQL connections of each of the store's two pools (writers, readers),
            default 8; every ``add`` in progress holds a writer connection.
        max_resident: most namespaces kept open at once, default :data:`DEFAULT_MAX_RESIDENT` (256);
            the least recently used durable ones beyond it are evicted (store closed, memory dropped)
            and reopened from their store on their next access. ``None``: never evict. Namespaces
            without a durable store are never evicted, so without ``durable``/``url`` this bounds
            nothing.

    Raises:
        InvalidInputError: ``factory`` is not callable, ``durable=True`` without ``root_dir`` or
            ``url``, both ``root_dir`` and ``url``, a malformed URL, or ``max_resident`` not a
            positive integer or ``None``.
        PersistenceError: the PostgreSQL server cannot be reached, or the database is not a hiermem
            store.
        VersionMismatchError: the database's hiermem schema has another version.

    Thread safety: the namespace table has its own lock; each memory serialises its own writers. An
    eviction never closes the store of a memory in use: it skips namespaces with a MemoryStore call under
    way and memories whose lock another thread holds.

    References:
        LangGraph ``BaseStore`` namespaces (tuples of strings); :mod:`shared_core.stores`.
    """

    def __init__(
        self,
        factory: Callable[..., HierarchicalMemory],
        root_dir: str | Path | None = None,
        *,
        durable: bool = False,
        synchronous: str = "FULL",
        url: str | None = None,
        pool_size: int = 8,
        max_resident: int | None = DEFAULT_MAX_RESIDENT,
    ) -> None:
        if not callable(factory):
            raise InvalidInputError("factory must be a callable returning a new memory.")
        max_resident = check_max_resident(max_resident)
        if url is not None:
            if root_dir is not None:
                raise InvalidInputError(
                    "Give either root_dir (files on this machine) or url (a PostgreSQL database), not both."
                )
            if not is_postgres_url(url):
                raise InvalidInputError(
                    "url must be a PostgreSQL URL such as postgresql://user:password@host:5432/dbname; "
                    "for files on this machine use root_dir=... with durable=True."
                )
        elif durable and root_dir is None:
            raise InvalidInputError(
                "durable=True keeps one SQLite store per namespace: give root_dir (or a PostgreSQL url) as "
                "well."
            )
        self.factory = factory
        self.root_dir = Path(root_dir) if root_dir is not None else None
        self.url = url.strip() if url is not None else None
        self.durable = bool(durable) or url is not None
        self.synchronous = synchronous
        self.pool_size = pool_size
        self._takes_ns = _takes_positional(factory)
        self.max_resident = max_resident
        # resident memories, least recently used first
        self._mems: OrderedDict[Namespace, HierarchicalMemory] = OrderedDict()
        # evicted memories something else still holds: reused, so a namespace never has two memories
        self._evicted: weakref.WeakValueDictionary[Namespace, HierarchicalMemory] = (
            weakref.WeakValueDictionary()
        )
        self._pins: dict[Namespace, int] = {}  # MemoryStore calls under way, per namespace
        self._openers: dict[Namespace, list[Any]] = {}  # [lock, users] of namespaces being opened
        self._revived: deque[tuple[Namespace, HierarchicalMemory]] = deque()  # reopened by their holder
        self._evictions = 0
        self._reopens = 0
        self._lock = threading.RLock()
        self._db: PostgresDatabase | None = None
        if self.url is not None:
            self._database()  # a bad URL or an unreachable server fails here, not on first use

    def _database(self) -> PostgresDatabase:
        """The PostgreSQL database (opened again after :meth:`close`)."""
        if self._db is None or self._db.closed:
            from .stores.postgres import PostgresDatabase

            assert self.url is not None
            self._db = PostgresDatabase(self.url, pool_size=self.pool_size)
        return self._db

    # ------------------------------------------------------------------ paths
    def _dir(self, ns: Namespace) -> Path:
        assert self.root_dir is not None
        root = self.root_dir.resolve()
        d = root / namespace_dirname(ns)
        if d.parent != root:  # cannot happen with the slug alphabet; kept as a guard
            raise PersistenceError(f"Namespace {ns!r} maps outside {root}.")
        return d

    def path_of(self, ns: NamespaceLike) -> Path | None:
        """Directory of a namespace under ``root_dir`` (``None`` without ``root_dir``)."""
        parts = normalize_namespace(ns)
        return self._dir(parts) if self.root_dir is not None else None

    def _write_meta(self, ns: Namespace, mem: HierarchicalMemory) -> None:
        """Write the namespace record of ``ns``, or check the one there (a directory whose record names
        another namespace, e.g. a copied one, is never opened or saved into as ``ns``).

        Raises:
            PersistenceError: the record there is unreadable or names another namespace.
        """
        d = self._dir(ns)
        d.mkdir(parents=True, exist_ok=True)
        meta = d / _META
        if meta.is_file():
            self._read_meta(d)
            return
        tmp = d / f".{_META}.tmp"
        tmp.write_text(json.dumps({"format": _FORMAT, "namespace": list(ns), "kind": mem.kind}), "utf-8")
        os.replace(tmp, meta)

    @staticmethod
    def _read_meta(d: Path) -> Namespace:
        try:
            data = json.loads((d / _META).read_text("utf-8"))
            ns = normalize_namespace(data["namespace"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError, InvalidInputError) as e:
            raise PersistenceError(f"{d / _META} is not a valid namespace record: {e}") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise PersistenceError(f"{d / _META} has an unknown format.")
        if namespace_dirname(ns) != d.name:
            raise PersistenceError(f"{d / _META} names {ns!r}, which does not belong in {d.name}.")
        return ns

    # ------------------------------------------------------------------ memories
    def _new(self, ns: Namespace) -> HierarchicalMemory:
        mem = self.factory(ns) if self._takes_ns else self.factory()
        if not isinstance(mem, HierarchicalMemory):
            raise InvalidInputError(f"factory returned a {type(mem).__name__}, not a hiermem memory.")
        if len(mem) or mem._store.nodes:
            raise InvalidInputError("factory must return a new, empty memory for every namespace.")
        return mem

    def get_or_create(self, ns: NamespaceLike) -> HierarchicalMemory:
        """The memory of ``ns``: already open, else loaded from ``root_dir`` or the database, else new.

        With PostgreSQL an open memory whose namespace another process deleted (or deleted and created
        again) is dropped for the namespace as the database holds it.

        Raises:
            InvalidInputError: a bad namespace (see :func:`normalize_namespace`).
            PersistenceError: a stored memory of ``ns`` cannot be read.
        """
        parts = normalize_namespace(ns)
        if self.url is not None:
            self._check_current(parts)
        return self._open(parts, create=True)

    def _open(self, parts: Namespace, *, create: bool, pin: bool = False) -> HierarchicalMemory | None:
        """The memory of ``parts`` as this process holds it (with PostgreSQL it may be stale), else
        opened from where it is stored, else new when ``create`` (else ``None``); made the most
        recently used, and pinned (not evictable until :meth:`_unpin`) when ``pin``.

        A namespace is read from its store without the table's lock (other namespaces go on meanwhile);
        one thread at a time opens a given namespace."""
        mem = self._resident(parts, pin)
        if mem is not None:
            return mem
        with self._opening(parts):
            mem = self._resident(parts, pin)  # opened by another thread meanwhile
            if mem is not None:
                return mem
            if not create and not self._stored(parts):
                return None
            with self._lock:
                self._make_room()  # before its files are opened
            mem = self._load(parts)
            with self._lock:
                self._make_room()
                self._mems[parts] = mem
                if pin:
                    self._pins[parts] = self._pins.get(parts, 0) + 1
            return mem

    def _resident(self, parts: Namespace, pin: bool) -> HierarchicalMemory | None:
        """The memory of ``parts`` when this process holds it (resident, or evicted and still held
        elsewhere: made resident again), made the most recently used and pinned when ``pin``."""
        with self._lock:
            self._drain()
            mem = self._mems.get(parts)
            if mem is not None:
                self._mems.move_to_end(parts)
            else:
                mem = self._evicted.pop(parts, None)  # evicted, still held elsewhere: the same memory
                if mem is None:
                    return None
                self._make_room()
                self._mems[parts] = mem
            if pin:
                self._pins[parts] = self._pins.get(parts, 0) + 1
            return mem

    @contextmanager
    def _opening(self, parts: Namespace) -> Iterator[None]:
        """Hold the namespace's own lock: one opener (or deleter) of ``parts`` at a time. Taken without
        the table's lock held."""
        with self._lock:
            entry = self._openers.get(parts)
            if entry is None:
                entry = self._openers[parts] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0 and self._openers.get(parts) is entry:
                    del self._openers[parts]

    def _load(self, parts: Namespace) -> HierarchicalMemory:
        """A new memory of ``parts``, bound to its store or loaded from its save when there is one."""
        mem = self._new(parts)
        if self.url is not None:
            from .stores.postgres import PostgresStore

            mem.attach_store(PostgresStore(self._database(), parts))
        elif self.root_dir is not None:
            d = self._dir(parts)
            if self.durable:
                self._write_meta(parts, mem)  # first: a store on disk is always listed
                mem.attach_store(d / _SQLITE, synchronous=self.synchronous)
            elif (d / _SAVE).is_dir():
                self._read_meta(d)
                # the saved configuration applies; the factory's class, embedder and LLM are used
                mem = type(mem).load(d / _SAVE, embedder=mem.embedder, llm=mem.llm)
        return mem

    def _unpin(self, parts: Namespace) -> None:
        with self._lock:
            n = self._pins.get(parts, 0) - 1
            if n > 0:
                self._pins[parts] = n
            else:
                self._pins.pop(parts, None)

    # ------------------------------------------------------------------ eviction
    @property
    def resident(self) -> int:
        """Number of namespaces open now (at most ``max_resident``, unless all of them are in use or
        without a durable store)."""
        with self._lock:
            return len(self._mems)

    def is_resident(self, ns: NamespaceLike) -> bool:
        """Whether the memory of ``ns`` is open now (counted in :attr:`resident`); ``False`` for an
        evicted, a stored-only, an unknown or an invalid namespace. Never opens anything."""
        try:
            parts = normalize_namespace(ns)
        except InvalidInputError:
            return False
        with self._lock:
            self._drain()
            return parts in self._mems

    def stats(self) -> dict[str, Any]:
        """Figures of the namespace table.

        Returns:
            dict with ``resident`` (namespaces open now), ``max_resident`` (``None``: no limit),
            ``evictions`` (stores closed to stay within it so far) and ``reopened`` (evicted memories
            whose holder used them again, so their store was reopened in place).
        """
        with self._lock:
            return {
                "resident": len(self._mems),
                "max_resident": self.max_resident,
                "evictions": self._evictions,
                "reopened": self._reopens,
            }

    def _make_room(self) -> None:
        """Evict least recently used idle durable memories until one more fits (lock held)."""
        if self.max_resident is None:
            return
        excess = len(self._mems) + 1 - self.max_resident
        if excess <= 0:
            return
        for parts, mem in list(self._mems.items()):
            if self._try_evict(parts, mem):
                excess -= 1
                if excess <= 0:
                    return

    def _try_evict(self, parts: Namespace, mem: HierarchicalMemory) -> bool:
        """Close the store of ``mem`` and let go of it, unless it is in use or not durable (the table's
        lock held; never waits for the memory's lock)."""
        if self._pins.get(parts):
            return False
        lock = mem._lock
        if _owned(lock) or not lock.acquire(blocking=False):
            return False  # in use by a call of another thread (or of this one)
        try:
            store = mem._durable
            if store is None:
                return False  # in memory only: its data lives nowhere else
            if not isinstance(store, EvictedStore):
                mem._durable = EvictedStore(
                    store, partial(self._reopen_store, parts), partial(self._revive, parts)
                )
                # the memory's lock is held: nobody reopens it before this is done; a failure to close
                # (SQLite never raises here) must not fail the call of another namespace that made room
                with suppress(Exception):
                    store.close()
                self._evictions += 1
        finally:
            lock.release()
        del self._mems[parts]
        self._evicted[parts] = mem
        return True

    def _reopen_store(self, parts: Namespace) -> Store:
        """Open the store of an evicted namespace again (for :class:`EvictedStore`)."""
        if self.url is not None:
            from .stores.postgres import PostgresStore

            return PostgresStore(self._database(), parts)
        path = self._dir(parts) / _SQLITE
        if not path.is_file():
            raise PersistenceError(
                f"The store of namespace {parts!r} ({path}) is gone; the namespace was deleted."
            )
        from .stores.sqlite import SQLiteStore

        return SQLiteStore(path, synchronous=self.synchronous)

    def _revive(self, parts: Namespace, mem: HierarchicalMemory) -> None:
        """An evicted memory's holder used it and its store is open again: count it resident. Called
        with the memory's lock held, so the table's lock is only tried; else the next call does it."""
        self._revived.append((parts, mem))
        if self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def _drain(self) -> None:
        """Make the memories reopened by their holders resident again (the table's lock held)."""
        while self._revived:
            parts, mem = self._revived.popleft()
            self._reopens += 1
            if self._mems.get(parts) is mem:
                self._mems.move_to_end(parts)
            elif self._evicted.get(parts) is mem:
                del self._evicted[parts]
                self._make_room()
                self._mems[parts] = mem

    def get(self, ns: NamespaceLike) -> HierarchicalMemory | None:
        """The memory of ``ns`` if it exists (open or stored), else ``None``; never creates one.

        With PostgreSQL the database decides: ``None`` once another process deleted the namespace."""
        parts = normalize_namespace(ns)
        if self.url is not None:
            self._check_current(parts)
        return self._open(parts, create=False)

    # ------------------------------------------------------------------ namespaces deleted elsewhere
    def _check_current(self, parts: Namespace) -> None:
        """Forget the open memory of ``parts`` when its namespace is no longer the one in the database
        (deleted, or deleted and created again by another process): one query, no memory lock."""
        with self._lock:
            mem = self._mems.get(parts)
            if mem is None:
                mem = self._evicted.get(parts)
        if mem is None:
            return
        now = self._database().namespace_id(parts, create=False)
        if now is None or now != getattr(mem._durable, "_ns", None):
            self._forget_stale(parts, mem)

    def _forget_stale(self, parts: Namespace, mem: HierarchicalMemory) -> None:
        """Forget ``mem``, the memory of a namespace another process deleted. Its store is left open:
        a call of another thread holding ``mem`` then fails (``NamespaceDeletedError``) instead of
        changing a memory that no store backs any more; its registration went with the namespace."""
        with self._lock:
            if self._mems.get(parts) is mem:
                del self._mems[parts]
            if self._evicted.get(parts) is mem:
                del self._evicted[parts]

    def _call(self, ns: NamespaceLike, fn: Callable[[HierarchicalMemory], Any], *, create: bool) -> Any:
        """``fn(memory of ns)``, or ``_MISSING`` when ``ns`` does not exist and not ``create``. With
        PostgreSQL a stale memory (its namespace deleted by another process, noticed by the catch-up
        that ``fn`` starts with, before any change or model call) is forgotten and ``fn`` run on the
        namespace as the database holds it now."""
        parts = normalize_namespace(ns)
        for attempt in range(_STALE_ATTEMPTS):
            mem = None
            try:
                mem = self._open(parts, create=create, pin=True)
                if mem is None:
                    return _MISSING
                try:
                    return fn(mem)
                finally:
                    self._unpin(parts)
            except NamespaceDeletedError:
                if self.url is None or attempt == _STALE_ATTEMPTS - 1:
                    raise
                if mem is not None:
                    self._forget_stale(parts, mem)
        raise AssertionError("unreachable")  # pragma: no cover

    def _stored(self, ns: Namespace) -> bool:
        if self.url is not None:
            return self._database().has_namespace(ns)
        if self.root_dir is None:
            return False
        d = self._dir(ns)
        return (d / _META).is_file() and ((d / _SAVE).is_dir() or (d / _SQLITE).is_file())

    def __contains__(self, ns: object) -> bool:
        try:
            parts = normalize_namespace(ns)  # type: ignore[arg-type]
        except InvalidInputError:
            return False
        if self.url is not None:  # the database decides (another process may have deleted it)
            return self._stored(parts)
        with self._lock:
            return parts in self._mems or parts in self._evicted or self._stored(parts)

    def __len__(self) -> int:
        return len(self.list_namespaces())

    # ------------------------------------------------------------------ per-namespace operations
    def add(
        self,
        ns: NamespaceLike,
        items: MessageLike | Iterable[MessageLike],
        *,
        upsert: bool = False,
        progress: ProgressLike = None,
    ) -> AddReport:
        """Add messages to the memory of ``ns`` (created on first use); ``upsert=True`` replaces the
        stored message of an id the namespace holds. See ``HierarchicalMemory.add`` (``progress`` too).

        Raises:
            DuplicateIdError: an id the namespace already holds (without ``upsert``), or twice in ``items``.
        """
        p = check_progress(progress)  # checked before a namespace is created
        report: AddReport = self._call(ns, lambda m: m.add(items, upsert=upsert, progress=p), create=True)
        return report

    async def aadd(
        self, ns: NamespaceLike, items: MessageLike | Iterable[MessageLike], **kw: Any
    ) -> AddReport:
        """Async :meth:`add` (in a worker thread), with its keyword arguments (``upsert``, ``progress``)."""
        return await asyncio.to_thread(partial(self.add, ns, items, **kw))

    def retrieve(
        self, ns: NamespaceLike, query: str, k: int | None = None, policy: str | None = None, **kw: Any
    ) -> list[Hit]:
        """Retrieve from the memory of ``ns`` only; ``[]`` for a namespace that does not exist (a read
        never creates one), also when another process deleted it. See ``HierarchicalMemory.retrieve``."""
        hits = self._call(ns, lambda mem: mem.retrieve(query, k, policy, **kw), create=False)
        return [] if hits is _MISSING else hits

    async def aretrieve(
        self, ns: NamespaceLike, query: str, k: int | None = None, policy: str | None = None, **kw: Any
    ) -> list[Hit]:
        """Async :meth:`retrieve` (in a worker thread)."""
        return await asyncio.to_thread(self.retrieve, ns, query, k, policy, **kw)

    def get_all(
        self, ns: NamespaceLike, where: Any = None, limit: int | None = None, offset: int = 0
    ) -> list[Message]:
        """The messages of ``ns`` in insertion order; ``[]`` for a namespace that does not exist (a read
        never creates one). See ``HierarchicalMemory.get_all``.

        Raises:
            InvalidInputError: a bad namespace, ``where``, ``limit`` or ``offset``.
        """
        check_listing(where, limit, offset)  # also for a namespace that does not exist
        found = self._call(ns, lambda mem: mem.get_all(where, limit, offset), create=False)
        return [] if found is _MISSING else found

    def delete(self, ns: NamespaceLike, key: int | str) -> int:
        """Forget a message or subtree of the memory of ``ns`` (see ``HierarchicalMemory.delete``).

        Raises:
            NodeNotFoundError: no such namespace, node or source id.
        """
        from .types import NodeNotFoundError

        n = self._call(ns, lambda mem: mem.delete(key), create=False)
        if n is _MISSING:
            raise NodeNotFoundError(f"No namespace {normalize_namespace(ns)!r}.")
        return int(n)

    def delete_namespace(self, ns: NamespaceLike) -> bool:
        """Forget a whole namespace: its memory, its store and its directory under ``root_dir``.

        Returns:
            Whether the namespace existed.
        """
        parts = normalize_namespace(ns)
        with self._opening(parts), self._lock:  # not while another thread opens it
            mem = self._mems.pop(parts, None)
            if mem is None:
                mem = self._evicted.pop(parts, None)
            existed = mem is not None
            if mem is not None:
                mem.close_store()  # an evicted memory still held elsewhere never reopens its store
            if self.url is not None:
                existed = self._database().drop_namespace(parts) or existed
            elif self.root_dir is not None:
                d = self._dir(parts)
                if d.is_dir():
                    existed = True
                    trash = d.with_name(f".{d.name}.deleted")
                    shutil.rmtree(trash, ignore_errors=True)
                    os.replace(d, trash)  # atomic: a crash never leaves half a namespace
                    shutil.rmtree(trash, ignore_errors=True)
            return existed

    def list_namespaces(
        self,
        prefix: NamespaceLike | None = None,
        *,
        on_invalid: Callable[[Path | str, PersistenceError], None] | None = None,
    ) -> list[Namespace]:
        """Namespaces open or stored under ``root_dir`` (with PostgreSQL: those the database holds, and
        open memories of namespaces deleted by another process are forgotten), sorted; only those
        starting with ``prefix``.

        Args:
            prefix: only namespaces starting with these parts; ``None``: all.
            on_invalid: called with the directory and the error for each namespace directory under
                ``root_dir`` that cannot be read or whose ``namespace.json`` is unreadable, tampered or
                names another namespace than the directory stands for (e.g. a copied directory), or
                (PostgreSQL) a row naming no namespace: left out. Default ``None``: they raise.

        Raises:
            PersistenceError: without ``on_invalid``, an unreadable directory, a tampered or unreadable
                ``namespace.json``, a malformed namespace row.
        """
        pre = normalize_namespace(prefix) if prefix is not None else ()
        bad: list[tuple[Path | str, PersistenceError]] = []
        with self._lock:
            found = set(self._mems) | set(self._evicted.keys())
            if self.url is not None:
                held = {**dict(self._evicted.items()), **self._mems}
                keep = None if on_invalid is None else lambda row, e: bad.append((row, e))
                found = set(self._database().namespaces(keep))
                for parts in [p for p in held if p not in found]:  # deleted by another process
                    self._forget_stale(parts, held[parts])
            elif self.root_dir is not None and self.root_dir.is_dir():
                for d in sorted(self.root_dir.iterdir()):  # the same first error everywhere
                    try:
                        if d.is_dir() and d.name.startswith("ns-") and (d / _META).is_file():
                            found.add(self._read_meta(d))
                    except OSError as e:  # PersistenceError included
                        err = e if isinstance(e, PersistenceError) else _unreadable(d, e)
                        if on_invalid is None:
                            raise err from None
                        bad.append((d, err))
        for d, err in bad:  # not under the table's lock
            assert on_invalid is not None
            on_invalid(d, err)
        return sorted(n for n in found if n[: len(pre)] == pre)

    # ------------------------------------------------------------------ persistence
    def save(self) -> list[Namespace]:
        """Save every open namespace under ``root_dir`` (durable stores are already on disk).

        Returns:
            The namespaces written.

        Raises:
            InvalidInputError: no ``root_dir`` (nor ``url``: a PostgreSQL store has nothing to save).
            PersistenceError: a save failed.
        """
        if self.url is not None:
            return []
        if self.root_dir is None:
            raise InvalidInputError("This MemoryStore has no root_dir to save into; pass root_dir=... .")
        out = []
        with self._lock:
            for ns, mem in sorted(self._mems.items()):
                if mem.store_location is not None:
                    continue
                self._write_meta(ns, mem)
                mem.save(self._dir(ns) / _SAVE)
                out.append(ns)
        return out

    def load(self) -> list[Namespace]:
        """Open every namespace stored under ``root_dir`` (otherwise they open on first access); with
        more than ``max_resident`` durable ones, the last ``max_resident`` stay open.

        Returns:
            The namespaces found.
        """
        names = self.list_namespaces()
        for ns in names:
            self.get_or_create(ns)
        return names

    def close(self) -> None:
        """Close every durable store and the PostgreSQL connections, and forget the open memories
        (stored ones reopen on access)."""
        with self._lock:
            mems = [*self._mems.values(), *list(self._evicted.values())]
            self._mems, self._evicted = OrderedDict(), weakref.WeakValueDictionary()
            self._revived.clear()
            db, self._db = self._db, None
        for m in mems:  # an evicted memory still held elsewhere never reopens its store
            m.close_store()
        if db is not None:
            from .stores import pg_prune

            pg_prune.shutdown(db)  # the registrations' connection
            db.close()

    def __repr__(self) -> str:
        where = f"url={self._db.location!r}" if self._db is not None else f"root_dir={str(self.root_dir)!r}"
        return f"MemoryStore(namespaces={len(self._mems)} open, max_resident={self.max_resident}, {where})"


def _takes_positional(fn: Callable[..., Any]) -> bool:
    if isinstance(fn, type):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _unreadable(d: Path, e: OSError) -> PersistenceError:
    """The error of a namespace directory the listing cannot look into (e.g. no permission)."""
    return PersistenceError(f"{d} cannot be read as a namespace directory: {e.strerror or e}.")


def _owned(lock: Any) -> bool:
    """Whether the current thread holds the (reentrant) lock."""
    owned = getattr(lock, "_is_owned", None)
    return bool(owned()) if owned is not None else False
