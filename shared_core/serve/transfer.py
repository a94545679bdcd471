"""Moving memories between stores: ``hiermem export``, ``hiermem import`` and ``hiermem inspect``.

A store here is what :func:`~shared_core.serve.mcp_server.open_store` opens: a directory of namespaces (one
SQLite store each) or a ``postgresql://`` URL. The interchange format is JSON Lines, one message per
line with every field of :class:`~shared_core.types.Message` and its namespace::

    {"namespace": ["ann"], "text": "I adopted a dog named Luna", "role": null, "speaker": "Ann",
     "timestamp": "2025-05-08", "id": "D1:1", "metadata": {"topic": "pets"}}

Messages are written in each namespace's insertion order, namespaces sorted. An import reads and checks
the whole file first (a malformed line is an error naming its line number, and nothing is added), then
adds each namespace's messages in one call, so each namespace gets all of its messages or none; the
messages are embedded again by the importing store's models (vectors and summaries are not exported).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..memories.base import HierarchicalMemory
from ..memories.registry import memory_classes
from ..models.base import Embedder
from ..namespaces import MemoryStore, Namespace, normalize_namespace
from ..stores import is_postgres_url
from ..types import InvalidInputError, Message, PersistenceError, check_message_fields
from .mcp_server import memory_factory, open_store

__all__ = [
    "FIELDS",
    "export_jsonl",
    "import_jsonl",
    "inspect_store",
    "open_stored_kinds",
    "read_jsonl",
    "store_exists",
]

#: the keys of one exported line
FIELDS = ("namespace", "text", "role", "speaker", "timestamp", "id", "metadata")


def store_exists(store: str) -> bool:
    """Whether ``store`` names a store to read: a ``postgresql://`` URL (the server decides), or an existing
    directory."""
    return is_postgres_url(store) or Path(store).expanduser().is_dir()


def open_stored_kinds(store: str, memory: str = "segtree", embedder: Embedder | None = None) -> MemoryStore:
    """:func:`~shared_core.serve.mcp_server.open_store`, but a namespace of a store directory opens as the
    memory kind its ``namespace.json`` records (a store may hold several kinds); new namespaces, and
    every namespace of a PostgreSQL store, are of kind ``memory``.

    Raises:
        InvalidInputError: an unknown ``memory``, a malformed URL.
        PersistenceError: the directory cannot be created or the database reached.
    """
    if is_postgres_url(store):
        return open_store(store, memory, embedder)
    if embedder is None:
        from ..models.local import LocalEmbedder

        embedder = LocalEmbedder()
    new = memory_factory(memory, embedder)
    classes = memory_classes()
    root = Path(store).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PersistenceError(f"Cannot create the store directory {root}: {e}") from None

    def factory(ns: Namespace) -> HierarchicalMemory:
        try:
            kind = json.loads((mems.path_of(ns) / "namespace.json").read_text("utf-8"))["kind"]  # type: ignore[operator]
        except (OSError, ValueError, KeyError, TypeError):
            kind = None
        return classes[kind](embedder=embedder) if kind in classes else new()

    mems = MemoryStore(factory, root_dir=root, durable=True)
    return mems


def export_jsonl(store: MemoryStore, out: str | Path, namespace: Any = None) -> dict[Namespace, int]:
    """Write the messages of ``store`` (or of one ``namespace``) to ``out`` as JSON Lines.

    The file is written beside ``out`` and renamed into place, so an interrupted export leaves no
    partial file.

    Returns:
        Messages written per namespace.

    Raises:
        InvalidInputError: a malformed ``namespace``, or one the store does not hold.
        PersistenceError: ``out`` cannot be written.
    """
    if namespace is not None:
        ns = normalize_namespace(namespace)
        if ns not in store:
            raise InvalidInputError(f"The store holds no namespace {ns!r}.")
        spaces = [ns]
    else:
        spaces = store.list_namespaces()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    counts: dict[Namespace, int] = {}
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for ns in spaces:
                messages = store.get_all(ns)
                for m in messages:
                    f.write(json.dumps({"namespace": list(ns), **m.to_dict()}, ensure_ascii=False) + "\n")
                counts[ns] = len(messages)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise PersistenceError(f"Cannot write {out}: {e}") from None
    return counts


def read_jsonl(path: str | Path) -> dict[Namespace, list[Message]]:
    """Read and check an export: every line a JSON object with the keys of :data:`FIELDS` (``text`` and
    ``namespace`` required), every message within the stored-field limits, no id twice in a namespace.

    Returns:
        The messages per namespace, in file order.

    Raises:
        InvalidInputError: a malformed line (the message names its line number), or the file cannot be
            read.
    """
    path = Path(path)
    groups: dict[Namespace, list[Message]] = {}
    first_line: dict[tuple[Namespace, str], int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"Cannot read {path}: {e}") from None
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ns, m = _parse_line(line)
        except InvalidInputError as e:
            raise InvalidInputError(f"{path}, line {no}: {e}") from None
        if m.id is not None:
            seen = first_line.setdefault((ns, m.id), no)
            if seen != no:
                raise InvalidInputError(
                    f"{path}, line {no}: the id {m.id!r} of namespace {ns!r} is already on line {seen}."
                )
        groups.setdefault(ns, []).append(m)
    return groups


def _parse_line(line: str) -> tuple[Namespace, Message]:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"not JSON ({e.msg} at column {e.colno}).") from None
    if not isinstance(d, dict):
        raise InvalidInputError(f"expected a JSON object, got {type(d).__name__}.")
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise InvalidInputError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; the keys are {', '.join(FIELDS)}."
        )
    if "namespace" not in d or "text" not in d:
        raise InvalidInputError("a line needs 'namespace' and 'text'.")
    ns = normalize_namespace(d.pop("namespace"))
    for key in ("role", "speaker", "timestamp", "id"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise InvalidInputError(f"{key} must be a string or null, got {d[key]!r}.")
    m = Message(**{k: v for k, v in d.items() if not (k == "metadata" and v is None)})
    check_message_fields(m)
    return ns, m


def import_jsonl(
    store: MemoryStore,
    path: str | Path,
    *,
    upsert: bool = False,
    progress: Callable[[Namespace, int], None] | None = None,
) -> dict[Namespace, int]:
    """Add the messages of an export to ``store``, each namespace in one atomic ``add`` (new namespaces
    are created with the store's memory kind; the messages are embedded by its models).

    Args:
        store: the target.
        path: a JSON Lines file as :func:`export_jsonl` writes.
        upsert: replace stored messages with the same id (default ``False``: such an id is a
            :class:`~shared_core.types.DuplicateIdError` and its namespace gets nothing).
        progress: called with each namespace and its message count once it is added.

    Returns:
        Messages added per namespace.

    Raises:
        InvalidInputError: a malformed line (nothing is added to any namespace).
        HierMemError: a namespace's ``add`` failed (that namespace and the later ones get nothing; the
            earlier ones are added, the message says which).
    """
    groups = read_jsonl(path)
    done: dict[Namespace, int] = {}
    for ns, messages in groups.items():
        try:
            store.add(ns, messages, upsert=upsert)
        except Exception as e:
            before = f"; already imported: {', '.join(map(repr, done))}" if done else ""
            e.args = (f"namespace {ns!r} (nothing added to it{before}): {e}",)
            raise
        done[ns] = len(messages)
        if progress is not None:
            progress(ns, len(messages))
    return done


def inspect_store(store: MemoryStore) -> list[dict[str, Any]]:
    """One row per namespace: ``namespace`` (tuple), ``kind``, ``messages``, ``nodes``, ``height`` (the
    tree's ``max_depth``) and ``bytes`` (the namespace's files on disk; ``None`` with PostgreSQL)."""
    rows = []
    for ns in store.list_namespaces():
        mem = store.get(ns)
        if mem is None:  # deleted meanwhile by another process
            continue
        s = mem.stats()
        d = store.path_of(ns)
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) if d is not None else None
        rows.append(
            {
                "namespace": ns,
                "kind": s["kind"],
                "messages": s["leaves"],
                "nodes": s["nodes"],
                "height": s["max_depth"],
                "bytes": size,
            }
        )
    return rows
