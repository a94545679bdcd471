"""Relevance fusion: max-normalised convex fusion of a dense and a lexical score (pure functions).

One implementation of the ``hybrid`` relevance formula, for the memories' relevance layer
(:meth:`~shared_core.memories.base.HierarchicalMemory.relevance`) and the flat ``fusion`` baseline
(:class:`~shared_core.eval.baselines.FlatFusion`)::

    fused = w * dense / max(dense) + (1 - w) * bm25 / max(bm25)

where each part is left as it is (all zeros) when its maximum is 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..types import InvalidInputError

__all__ = ["DEFAULT_HYBRID_WEIGHT", "check_weight", "fuse", "max_normalized"]

DEFAULT_HYBRID_WEIGHT = 0.5
"""Default weight ``w`` of the dense part (the memories' ``hybrid_weight`` default)."""


def check_weight(value: Any, name: str = "hybrid_weight") -> float:
    """A convex weight in ``[0, 1]``.

    Args:
        value: the weight (a real number; ``bool`` is refused).
        name: how to name it in the error message, default ``"hybrid_weight"``.

    Returns:
        ``value`` as a ``float``.

    Raises:
        InvalidInputError: not a finite real number in ``[0, 1]``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidInputError(f"{name} must be a number in [0, 1], got {value!r}.")
    w = float(value)
    if not math.isfinite(w) or not 0.0 <= w <= 1.0:
        raise InvalidInputError(f"{name} must be in [0, 1], got {value!r}.")
    return w


def _scores(x: Any, name: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a 1-D array of numbers.") from None
    if a.ndim != 1:
        raise InvalidInputError(f"{name} must be 1-D, got shape {a.shape}.")
    if a.size and not (np.all(np.isfinite(a)) and a.min() >= 0.0):
        raise InvalidInputError(f"{name} must hold finite scores >= 0 (clip cosines with max(cos, 0)).")
    return a


def max_normalized(scores: Any, maximum: float | None = None) -> np.ndarray:
    """Scores divided by their maximum; all zeros (or empty) stay as they are.

    Args:
        scores: array-like ``(n,)`` of finite scores ``>= 0``.
        maximum: the maximum to divide by (e.g. over a larger set the scores are a part of); default
            ``None`` = ``max(scores)``. A maximum of 0 leaves the scores as they are.

    Returns:
        ``float32`` array ``(n,)`` in ``[0, 1]`` (a new array).

    Raises:
        InvalidInputError: not 1-D, a negative or non-finite score, or ``maximum`` below a score.
    """
    a = _scores(scores, "scores")
    if a.size == 0:
        return a.copy()
    m = a.max() if maximum is None else np.float32(maximum)
    if m < a.max():
        raise InvalidInputError(f"maximum {maximum} is below the largest score {a.max()}.")
    return a / m if m > 0 else a.copy()


def fuse(
    dense: Any,
    bm25: Any,
    weight: float = DEFAULT_HYBRID_WEIGHT,
    maxima: tuple[float, float] | None = None,
) -> np.ndarray:
    """Max-normalised convex fusion of two score vectors over the same candidates.

    ``weight * dense / max(dense) + (1 - weight) * bm25 / max(bm25)``, each part left at zero when its
    maximum is 0. Computed in ``float32`` exactly as the memories' ``hybrid`` relevance has been.

    Args:
        dense: array-like ``(n,)`` of dense scores ``>= 0``, typically ``max(cos, 0)``.
        bm25: array-like ``(n,)`` of lexical scores ``>= 0`` (BM25) of the same candidates in the same
            order.
        weight: ``w``, the weight of the dense part, in ``[0, 1]``; default 0.5.
        maxima: ``(max dense, max bm25)`` to normalise by, when the candidates are part of a larger
            set (the part of a set's fusion that falls on them); default ``None`` = their own maxima.

    Returns:
        ``float32`` array ``(n,)`` in ``[0, 1]``.

    Raises:
        InvalidInputError: the arrays are not 1-D, differ in length, hold a negative or non-finite
            score, or ``weight`` is outside ``[0, 1]``.

    References:
        Bruch, Gai & Ingber (2023), "An Analysis of Fusion Functions for Hybrid Retrieval" (convex
        combination of normalised lexical and semantic scores).
    """
    w = check_weight(weight)
    md, mb = (None, None) if maxima is None else maxima
    d = max_normalized(_scores(dense, "dense"), md)
    b = max_normalized(_scores(bm25, "bm25"), mb)
    if d.shape != b.shape:
        raise InvalidInputError(f"dense and bm25 differ in length ({d.size} and {b.size}).")
    return (w * d + (1.0 - w) * b).astype(np.float32)
