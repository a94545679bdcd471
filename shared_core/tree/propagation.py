"""Structure-aware score propagation over a tree (SegTreeMem, Sec. 4.3.1, Eq. 3-4, Algorithm 2).

Any memory may use it: give the parent of every node (as positions in one array) and a local score
distribution; get the finite-horizon mixture of propagated distributions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..types import InvalidInputError, UnknownPolicyError, check_finite

__all__ = ["DIRECTIONS", "check_alpha", "check_horizon", "propagate", "propagation_matrix"]

DIRECTIONS = ("top_down", "bottom_up")


def propagation_matrix(parent: np.ndarray, direction: str, normalize: bool = True) -> sp.csr_matrix:
    """The sparse propagation operator ``W_P``.

    ``[W_P]_{uv}`` is the weight of moving relevance from node ``v`` to node ``u``:
    ``top_down`` moves a parent's mass to its children, in equal shares (``1/|ch(v)|``, the paper's
    column-normalised operator) or, with ``normalize=False``, whole to every child (``1``: each child
    inherits its parent's score); ``bottom_up`` moves a child's whole mass to its parent (``1``).
    Columns of nodes with nowhere to go (leaves for ``top_down``, the root for ``bottom_up``) are zero.

    Args:
        parent: ``int`` array ``(n,)``: position of each node's parent, ``-1`` for a root.
        direction: ``"top_down"`` or ``"bottom_up"``.
        normalize: column-normalise ``top_down`` (default ``True``, the paper); ignored for ``bottom_up``,
            whose columns already sum to 1.

    Returns:
        ``scipy.sparse.csr_matrix`` of shape ``(n, n)``, ``float64``.

    Raises:
        UnknownPolicyError: an unknown direction.

    References:
        SegTreeMem paper, Sec. 4.3.1 and Figure 3.
    """
    parent = np.asarray(parent, dtype=np.int64)
    n = parent.shape[0]
    child = np.nonzero(parent >= 0)[0]
    par = parent[child]
    if direction == "bottom_up":
        rows, cols, vals = par, child, np.ones(len(child))
    elif direction == "top_down":
        n_children = np.bincount(par, minlength=n).astype(np.float64)
        rows, cols = child, par
        vals = 1.0 / n_children[par] if normalize else np.ones(len(child))
    else:
        raise UnknownPolicyError(f"direction must be one of {DIRECTIONS}, got {direction!r}.")
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


def check_alpha(value: Any) -> float:
    """A propagation decay ``alpha`` in ``[0, 1)``.

    Raises:
        InvalidInputError: not a finite number in ``[0, 1)`` (booleans included).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidInputError(f"alpha must be a number in [0, 1), got {value!r}.")
    alpha = check_finite(value, "alpha")
    if not 0.0 <= alpha < 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1), got {value!r}.")
    return alpha


def check_horizon(value: Any) -> int:
    """A propagation horizon ``H``: a non-negative integer.

    Raises:
        InvalidInputError: not a non-negative integer.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidInputError(f"horizon must be a non-negative integer, got {value!r}.")
    return int(value)


def _check_decay(alpha: float, horizon: int) -> int:
    """Validate the decay ``alpha`` in ``[0, 1)`` and the horizon ``H >= 0``; return ``H`` as an int."""
    if not 0.0 <= alpha < 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1), got {alpha}.")
    if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 0:
        raise InvalidInputError(f"horizon must be a non-negative integer, got {horizon}.")
    return int(horizon)


def propagate(W: sp.spmatrix | None, s0: np.ndarray, alpha: float, horizon: int) -> np.ndarray:
    """Finite-horizon mixture ``s~ = sum_{k=0..H} alpha^k W^k s0 / sum_{k=0..H} alpha^k``.

    Args:
        W: the operator from :func:`propagation_matrix` (ignored when ``horizon == 0``).
        s0: initial distribution, ``float`` array ``(n,)`` (non-negative, summing to 1).
        alpha: decay, ``0 <= alpha < 1``.
        horizon: ``H >= 0`` propagation steps; ``0`` returns ``s0`` (collapsed retrieval).

    Returns:
        ``float64`` array ``(n,)``.

    Raises:
        InvalidInputError: ``alpha`` outside ``[0, 1)`` or a negative ``horizon``.

    References:
        SegTreeMem paper, Eq. (3)-(4); Appendix A, Algorithm 2, lines 6-13.
    """
    H = _check_decay(alpha, horizon)
    s_prev = np.asarray(s0, dtype=np.float64)
    total = s_prev.copy()
    norm = 1.0
    for k in range(1, H + 1):
        assert W is not None
        s_prev = W @ s_prev
        total += alpha**k * s_prev
        norm += alpha**k
    return total / norm


def propagate_parents(
    parent: np.ndarray,
    s0: np.ndarray,
    direction: str,
    alpha: float,
    horizon: int,
    *,
    normalize: bool = True,
) -> np.ndarray:
    """:func:`propagate` with :func:`propagation_matrix`'s operator applied from the parent array directly.

    One step of ``W_P`` is a gather (``top_down``: every child takes its parent's mass, whole or
    divided by the parent's number of children) or a scatter-add (``bottom_up``: every parent gathers its
    children's mass), so no sparse matrix is built: O(n·H) with no construction cost, for trees that
    change between queries.

    Args:
        parent: ``int`` ``(n,)``: position of each node's parent, ``-1`` for a root.
        s0: initial distribution ``(n,)``. direction: ``"top_down"`` or ``"bottom_up"``.
        alpha: decay in ``[0, 1)``. horizon: ``H >= 0``.
        normalize: split a parent's mass among its children (``top_down``; the paper's operator).

    Returns:
        ``float64`` ``(n,)``, equal to ``propagate(propagation_matrix(parent, direction, normalize),
        s0, alpha, horizon)``.

    Raises:
        InvalidInputError: ``alpha`` outside ``[0, 1)`` or a negative ``horizon``.
        UnknownPolicyError: an unknown direction.

    References:
        SegTreeMem paper, Eq. (3)-(4); Appendix A, Algorithm 2, lines 6-13.
    """
    if direction not in DIRECTIONS:
        raise UnknownPolicyError(f"direction must be one of {DIRECTIONS}, got {direction!r}.")
    H = _check_decay(alpha, horizon)
    parent = np.asarray(parent, dtype=np.int64)
    s_prev = np.asarray(s0, dtype=np.float64)
    total = s_prev.copy()
    if H == 0:
        return total
    n = len(s_prev)
    kid = np.nonzero(parent >= 0)[0]
    P = parent[kid]
    share = None
    if direction == "top_down" and normalize:
        share = 1.0 / np.maximum(np.bincount(P, minlength=n), 1)[P]
    norm = 1.0
    for k in range(1, H + 1):
        if direction == "top_down":
            nxt = np.zeros(n)
            nxt[kid] = s_prev[P] if share is None else s_prev[P] * share
        else:
            nxt = np.bincount(P, weights=s_prev[kid], minlength=n)
        s_prev = nxt
        total += alpha**k * s_prev
        norm += alpha**k
    return total / norm


def propagate_levelled(
    parent: np.ndarray,
    gap: np.ndarray,
    r: np.ndarray,
    direction: str,
    alpha: float,
    horizon: int,
    *,
    normalize: bool = True,
    with_copies: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2 (lines 6-13) on a levelled tree whose single-child chain nodes are not stored.

    Node ``j`` stands for itself and ``gap[j]`` single-child copies of it between it and its parent
    (same local relevance). The result equals :func:`propagate` with :func:`propagation_matrix` on the
    tree with every copy written out, in O(n·H) time instead of O(n·H + copies).

    Args:
        parent: ``int`` ``(n,)``: parent position of each stored node, ``-1`` for the root.
        gap: ``int`` ``(n,)``: copies between each node and its parent (``0`` for the root).
        r: local relevance ``(n,)`` (non-negative) of the stored nodes.
        direction: ``"top_down"`` or ``"bottom_up"``.
        alpha: decay in ``[0, 1)``. horizon: ``H >= 0``.
        normalize: ``top_down`` splits a parent's mass among its children (the paper's column-normalised
            operator, default) or gives each child all of it (``False``).
        with_copies: also score the copies (default ``True``); with ``False`` ``best`` is ``scores``.

    Returns:
        ``(scores, best)``, ``float64`` ``(n,)``: the score of each stored node, and the best score among
        it and its copies (what the node ranks with when every node is admissible).

    Raises:
        InvalidInputError: ``alpha`` outside ``[0, 1)`` or a negative ``horizon``.
        UnknownPolicyError: an unknown direction.

    References:
        SegTreeMem paper, Eq. (3)-(4); Appendix A, Algorithm 1 (chains) and Algorithm 2.
    """
    if direction not in DIRECTIONS:
        raise UnknownPolicyError(f"direction must be one of {DIRECTIONS}, got {direction!r}.")
    H = _check_decay(alpha, horizon)
    parent = np.asarray(parent, dtype=np.int64)
    gap = np.asarray(gap, dtype=np.int64)
    r = np.asarray(r, dtype=np.float64)
    n = len(r)
    weight = 1.0 + gap  # a node and its copies
    total = float((r * weight).sum())  # no BLAS call: a threaded dot product costs more than it saves
    s0 = r / total if total > 0 else np.full(n, 1.0 / float(weight.sum()))
    powers = alpha ** np.arange(H + 1, dtype=np.float64)
    norm = float(powers.sum())
    kid = np.nonzero(parent >= 0)[0]
    P = parent[kid]
    g = gap[kid]
    # M[k, j]: the mass that k steps of W bring to node j
    M = np.zeros((H + 1, n))
    M[0] = s0
    if direction == "top_down":
        if normalize:
            f = 1.0 / np.maximum(np.bincount(P, minlength=n), 1)
        else:
            f = np.ones(n)
        fP = f[P]
        for k in range(1, H + 1):  # the ancestor k levels up is a copy (k <= gap) or above the parent
            up = k - g - 1
            M[k, kid] = np.where(up < 0, s0[kid], fP * M[np.maximum(up, 0), P])
    else:
        for k in range(1, H + 1):  # the descendants k levels down, through each child's copies
            down = k - g - 1
            contrib = np.where(down <= 0, s0[kid], M[np.maximum(down, 0), kid])
            np.add.at(M[k], P, contrib)
    scores = sum(powers[k] * M[k] for k in range(H + 1)) / norm
    if not with_copies:
        return scores, scores
    best = scores.copy()
    # copies: e copies above it (top_down) or d copies below it (bottom_up); beyond H they score s0
    for e in range(0, H + 1):
        has = g > e  # the node has a copy with e copies above it (top_down) / e + 1 below it (bottom_up)
        idx = kid[has]
        if not len(idx):
            continue
        if direction == "top_down":
            terms = [s0[idx] if k <= e else fP[has] * M[k - e - 1, parent[idx]] for k in range(H + 1)]
        else:
            d = e + 1  # copy d levels above its node
            terms = [s0[idx] if k <= d else M[k - d, idx] for k in range(H + 1)]
        val = sum(powers[k] * terms[k] for k in range(H + 1)) / norm
        best[idx] = np.maximum(best[idx], val)
    return scores, best
