"""MemoryStore: one hierarchical memory per namespace (user, agent, session...), never mixed.

Every namespace owns a separate memory built by a factory; adds, retrievals and deletions of one
namespace never see another's nodes. With a ``root_dir`` the memories are saved (``save()`` / lazy
loading on first access) or, with ``durable=True``, kept in one SQLite store each
(:mod:`shared_core.durable`), so every acknowledged add is on disk.

Namespaces are tuples of strings, e.g. ``("alice", "support-bot", "2024-05-01")``; a plain string is a
one-part namespace. Any printable text is a valid part, including ``".."``, ``"/"``, ``"\\\\"`` or an
absolute path: on disk a namespace lives in a directory named from a filesystem-safe slug
(``[A-Za-z0-9_-]`` only) and a SHA-256 digest of the exact tuple, so a name can never address another
directory; the tuple itself is kept in ``namespace.json`` inside. Control characters (NUL included),
lone surrogates, empty parts and parts over 256 characters are rejected.

Layout of ``root_dir``::

    ns-<slug>-<digest>/
        namespace.json     {"format": 1, "namespace": [...], "kind": "segtree"}
        memory/            a save (CURRENT + snapshot-*; see shared_core.persist), or
        memory.sqlite      the durable store (durable=True)
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Union

from .base import HierarchicalMemory
from .types import AddReport, Hit, InvalidInputError, MessageLike, PersistenceError

__all__ = [
    "MAX_PART_CHARS",
    "MAX_PARTS",
    "MemoryStore",
    "Namespace",
    "namespace_dirname",
    "normalize_namespace",
]

Namespace = tuple[str, ...]
NamespaceLike = Union[str, Sequence[str]]

#: Longest namespace part in characters.
MAX_PART_CHARS = 256
#: Most parts in a namespace.
MAX_PARTS = 8
_FORMAT = 1
_META = "namespace.json"
_SAVE = "memory"
_SQLITE = "memory.sqlite"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def normalize_namespace(ns: NamespaceLike) -> Namespace:
    """Validate a namespace and return it as a tuple of strings.

    Args:
        ns: a string (one part) or a sequence of 1 to 8 strings.

    Returns:
        The namespace tuple.

    Raises:
        InvalidInputError: not a string or sequence of strings, no parts or more than 8, an empty part,
            a part over 256 characters, or a part with a control character (NUL included) or a lone
            surrogate.
    """
    if isinstance(ns, str):
        parts: tuple[Any, ...] = (ns,)
    elif isinstance(ns, (tuple, list)):
        parts = tuple(ns)
    else:
        raise InvalidInputError(
            "A namespace is a string or a tuple of strings such as ('user', 'agent'), "
            f"got {type(ns).__name__}."
        )
    if not 1 <= len(parts) <= MAX_PARTS:
        raise InvalidInputError(f"A namespace has 1 to {MAX_PARTS} parts, got {len(parts)}.")
    for i, p in enumerate(parts):
        if not isinstance(p, str):
            raise InvalidInputError(f"Namespace part {i} is a {type(p).__name__}; every part must be a str.")
        if not p.strip():
            raise InvalidInputError(f"Namespace part {i} is empty; give every part some text.")
        if len(p) > MAX_PART_CHARS:
            raise InvalidInputError(
                f"Namespace part {i} has {len(p)} characters; the limit is {MAX_PART_CHARS}."
            )
        if _CONTROL.search(p):
            raise InvalidInputError(
                f"Namespace part {i} contains a control character (e.g. NUL); use printable text only."
            )
        try:
            p.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInputError(
                f"Namespace part {i} contains a lone surrogate; use valid text."
            ) from None
    return parts  # type: ignore[return-value]


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

    Raises:
        InvalidInputError: ``factory`` is not callable, or ``durable=True`` without ``root_dir``.

    Thread safety: the namespace table has its own lock; each memory serialises its own writers.

    References:
        LangGraph ``BaseStore`` namespaces (tuples of strings); :mod:`shared_core.durable`.
    """

    def __init__(
        self,
        factory: Callable[..., HierarchicalMemory],
        root_dir: str | Path | None = None,
        *,
        durable: bool = False,
        synchronous: str = "FULL",
    ) -> None:
        if not callable(factory):
            raise InvalidInputError("factory must be a callable returning a new memory.")
        if durable and root_dir is None:
            raise InvalidInputError(
                "durable=True keeps one SQLite store per namespace: give root_dir as well."
            )
        self.factory = factory
        self.root_dir = Path(root_dir) if root_dir is not None else None
        self.durable = bool(durable)
        self.synchronous = synchronous
        self._takes_ns = _takes_positional(factory)
        self._mems: dict[Namespace, HierarchicalMemory] = {}
        self._lock = threading.RLock()

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
        """The memory of ``ns``: already open, else loaded from ``root_dir``, else new.

        Raises:
            InvalidInputError: a bad namespace (see :func:`normalize_namespace`).
            PersistenceError: a stored memory of ``ns`` cannot be read.
        """
        parts = normalize_namespace(ns)
        with self._lock:
            mem = self._mems.get(parts)
            if mem is not None:
                return mem
            mem = self._new(parts)
            if self.root_dir is not None:
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
        """The memory of ``ns`` if it exists (open or stored), else ``None``; never creates one."""
        parts = normalize_namespace(ns)
        with self._lock:
            if parts in self._mems or self._stored(parts):
                return self.get_or_create(parts)
            return None

    def _stored(self, ns: Namespace) -> bool:
        if self.root_dir is None:
            return False
        d = self._dir(ns)
        return (d / _META).is_file() and ((d / _SAVE).is_dir() or (d / _SQLITE).is_file())

    def __contains__(self, ns: object) -> bool:
        try:
            parts = normalize_namespace(ns)  # type: ignore[arg-type]
        except InvalidInputError:
            return False
        with self._lock:
            return parts in self._mems or self._stored(parts)

    def __len__(self) -> int:
        return len(self.list_namespaces())

    # ------------------------------------------------------------------ per-namespace operations
    def add(self, ns: NamespaceLike, items: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages to the memory of ``ns`` (created on first use). See ``HierarchicalMemory.add``."""
        return self.get_or_create(ns).add(items)

    async def aadd(self, ns: NamespaceLike, items: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Async :meth:`add`."""
        return await self.get_or_create(ns).aadd(items)

    def retrieve(
        self, ns: NamespaceLike, query: str, k: int | None = None, policy: str | None = None, **kw: Any
    ) -> list[Hit]:
        """Retrieve from the memory of ``ns`` only; ``[]`` for a namespace that does not exist (a read
        never creates one). See ``HierarchicalMemory.retrieve``."""
        mem = self.get(ns)
        if mem is None:
            return []
        return mem.retrieve(query, k, policy, **kw)

    async def aretrieve(
        self, ns: NamespaceLike, query: str, k: int | None = None, policy: str | None = None, **kw: Any
    ) -> list[Hit]:
        """Async :meth:`retrieve`."""
        mem = self.get(ns)
        if mem is None:
            return []
        return await mem.aretrieve(query, k, policy, **kw)

    def delete(self, ns: NamespaceLike, key: int | str) -> int:
        """Forget a message or subtree of the memory of ``ns`` (see ``HierarchicalMemory.delete``).

        Raises:
            NodeNotFoundError: no such namespace, node or source id.
        """
        from .types import NodeNotFoundError

        mem = self.get(ns)
        if mem is None:
            raise NodeNotFoundError(f"No namespace {normalize_namespace(ns)!r}.")
        return mem.delete(key)

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
            if self.root_dir is not None:
                d = self._dir(parts)
                if d.is_dir():
                    existed = True
                    trash = d.with_name(f".{d.name}.deleted")
                    shutil.rmtree(trash, ignore_errors=True)
                    os.replace(d, trash)  # atomic: a crash never leaves half a namespace
                    shutil.rmtree(trash, ignore_errors=True)
            return existed

    def list_namespaces(self, prefix: NamespaceLike | None = None) -> list[Namespace]:
        """Namespaces open or stored under ``root_dir``, sorted; only those starting with ``prefix``.

        Raises:
            PersistenceError: a namespace directory with a tampered or unreadable ``namespace.json``.
        """
        pre = normalize_namespace(prefix) if prefix is not None else ()
        with self._lock:
            found = set(self._mems)
            if self.root_dir is not None and self.root_dir.is_dir():
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
            InvalidInputError: no ``root_dir``.
            PersistenceError: a save failed.
        """
        if self.root_dir is None:
            raise InvalidInputError("This MemoryStore has no root_dir to save into; pass root_dir=... .")
        out = []
        with self._lock:
            for ns, mem in sorted(self._mems.items()):
                if mem.store_path is not None:
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
        """Close every durable store and forget the open memories (stored ones reopen on access)."""
        with self._lock:
            mems, self._mems = list(self._mems.values()), {}
        for m in mems:
            m.close_store()

    def __repr__(self) -> str:
        return f"MemoryStore(namespaces={len(self._mems)} open, root_dir={str(self.root_dir)!r})"


def _takes_positional(fn: Callable[..., Any]) -> bool:
    if isinstance(fn, type):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
