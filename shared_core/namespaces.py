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

Namespaces are tuples of strings, e.g. ``("alice", "support-bot", "2024-05-01")``; a plain string is a
one-part namespace. Any printable text is a valid part, including ``".."``, ``"/"``, ``"\\\\"`` or an
absolute path: on disk a namespace lives in a directory named from a filesystem-safe slug
(``[A-Za-z0-9_-]`` only) and a SHA-256 digest of the exact tuple, so a name can never address another
directory; the tuple itself is kept in ``namespace.json`` inside. Control characters (NUL included),
lone surrogates, empty parts and parts over 256 characters are rejected.

Layout of ``root_dir`` (PostgreSQL keeps the namespace tuple in its ``hiermem.namespaces`` table)::

    ns-<slug>-<digest>/
        namespace.json     {"format": 1, "namespace": [...], "kind": "segtree"}
        memory/            a save (CURRENT + snapshot-*; see shared_core.persist), or
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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import HierarchicalMemory
from .stores import is_postgres_url
from .stores.namespace import (
    MAX_PART_CHARS,
    MAX_PARTS,
    Namespace,
    NamespaceDeletedError,
    NamespaceLike,
    normalize_namespace,
)
from .types import AddReport, Hit, InvalidInputError, MessageLike, PersistenceError

if TYPE_CHECKING:
    from .stores.postgres import PostgresDatabase

__all__ = [
    "MAX_PART_CHARS",
    "MAX_PARTS",
    "MemoryStore",
    "Namespace",
    "NamespaceDeletedError",
    "namespace_dirname",
    "normalize_namespace",
]

_FORMAT = 1
_META = "namespace.json"
#: Attempts of one call whose namespace another process keeps deleting (each attempt reopens it).
_STALE_ATTEMPTS = 3
_MISSING: Any = object()
_SAVE = "memory"
_SQLITE = "memory.sqlite"


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

    Raises:
        InvalidInputError: ``factory`` is not callable, ``durable=True`` without ``root_dir`` or
            ``url``, both ``root_dir`` and ``url``, or a malformed URL.
        PersistenceError: the PostgreSQL server cannot be reached, or the database is not a hiermem
            store.
        VersionMismatchError: the database's hiermem schema has another version.

    Thread safety: the namespace table has its own lock; each memory serialises its own writers.

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
    ) -> None:
        if not callable(factory):
            raise InvalidInputError("factory must be a callable returning a new memory.")
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
        self._mems: dict[Namespace, HierarchicalMemory] = {}
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
        d = self._dir(ns)
        d.mkdir(parents=True, exist_ok=True)
        meta = d / _META
        if meta.is_file():
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

    def _open(self, parts: Namespace, *, create: bool) -> HierarchicalMemory | None:
        """The memory of ``parts`` as this process holds it (with PostgreSQL it may be stale), else
        opened from where it is stored, else new when ``create`` (else ``None``)."""
        with self._lock:
            mem = self._mems.get(parts)
            if mem is not None:
                return mem
            if not create and not self._stored(parts):
                return None
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
            self._mems[parts] = mem
            return mem

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

    def _call(self, ns: NamespaceLike, fn: Callable[[HierarchicalMemory], Any], *, create: bool) -> Any:
        """``fn(memory of ns)``, or ``_MISSING`` when ``ns`` does not exist and not ``create``. With
        PostgreSQL a stale memory (its namespace deleted by another process, noticed by the catch-up
        that ``fn`` starts with, before any change or model call) is forgotten and ``fn`` run on the
        namespace as the database holds it now."""
        parts = normalize_namespace(ns)
        for attempt in range(_STALE_ATTEMPTS):
            mem = None
            try:
                mem = self._open(parts, create=create)
                return _MISSING if mem is None else fn(mem)
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
            return parts in self._mems or self._stored(parts)

    def __len__(self) -> int:
        return len(self.list_namespaces())

    # ------------------------------------------------------------------ per-namespace operations
    def add(self, ns: NamespaceLike, items: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages to the memory of ``ns`` (created on first use). See ``HierarchicalMemory.add``."""
        report: AddReport = self._call(ns, lambda mem: mem.add(items), create=True)
        return report

    async def aadd(self, ns: NamespaceLike, items: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Async :meth:`add` (in a worker thread)."""
        return await asyncio.to_thread(self.add, ns, items)

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
        with self._lock:
            mem = self._mems.pop(parts, None)
            existed = mem is not None
            if mem is not None:
                mem.close_store()
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

    def list_namespaces(self, prefix: NamespaceLike | None = None) -> list[Namespace]:
        """Namespaces open or stored under ``root_dir`` (with PostgreSQL: those the database holds, and
        open memories of namespaces deleted by another process are forgotten), sorted; only those
        starting with ``prefix``.

        Raises:
            PersistenceError: a namespace directory with a tampered or unreadable ``namespace.json``.
        """
        pre = normalize_namespace(prefix) if prefix is not None else ()
        with self._lock:
            found = set(self._mems)
            if self.url is not None:
                found = set(self._database().namespaces())
                for parts in [p for p in self._mems if p not in found]:  # deleted by another process
                    self._forget_stale(parts, self._mems[parts])
            elif self.root_dir is not None and self.root_dir.is_dir():
                for d in self.root_dir.iterdir():
                    if d.is_dir() and d.name.startswith("ns-") and (d / _META).is_file():
                        found.add(self._read_meta(d))
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
        """Open every namespace stored under ``root_dir`` (otherwise they open on first access).

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
            mems, self._mems = list(self._mems.values()), {}
            db, self._db = self._db, None
        for m in mems:
            m.close_store()
        if db is not None:
            from .stores import pg_prune

            pg_prune.shutdown(db)  # the registrations' connection
            db.close()

    def __repr__(self) -> str:
        where = f"url={self._db.location!r}" if self._db is not None else f"root_dir={str(self.root_dir)!r}"
        return f"MemoryStore(namespaces={len(self._mems)} open, {where})"


def _takes_positional(fn: Callable[..., Any]) -> bool:
    if isinstance(fn, type):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
