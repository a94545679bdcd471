"""The sparsity-semantics objective of a theme partition, f(P) = SparsityScore + SemScore (Eq. 1-3).

References:
    Hu et al., "Beyond RAG for Agent Memory: Retrieval by Decoupling and Aggregation" (xMemory):
    Sec. 3.2, Eq. (1)-(3); Appendix B.2.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ...types import InvalidInputError

__all__ = [
    "bell_regularizer",
    "candidate_splits",
    "nearest_theme_similarities",
    "partition_objective",
    "sem_score",
    "sparsity_score",
    "theme_cohesion",
]


def sparsity_score(sizes: Sequence[int] | np.ndarray) -> float:
    """SparsityScore of a partition: ``N^2 / (K * sum_k n_k^2)`` (Eq. 2).

    It is ``(N / K) / E[n_cluster]`` with ``E[n_cluster] = (1/N) sum_k n_k^2``, the expected size of the
    theme that a uniformly drawn semantic falls in. By Cauchy-Schwarz it lies in ``(0, 1]`` and equals
    1 exactly when all themes have the same size.

    Args:
        sizes: theme sizes ``n_k`` (K >= 1 positive integers).

    Returns:
        The score (float).

    Raises:
        InvalidInputError: no theme or a size < 1.

    References:
        xMemory Sec. 3.2, Eq. (2); Appendix B.2.
    """
    n = np.asarray(sizes, dtype=np.float64).ravel()
    if n.size == 0 or (n < 1).any():
        raise InvalidInputError("sparsity_score needs at least one theme and sizes >= 1.")
    N = n.sum()
    return float(N * N / (n.size * float((n * n).sum())))


def nearest_theme_similarities(centroids: np.ndarray) -> np.ndarray:
    """``s_k = max_{j != k} cos(mu_k, mu_j)``: each theme's nearest-neighbour similarity (Eq. 3).

    Args:
        centroids: theme centroids, float array ``(K, d)`` with K >= 2 (any norm; zero rows give 0).

    Returns:
        float64 array ``(K,)``.

    Raises:
        InvalidInputError: fewer than two themes.

    References:
        xMemory Sec. 3.2, definition of ``s_k`` below Eq. (3).
    """
    C = np.asarray(centroids, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] < 2:
        raise InvalidInputError("nearest-neighbour similarities need at least two theme centroids.")
    norms = np.linalg.norm(C, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    C = C / norms
    S = C @ C.T
    np.fill_diagonal(S, -np.inf)
    return S.max(axis=1)


def bell_regularizer(s: Sequence[float] | np.ndarray, eps: float = 1e-2) -> np.ndarray:
    """Bell-shaped regulariser ``g(s_k) = exp(-(s_k - m)^2 / (2 sigma^2))`` (Eq. 3).

    ``m = median(s)`` and ``sigma = median(|s - m|) + eps`` (median absolute deviation, a robust scale):
    themes whose nearest neighbour is much closer than usual (redundant) or much farther (islands) are
    penalised.

    Args:
        s: nearest-neighbour similarities ``s_k`` (K >= 1 finite values).
        eps: the ``epsilon`` added to the MAD, default 0.01 (the paper leaves its value open).

    Returns:
        float64 array ``(K,)`` with values in ``(0, 1]``.

    Raises:
        InvalidInputError: empty input, non-finite values or ``eps <= 0``.

    References:
        xMemory Sec. 3.2, Eq. (3).
    """
    x = np.asarray(s, dtype=np.float64).ravel()
    if x.size == 0 or not np.isfinite(x).all():
        raise InvalidInputError("bell_regularizer needs at least one finite similarity.")
    if not eps > 0:
        raise InvalidInputError("eps must be > 0.")
    m = float(np.median(x))
    sigma = float(np.median(np.abs(x - m))) + eps
    return np.exp(-((x - m) ** 2) / (2.0 * sigma * sigma))


def _normalize64(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise InvalidInputError(f"Expected a 2-d array of embeddings, got shape {X.shape}.")
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return X / norms


def theme_cohesion(X: np.ndarray) -> tuple[float, np.ndarray]:
    """Cohesion of one theme: mean cosine between its semantics and their centroid (Eq. 3).

    Args:
        X: the theme's semantic embeddings, float array ``(n_k, d)``, n_k >= 1.

    Returns:
        ``(cohesion, centroid)``: ``(1/n_k) sum_i cos(x_i, mu_k)`` (float) and ``mu_k``, the mean of the
        L2-normalised rows (float64 ``(d,)``).

    References:
        xMemory Sec. 3.2, Eq. (3) (intra-theme term).
    """
    Xn = _normalize64(X)
    if Xn.shape[0] == 0:
        raise InvalidInputError("A theme needs at least one semantic.")
    mu = Xn.mean(axis=0)
    norm = float(np.linalg.norm(mu))
    if norm == 0.0:
        return 0.0, mu
    return float((Xn @ mu).mean() / norm), mu


def sem_score(cohesions: Sequence[float] | np.ndarray, centroids: np.ndarray, eps: float = 1e-2) -> float:
    """SemScore: ``(1/K) sum_k cohesion_k * g(s_k)`` (Eq. 3).

    With a single theme there is no inter-theme relation; ``g`` is taken as 1.

    Args:
        cohesions: per-theme cohesion, float ``(K,)``.
        centroids: theme centroids, float ``(K, d)``.
        eps: the MAD offset of :func:`bell_regularizer`, default 0.01.

    Returns:
        The score (float).

    References:
        xMemory Sec. 3.2, Eq. (3).
    """
    c = np.asarray(cohesions, dtype=np.float64).ravel()
    if c.size == 0:
        raise InvalidInputError("sem_score needs at least one theme.")
    if c.size == 1:
        return float(c[0])
    g = bell_regularizer(nearest_theme_similarities(centroids), eps)
    return float((c * g).mean())


def _objective_from_stats(
    sizes: Sequence[int], cohesions: Sequence[float], centroids: np.ndarray, eps: float
) -> float:
    return sparsity_score(sizes) + sem_score(cohesions, centroids, eps)


def partition_objective(X: np.ndarray, labels: Sequence[Any], eps: float = 1e-2) -> float:
    """``f(P) = SparsityScore(P) + SemScore(P)`` of a partition of semantic embeddings (Eq. 1).

    Args:
        X: semantic embeddings, float array ``(N, d)``.
        labels: theme label of each row (length N; any hashable values).
        eps: the MAD offset of the bell regulariser, default 0.01.

    Returns:
        ``f(P)`` (float).

    Raises:
        InvalidInputError: ``labels`` does not have one entry per row, or ``N = 0``.

    References:
        xMemory Sec. 3.2, Eq. (1)-(3).
    """
    X = np.asarray(X, dtype=np.float64)
    labels = list(labels)
    if X.ndim != 2 or X.shape[0] == 0 or len(labels) != X.shape[0]:
        raise InvalidInputError("partition_objective needs X of shape (N, d), N >= 1, and N labels.")
    order = list(dict.fromkeys(labels))
    sizes, cohs, cents = [], [], []
    for lab in order:
        rows = [i for i, x in enumerate(labels) if x == lab]
        coh, mu = theme_cohesion(X[rows])
        sizes.append(len(rows))
        cohs.append(coh)
        cents.append(mu)
    return _objective_from_stats(sizes, cohs, np.stack(cents), eps)


def candidate_splits(X: np.ndarray, max_parts: int = 3) -> list[np.ndarray]:
    """Candidate partitions of an overcrowded theme, by clustering its semantics.

    Agglomerative clustering of the L2-normalised embeddings with average and Ward linkage
    (``scipy.cluster.hierarchy``), each dendrogram cut into 2..``max_parts`` clusters; duplicates are
    removed. Deterministic. When clustering cannot separate the rows (e.g. identical vectors), the rows
    are split into two halves in order.

    Args:
        X: the theme's semantic embeddings, float ``(n, d)``, n >= 2.
        max_parts: the largest number of parts tried, default 3.

    Returns:
        Label arrays (int, shape ``(n,)``, labels ``0..m-1`` in order of first appearance), each with at
        least two parts.

    References:
        xMemory Sec. 3.2 "Guided attach, split, and merge" (candidate splits by clustering).
    """
    from scipy.cluster.hierarchy import fcluster, linkage

    Xn = _normalize64(X)
    n = Xn.shape[0]
    if n < 2:
        raise InvalidInputError("A split needs at least two semantics.")
    out: list[np.ndarray] = []
    seen: set[tuple[int, ...]] = set()
    for method in ("average", "ward"):
        Z = linkage(Xn, method=method, metric="euclidean")
        for k in range(2, min(n, max(2, max_parts)) + 1):
            lab = fcluster(Z, k, criterion="maxclust")
            canon = _canonical(lab)
            if len(set(canon)) >= 2 and tuple(canon) not in seen:
                seen.add(tuple(canon))
                out.append(np.asarray(canon))
    if not out:
        out.append(np.asarray([0] * (n // 2) + [1] * (n - n // 2)))
    return out


def _canonical(labels: Iterable[Any]) -> list[int]:
    m: dict[Any, int] = {}
    return [m.setdefault(x, len(m)) for x in labels]
