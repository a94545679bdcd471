"""Small numpy helpers shared by the incremental structures: growable arrays, id -> position maps, and
one BLAS thread for a memory's own array work."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["grow", "lookup", "one_blas_thread", "positions", "unique_ints"]


def grow(a: np.ndarray, need: int, fill: Any = None, minimum: int = 16) -> np.ndarray:
    """``a`` with room for at least ``need`` entries along axis 0.

    Capacity at least doubles when it has to grow (amortised O(1) appends); the existing entries are
    copied, new ones are ``fill`` (uninitialised when ``None``). ``a`` itself is returned when it is
    large enough.

    Args:
        a: an array of any shape ``(n, ...)``.
        need: entries required along axis 0.
        fill: value of the new entries, or ``None`` to leave them uninitialised.
        minimum: smallest capacity allocated, default 16.

    Returns:
        ``a`` or a larger array of the same dtype and trailing shape.
    """
    if need <= len(a):
        return a
    shape = (max(need, 2 * len(a), minimum), *a.shape[1:])
    out = np.empty(shape, dtype=a.dtype) if fill is None else np.full(shape, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


def positions(ids: np.ndarray, size: int = 0) -> np.ndarray:
    """The inverse of an id array: ``out[ids[j]] = j``, ``-1`` for ids not in ``ids``.

    Args:
        ids: distinct non-negative ``int64`` ids ``(n,)``.
        size: length of the map at least (default: ``max(ids) + 1``).

    Returns:
        ``int64`` array ``(max(size, max(ids) + 1),)``.
    """
    ids = np.asarray(ids, dtype=np.int64)
    out = np.full(max(size, int(ids.max()) + 1 if len(ids) else 0), -1, dtype=np.int64)
    out[ids] = np.arange(len(ids), dtype=np.int64)
    return out


def lookup(table: np.ndarray, keys: np.ndarray, default: Any) -> np.ndarray:
    """``table[keys]`` for the keys inside the table, ``default`` for the others (negative or too large).

    Args:
        table: a 1-d array indexed by key (e.g. :func:`positions`' output, or values by node id).
        keys: integer keys ``(n,)``.
        default: the value for keys outside ``[0, len(table))``.

    Returns:
        ``(n,)`` array of ``table``'s dtype.
    """
    keys = np.asarray(keys, dtype=np.int64)
    out = np.full(len(keys), default, dtype=table.dtype)
    inside = (keys >= 0) & (keys < len(table))
    out[inside] = table[keys[inside]]
    return out


def unique_ints(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer array: ``numpy.unique(a)``, by a sort and a mask.

    numpy 2's hash-based ``unique`` took 10-40x the time of a sort on the id and slot arrays retrieval
    builds (1k-200k entries), and a third of a retrieval's CPU at 100k messages.

    Args:
        a: an integer array of any shape (read flattened).

    Returns:
        A new 1-d array of the same dtype, ascending, each value once.
    """
    b = np.sort(np.asarray(a).ravel())
    if len(b) < 2:
        return b
    keep = np.empty(len(b), dtype=bool)
    keep[0] = True
    np.not_equal(b[1:], b[:-1], out=keep[1:])
    return b[keep]


_blas_controller: Any = None
_blas_modules = -1
_blas_local = threading.local()


def _blas_libraries() -> Any:
    """The process's BLAS libraries (a threadpoolctl controller), looked up again when modules were
    imported since the last lookup."""
    global _blas_controller, _blas_modules
    if _blas_controller is None or _blas_modules != len(sys.modules):
        from threadpoolctl import ThreadpoolController

        _blas_controller = ThreadpoolController().select(user_api="blas")
        _blas_modules = len(sys.modules)
    return _blas_controller


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with the process's BLAS libraries on one thread (threadpoolctl), then give back
    their thread counts.

    A memory's matrix products are small (a block of rows against a few queries), where a second BLAS
    thread saves no time, and OpenBLAS's worker threads keep spinning for a while after each threaded
    call: interleaved with a bulk add's other work they kept a second core busy, 0.4-0.5x the CPU of
    embedding the messages, with the same wall time. Scores do not depend on it (see
    :func:`shared_core.scores.inner_products`).

    threadpoolctl's rules apply: a library whose thread count is the calling thread's (OpenMP builds,
    MKL) is limited in this thread only; one whose count is the process's (OpenBLAS on pthreads) is
    limited only when no other live thread controls it, and this thread gives that control up again
    when its outermost block leaves, so that the application's own limits keep working. Nested blocks
    in one thread limit once. 6 us per outermost block, more after an import (the libraries are looked
    up again).
    """
    depth = getattr(_blas_local, "depth", 0)
    limiter = _blas_libraries().limit(limits=1) if depth == 0 else None
    _blas_local.depth = depth + 1
    try:
        yield
    finally:
        _blas_local.depth = depth
        if limiter is not None:
            limiter.restore_original_limits()
            from threadpoolctl import OpenBLASController

            OpenBLASController.clear_controlling_thread()  # only when this thread holds it
