"""Save and load memories as a directory of plain JSON plus the FAISS index file. Never pickle.

Layout of a save directory::

    PATH/
      CURRENT                   name of the live snapshot (replaced atomically)
      snapshot-<hex>/
        memory.json             format version, kind, config, algorithm state, nodes, usage
        index.faiss             node vectors (faiss.write_index)

A save writes a new snapshot directory, flushes it to disk, then atomically replaces ``CURRENT``; only
then are older snapshots removed. An interrupted save therefore leaves the previous save readable.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..search.index import NodeIndex
from ..types import InvalidInputError, PersistenceError, UnknownPolicyError, VersionMismatchError
from .base import check_embedder_dim
from .encoding import MEMORY_FORMAT

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory
    from ..models.base import LLM, Embedder

__all__ = ["check_embedder_dim", "load_memory", "read_save", "save_memory"]

M = TypeVar("M", bound="HierarchicalMemory")
_CURRENT = "CURRENT"
_MEMORY = "memory.json"
_INDEX = "index.faiss"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_memory(mem: HierarchicalMemory, path: Path) -> Path:
    """Write ``mem`` to the directory ``path`` (see the module docstring for the layout)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PersistenceError(f"{path} is a file; give a directory path to save into.")
    if path.is_dir() and any(path.iterdir()) and not (path / _CURRENT).is_file():
        raise PersistenceError(
            f"{path} is a non-empty directory that is not a hiermem save; choose an empty or new directory."
        )
    path.mkdir(parents=True, exist_ok=True)
    name = f"snapshot-{uuid.uuid4().hex[:12]}"
    tmp = path / f".{name}.tmp"
    tmp.mkdir()
    try:
        data = mem.to_dict()
        data["dim"] = mem.dim
        try:
            text = json.dumps(data, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise PersistenceError(f"The memory holds data that is not JSON-serialisable: {e}") from None
        try:
            payload = text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (e.g. in a model's answer): escape them as \uXXXX
            payload = json.dumps(data, ensure_ascii=True).encode("ascii")
        _write_file(tmp / _MEMORY, payload)
        if mem._index is not None:
            mem._index.write(tmp / _INDEX)
            with open(tmp / _INDEX, "rb+") as f:
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        os.replace(tmp, path / name)
        cur_tmp = path / f".{_CURRENT}.{name}.tmp"
        _write_file(cur_tmp, name.encode())
        os.replace(cur_tmp, path / _CURRENT)
        _fsync_dir(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in path.iterdir():
        if old.name != name and old.name.startswith(("snapshot-", ".snapshot-", f".{_CURRENT}.")):
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    return path


def read_save(path: Path, format_version: int = MEMORY_FORMAT) -> tuple[dict[str, Any], Path]:
    """Read and validate ``memory.json`` of a save; return ``(data, snapshot_dir)``.

    Args:
        path: the save directory.
        format_version: the memory format this hiermem reads (``HierarchicalMemory.FORMAT_VERSION``).

    Raises:
        PersistenceError: not a save, unreadable or malformed.
        VersionMismatchError: written by another format version.
    """
    path = Path(path)
    cur = path / _CURRENT
    if not cur.is_file():
        raise PersistenceError(
            f"{path} is not a saved hiermem memory (no {_CURRENT} file); save one with .save()."
        )
    name = cur.read_text(encoding="utf-8").strip()
    if not name.startswith("snapshot-") or "/" in name or "\\" in name or ".." in name:
        raise PersistenceError(f"{cur} names an invalid snapshot; the save is corrupt.")
    snap = path / name
    try:
        data = json.loads((snap / _MEMORY).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise PersistenceError(f"Cannot read {snap / _MEMORY}: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict) or not {"format", "kind", "config", "tree"} <= set(data):
        raise PersistenceError(f"{snap / _MEMORY} is not a hiermem memory file.")
    if data["format"] != format_version:
        raise VersionMismatchError(
            f"{path} was saved with format version {data['format']}, this hiermem reads version "
            f"{format_version}; load it with the hiermem version that wrote it and "
            "rebuild the memory from its messages."
        )
    return data, snap


def load_memory(
    cls: type[M],
    path: Path,
    embedder: Embedder | None = None,
    llm: LLM | None = None,
    classes: Mapping[str, type[HierarchicalMemory]]
    | Callable[[], Mapping[str, type[HierarchicalMemory]]] = (),
) -> M:
    """Load a save into a new ``cls`` instance (see :meth:`HierarchicalMemory.load`).

    Args:
        cls: the class ``load`` was called on (``HierarchicalMemory`` dispatches on the saved kind).
        path: the save directory.
        embedder: the embedder to use from now on.
        llm: the LLM to use from now on.
        classes: the memory classes by kind (or a callable returning them), for the dispatch.

    Returns:
        The memory.

    Raises:
        PersistenceError: not a saved memory, or corrupt.
        VersionMismatchError: saved by an incompatible format version or as another memory kind.
    """
    data, snap = read_save(path, cls.FORMAT_VERSION)
    if data["kind"] != cls.kind and cls.kind != "memory":
        raise VersionMismatchError(
            f"{path} holds a {data['kind']} memory; load it with that class, not {cls.__name__}."
        )
    if cls.kind == "memory":  # HierarchicalMemory.load: dispatch on the saved kind
        known = classes() if callable(classes) else dict(classes)
        if not isinstance(data["kind"], str) or data["kind"] not in known:
            raise PersistenceError(
                f"{path} holds an unknown memory kind {data['kind']!r}; the save is corrupt."
            )
        cls = known[data["kind"]]  # type: ignore[assignment]
    config = data["config"]
    if not isinstance(config, dict):
        raise PersistenceError("Saved config is not an object; the save is corrupt.")
    config = cls.stored_config(config)
    try:
        mem = cls(embedder=embedder, llm=llm, **config)
    except (TypeError, InvalidInputError, UnknownPolicyError) as e:
        raise PersistenceError(f"Saved config does not fit {cls.__name__}: {e}") from None
    dim = data.get("dim")
    index = None
    try:
        ids = [int(n["id"]) for n in data["tree"]["nodes"] if n.get("text")]
    except (KeyError, TypeError, ValueError):
        raise PersistenceError("Saved tree is malformed; the save is corrupt.") from None
    if (snap / _INDEX).is_file():
        if not isinstance(dim, int):
            raise PersistenceError("Saved dimension is missing; the save is corrupt.")
        check_embedder_dim(mem, dim, "The memory was saved with", "load")
        index = NodeIndex.read(snap / _INDEX, dim, ids)
    elif ids:
        raise PersistenceError("The vector index file is missing; the save is corrupt.")
    try:
        mem._restore(data, index)
    except PersistenceError:
        raise
    except Exception as e:
        raise PersistenceError(f"Saved memory is malformed: {type(e).__name__}: {e}") from None
    return mem
