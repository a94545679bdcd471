"""Structure-aware score propagation over a tree (SegTreeMem, Sec. 4.3.1, Eq. 3-4, Algorithm 2).

Any memory may use it: give the parent of every node (as positions in one array) and a local score
distribution; get the finite-horizon mixture of propagated distributions.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .types import InvalidInputError, UnknownPolicyError

__all__ = ["DIRECTIONS", "propagate", "propagation_matrix"]

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
    if not 0.0 <= alpha < 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1), got {alpha}.")
    if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 0:
        raise InvalidInputError(f"horizon must be a non-negative integer, got {horizon}.")
    s_prev = np.asarray(s0, dtype=np.float64)
    total = s_prev.copy()
    norm = 1.0
    for k in range(1, int(horizon) + 1):
        assert W is not None
        s_prev = W @ s_prev
        total += alpha**k * s_prev
        norm += alpha**k
    return total / norm
