"""Scores: the one dense score function of hiermem and its helpers (ground layer, numpy only).

Every dense score (node index, baselines, summarisers) is :func:`inner_products`: the exact dot product of
float32 vectors rounded to float32, computed in float64 with a proven error bound and an exact
``math.fsum`` fallback where the bound cannot decide the rounding; the same bits on every CPU, whatever
the SIMD level or thread count. :func:`top_k` breaks exact ties by id, ascending.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .types import InvalidInputError

__all__ = ["UNIT_ROW_NORM", "exact_dot", "inner_products", "normalize_rows", "top_k", "unit_row_norm"]


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """L2-normalise the rows of a float32 array ``(n, d)``; zero rows stay zero."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return x / norms


#: an upper bound of the L2 norm of a row normalised by :func:`normalize_rows` (its norm is 1 within
#: about ``d * 2^-24``, under 1e-3 below 16,000 dimensions); the error bound of :func:`inner_products`
#: for the node index's rows (see :func:`unit_row_norm`)
UNIT_ROW_NORM = 1.001


def unit_row_norm(dim: int) -> float | None:
    """:data:`UNIT_ROW_NORM` for normalised rows of ``dim`` dimensions, ``None`` (compute the norms)
    past 16,000 dimensions, where float32 rounding could take a norm above it."""
    return UNIT_ROW_NORM if dim <= 16_000 else None


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best scores, best first, exact ties by id ascending.

    The ranking rule of every top-k cut: ``np.lexsort((ids, -scores))[:k]``, computed by selecting
    with ``argpartition`` every position scoring at least the ``k``-th best (ties kept whole, so the
    cut does not depend on ``argpartition``'s unstable order) and sorting only those.

    Args:
        ids: ``int64 (n,)`` distinct ids (node ids, insertion indices). scores: ``(n,)``. k: >= 0.

    Returns:
        ``int64 (min(k, n),)`` positions.
    """
    ids = np.asarray(ids)
    neg = -np.asarray(scores, dtype=np.float64)
    k = min(int(k), len(neg))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    pos = np.arange(len(neg), dtype=np.int64)
    if len(neg) > k:
        pos = np.flatnonzero(neg <= np.partition(neg, k - 1)[k - 1])
    return pos[np.lexsort((ids[pos], neg[pos]))][:k]


_U = 2.0**-53  # unit roundoff of float64
_TINY = float(np.finfo(np.float64).tiny)
_CHUNK_VALUES = 1 << 20  # float64 values per block (8 MB): rows per block = this // (d + queries)
# float64 values per block of a single query (2 MB, in cache while BLAS reads it back; under OpenBLAS's
# threshold for a threaded gemv): converting the rows to float64 costs more than the products, and a
# block that stays in cache is read back at no cost to memory bandwidth
_GEMV_VALUES = 1 << 18
_scratch = threading.local()  # per-thread float64 block, reused across calls


def _products64(B: np.ndarray, QT: np.ndarray) -> np.ndarray:
    """``B @ QT`` in float64 by whatever kernel BLAS picks: any order of summation will do (the result
    only has to lie within the error bound of :func:`inner_products`; tests replace it with other
    orders to check that the scores do not change)."""
    if QT.shape[1] == 1:
        # one query: BLAS's gemv on a block of at most _GEMV_VALUES values, which OpenBLAS runs on one
        # thread (it threads a gemv from 115,200 x 4 values on; a threaded gemv, or a gemm with n = 1,
        # took 5-10x longer on a 2-core machine). 1.4x faster than numpy's einsum loop at 100k x 384.
        return np.dot(B, QT)
    return B @ QT  # several queries: a gemm, faster than one pass per query from 8 queries on


def _block(rows: int, d: int) -> np.ndarray:
    """A float64 scratch block of at least ``rows x d`` values for this thread (reused)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < rows * d:
        buf = _scratch.buf = np.empty(max(rows * d, 1), dtype=np.float64)
    return buf[: rows * d].reshape(rows, d)


def exact_dot(x: np.ndarray, y: np.ndarray) -> np.float32:
    """The float32 nearest to the exact dot product of two float32 vectors (ties to even).

    The products of float32 numbers are exact in float64; :func:`math.fsum` returns their exact sum
    rounded to float64, and a sum that lands exactly halfway between two float32 numbers is resolved
    by the sign of the exact remainder (no double rounding). Slow (a Python sum): for the few values
    :func:`inner_products` cannot settle from its float64 product.
    """
    p = (np.asarray(x, dtype=np.float32).astype(np.float64) * np.asarray(y, dtype=np.float32)).tolist()
    f = math.fsum(p)
    r = np.float32(f)
    if math.isfinite(f) and float(r) != f:
        other = np.nextafter(r, np.float32(np.inf) if f > float(r) else np.float32(-np.inf))
        if (float(r) + float(other)) / 2 == f:  # halfway: the float64 rounding may have moved s onto it
            rest = math.fsum([*p, -f])
            if rest > 0:
                r = max(r, other)
            elif rest < 0:
                r = min(r, other)
    return np.float32(r)


def _round_into(
    out: np.ndarray, S: np.ndarray, s: int, err: np.ndarray, X: np.ndarray, Q: np.ndarray
) -> None:
    """Write the float32 roundings of the exact products of rows ``s, s + 1, ...`` of ``X`` with ``Q``
    into ``out[:, s:s + len(S)]``, from their float64 products ``S (rows, m)`` within ``err (m,)``."""
    lo = (S - err).astype(np.float32)
    hi = (S + err).astype(np.float32)
    out[:, s : s + len(S)] = lo.T  # = the rounding of S and of the exact value, where lo == hi
    unsure = np.argwhere((lo != hi) & np.isfinite(S))
    for i, j in unsure.tolist():
        out[j, s + i] = exact_dot(X[s + i], Q[j])


def inner_products(X: np.ndarray, queries: np.ndarray, *, row_norm: float | None = None) -> np.ndarray:
    """Inner products of every row of ``X`` with each query: the exact value rounded to float32.

    Every value is the float32 nearest to the exact dot product of the two float32 vectors (ties to
    even): a function of the pair alone, whatever the CPU, SIMD width, BLAS kernel, batch, row
    position or memory alignment. So ``ip(x, y)`` is bitwise ``ip(y, x)``, scoring a part of the rows
    gives the values scoring all of them gives, and a ranking cut on these values (ties broken by a
    stable key) is the same on every machine. This is the one dense score every ranking of the
    memories and the flat baselines reads (:meth:`NodeIndex.scores_all`, :meth:`NodeIndex.search`).

    How: products of float32 numbers are exact in float64, so a float64 matrix product (any order,
    any kernel) is within ``gamma_d * sum_j |x_j q_j| <= gamma_d * |x| |q|`` of the exact sum
    (``gamma_d = d u / (1 - d u)``, ``u = 2^-53``; Higham, "Accuracy and Stability of Numerical
    Algorithms", Sec. 4.2). When both ends of that interval round to the same float32, so does the
    exact value (rounding is monotone); the rare value whose interval holds a float32 rounding
    boundary (about 2 in 10,000 for unit vectors of 384 dimensions) is computed exactly
    (:func:`exact_dot`, 20 us each). About 2.5x the cost of a float32 SIMD product such as FAISS's
    kernel (whose sums depend on the SIMD width, the row's alignment and, for some widths, its position
    in the batch), single-threaded: 11-12 against 4.6-5 ms for 100k rows of 384, 7 of them converting
    the rows to float64 in blocks that stay in cache.

    Args:
        X: float32 ``(n, d)`` (other dtypes are converted to float32 first).
        queries: float32 ``(m, d)`` or ``(d,)``.
        row_norm: an upper bound of the rows' L2 norms, when the caller knows one (e.g.
            :func:`unit_row_norm` for normalised rows); default ``None`` = computed.

    Returns:
        float32 ``(m, n)``, or ``(n,)`` for a single ``(d,)`` query.

    Raises:
        InvalidInputError: the queries' dimension differs from the rows'.
    """
    X = np.asarray(X, dtype=np.float32)
    Q = np.ascontiguousarray(queries, dtype=np.float32)
    single = Q.ndim == 1
    Q = Q.reshape(1, -1) if single else Q
    n, d = X.shape if X.ndim == 2 else (0, Q.shape[1])
    if Q.shape[1] != d and n:
        raise InvalidInputError(f"queries have dimension {Q.shape[1]}, rows {d}.")
    out = np.empty((len(Q), n), dtype=np.float32)
    if n and len(Q):
        Q64 = Q.astype(np.float64)
        QT = np.ascontiguousarray(Q64.T)
        qn = np.sqrt(np.einsum("ij,ij->i", Q64, Q64))
        if row_norm is None:
            row_norm = float(np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64).max()))
        gamma = d * _U / (1.0 - d * _U)  # d - 1 roundings of the additions: gamma_{d-1} < gamma_d
        # plus the rounding of S -/+ err themselves (2u |S|, |S| <= |x| |q|), with room for the
        # rounding of the norms
        err = (gamma + 4 * _U) * float(row_norm) * qn * (1.0 + 1e-3) + 4.0 * _TINY
        budget = _GEMV_VALUES if len(Q) == 1 else _CHUNK_VALUES
        step = max(1, budget // max(d + len(Q), 1))  # a block and its products fit the budget
        if len(Q) == 1:  # one query: the products of every block first, then one rounding pass
            S = np.empty((n, 1))
            for s in range(0, n, step):
                e = min(n, s + step)
                B = _block(e - s, d)
                np.copyto(B, X[s:e])
                S[s:e] = _products64(B, QT)
            _round_into(out, S, 0, err, X, Q)
        else:
            for s in range(0, n, step):
                e = min(n, s + step)
                B = _block(e - s, d)
                np.copyto(B, X[s:e])
                _round_into(out, _products64(B, QT), s, err, X, Q)
    return out[0] if single else out
