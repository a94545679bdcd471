"""Where a LlamaIndex index keeps its memory: ``<persist_dir>/hiermem/<index_id>`` (the core's JSON +
FAISS save, never pickle), copied through an fsspec filesystem (``fs=``) when the persist directory is
not local.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared_core.memories.base import HierarchicalMemory
from shared_core.stores.files import _CURRENT as SAVE_POINTER
from shared_core.stores.files import _MEMORY as SAVE_MANIFEST
from shared_core.types import (
    HierMemError,
    PersistenceError,
)

logger = logging.getLogger(__name__)

#: Sub-directory of a persist directory holding the memories (one save per index id).
MEMORY_DIR = "hiermem"


def _store_key(index_id: str) -> str:
    return f"hiermem-{index_id}"


def _memory_path(persist_dir: str | os.PathLike[str], index_id: str) -> Path:
    return Path(persist_dir) / MEMORY_DIR / index_id


# =========================================================================== fsspec transfer
def _local_dir(path: str | os.PathLike[str], fs: Any) -> Path | None:
    """``path`` as a local directory when ``fs`` is ``None`` or the local filesystem, else ``None``."""
    if fs is None:
        return Path(path)
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return Path(fs._strip_protocol(os.fspath(path)))
    return None


def _fs_path(fs: Any, path: str | os.PathLike[str]) -> str:
    """``path`` in ``fs``'s own form (protocol removed)."""
    return str(fs._strip_protocol(os.fspath(path)))


def _fs_join(base: str, *parts: str) -> str:
    """Join fsspec path parts with ``/`` (``base`` may be ``""`` or ``"/"``)."""
    head = base if not base or base.endswith("/") else base + "/"
    return head + "/".join(parts)


def _fs_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _fs_failure(e: Exception, doing: str, where: str, fs: Any) -> PersistenceError:
    return PersistenceError(f"Cannot {doing} {where} through {type(fs).__name__}: {type(e).__name__}: {e}")


def _check_snapshot_name(name: str, where: str) -> str:
    if not name.startswith("snapshot-") or "/" in name or "\\" in name or ".." in name:
        raise PersistenceError(f"{where} names an invalid snapshot; the save is corrupt.")
    return name


def _upload_save(local: Path, fs: Any, remote: str) -> None:
    """Copy the core save directory ``local`` to ``remote`` in ``fs``.

    The snapshot's files are written first and the pointer file last, then older snapshots are removed,
    so an interrupted upload leaves the previous save readable.

    Raises:
        PersistenceError: ``remote`` is a file or a non-empty directory that is not a hiermem save, or
            ``fs`` failed.
    """
    try:
        if fs.isfile(remote):
            raise PersistenceError(f"{remote} is a file; give a directory path to save into.")
        present = {_fs_name(p) for p in fs.ls(remote, detail=False)} if fs.isdir(remote) else set()
        if present and SAVE_POINTER not in present:
            raise PersistenceError(
                f"{remote} is a non-empty directory that is not a hiermem save; choose an empty or new "
                "directory."
            )
        snapshot = (local / SAVE_POINTER).read_text(encoding="utf-8").strip()
        fs.makedirs(_fs_join(remote, snapshot), exist_ok=True)
        for f in sorted((local / snapshot).iterdir()):
            fs.put_file(str(f), _fs_join(remote, snapshot, f.name))
        fs.pipe_file(_fs_join(remote, SAVE_POINTER), snapshot.encode("utf-8"))
        for name in sorted(present):
            if name != snapshot and name.startswith("snapshot-"):
                fs.rm(_fs_join(remote, name), recursive=True)
    except HierMemError:
        raise
    except Exception as e:
        raise _fs_failure(e, "save the memory to", remote, fs) from e


def _download_save(fs: Any, remote: str, local: Path, *, manifest_only: bool = False) -> Path:
    """Copy the save at ``remote`` in ``fs`` into the new local directory ``local``; return ``local``.

    Args:
        fs: the fsspec filesystem.
        remote: the save directory in ``fs``.
        local: a local path that does not exist yet.
        manifest_only: copy only the memory file (enough to read the memory's kind).

    Raises:
        PersistenceError: ``remote`` is not a hiermem save, or ``fs`` failed.
    """
    pointer = _fs_join(remote, SAVE_POINTER)
    try:
        try:
            raw = fs.cat_file(pointer)
        except FileNotFoundError:
            raise PersistenceError(
                f"{remote} is not a saved hiermem memory (no {SAVE_POINTER} file); save one with "
                "index.storage_context.persist(persist_dir, fs=fs)."
            ) from None
        snapshot = _check_snapshot_name(raw.decode("utf-8", "replace").strip(), pointer)
        (local / snapshot).mkdir(parents=True)
        (local / SAVE_POINTER).write_text(snapshot, encoding="utf-8")
        src_dir = _fs_join(remote, snapshot)
        names = [SAVE_MANIFEST] if manifest_only else [_fs_name(p) for p in fs.ls(src_dir, detail=False)]
        for name in names:
            src = _fs_join(src_dir, name)
            if name not in ("", ".", "..") and fs.isfile(src):
                fs.get_file(src, str(local / snapshot / name))
    except HierMemError:
        raise
    except Exception as e:
        raise _fs_failure(e, "read the memory saved in", remote, fs) from e
    return local


def _save_memory(
    memory: HierarchicalMemory, persist_dir: str | os.PathLike[str], index_id: str, fs: Any
) -> None:
    """Save ``memory`` to ``persist_dir/hiermem/<index_id>``, on the local disk or through ``fs``."""
    local = _local_dir(persist_dir, fs)
    if local is not None:
        memory.save(_memory_path(local, index_id))
        return
    with tempfile.TemporaryDirectory(prefix="hiermem-save-") as tmp:
        saved = memory.save(Path(tmp) / "save")
        _upload_save(saved, fs, _fs_join(_fs_path(fs, persist_dir), MEMORY_DIR, index_id))


@contextlib.contextmanager
def _readable_save(
    persist_dir: str | os.PathLike[str], index_id: str, fs: Any, *, manifest_only: bool = False
) -> Iterator[Path | None]:
    """A local directory holding the memory saved for ``index_id`` (``None`` when there is none).

    With a remote ``fs`` the save is copied into a temporary directory that lives as long as the context.

    Raises:
        PersistenceError: the save cannot be read through ``fs``.
    """
    local = _local_dir(persist_dir, fs)
    if local is not None:
        path = _memory_path(local, index_id)
        yield path if path.exists() else None
        return
    remote = _fs_join(_fs_path(fs, persist_dir), MEMORY_DIR, index_id)
    try:
        exists = bool(fs.exists(remote))
    except Exception as e:
        raise _fs_failure(e, "look for the memory in", remote, fs) from e
    if not exists:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="hiermem-load-") as tmp:
        yield _download_save(fs, remote, Path(tmp) / "save", manifest_only=manifest_only)
