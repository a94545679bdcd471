"""Best-first walks over scored nodes and the token budget they are walked under.

The primitives every ranking of the memories shares (:class:`~shared_core.search.ranking.Ranking`, the
candidate path of :mod:`~shared_core.search.candidates`, MemTree's selection): the choices of relevance
and admissible set, the best-first order with ties by node id, and the greedy ``max_tokens`` budget.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..types import InvalidInputError, UnknownPolicyError, count_tokens

__all__ = [
    "ADMISSIBLE",
    "RELEVANCE_KINDS",
    "TokenBudget",
    "best_first",
    "check_choice",
    "check_limits",
    "check_score",
]

#: local relevance functions every memory offers (:meth:`HierarchicalMemory.relevance`)
RELEVANCE_KINDS = ("dense", "bm25", "hybrid")
#: admissible sets of a ranking: every node with text, or message leaves only
ADMISSIBLE = ("all", "leaves")


def check_choice(value: Any, choices: Sequence[str], name: str) -> str:
    """Return ``value`` when it is one of ``choices``.

    Raises:
        UnknownPolicyError: naming the accepted values.
    """
    if not isinstance(value, str) or value not in choices:
        raise UnknownPolicyError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}.")
    return value


def check_limits(k: Any, max_tokens: Any, min_score: Any) -> tuple[int, int | None, float | None]:
    """The checked limits of a retrieval: ``k`` hits, a ``max_tokens`` budget, a ``min_score`` threshold.

    Returns:
        ``(k, max_tokens, min_score)`` as ``int``, ``int`` or ``None``, ``float`` or ``None``.

    Raises:
        InvalidInputError: ``k`` not a positive integer, ``max_tokens`` below 1, ``min_score`` not a
            number in ``[0, 1]``; naming the value.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
    if max_tokens is not None and (isinstance(max_tokens, bool) or int(max_tokens) < 1):
        raise InvalidInputError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    return (
        int(k),
        None if max_tokens is None else int(max_tokens),
        check_score(min_score, "min_score"),
    )


def check_score(value: Any, name: str, low: float = 0.0) -> float | None:
    """A score threshold: ``None`` or a number in ``[low, 1]`` (``Hit.score`` thresholds are in
    ``[0, 1]``; a LangGraph ``SearchItem.score``, a raw cosine, in ``[-1, 1]``).

    Returns:
        ``value`` as a ``float``, or ``None``.

    Raises:
        InvalidInputError: a bool, a non-number, NaN or a number outside ``[low, 1]``, naming ``name``
            and the value.
    """
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not low <= float(value) <= 1.0
    ):
        raise InvalidInputError(f"{name} must be a number in [{low:g}, 1], got {value!r}.")
    return None if value is None else float(value)


def best_first(ids: np.ndarray, scores: np.ndarray, pos: np.ndarray | None = None) -> Iterator[int]:
    """Positions in best-first order — score descending, ties by node id ascending — produced lazily.

    Equal to ``pos[np.lexsort((ids[pos], -scores[pos]))]`` walked from the front, but a walk that stops
    after a few candidates sorts only a prefix: the best ``m`` (every position scoring at least the
    ``m``-th best score, so ties are whole) are selected with ``argpartition`` and sorted, and ``m`` grows
    eightfold only when the walk goes on past them. A top-k walk over ``n`` nodes costs O(n), not
    O(n log n).

    Args:
        ids: node ids ``int64 (n,)``. scores: ``float (n,)``.
        pos: positions to walk (default all), e.g. the admissible ones.

    Yields:
        Positions into ``ids`` / ``scores``.
    """
    pos = np.arange(len(ids)) if pos is None else np.asarray(pos, dtype=np.int64)
    m = 64
    while len(pos):
        if len(pos) <= m:
            yield from pos[np.lexsort((ids[pos], -scores[pos]))].tolist()
            return
        neg = -scores[pos]
        cut = np.partition(neg, m - 1)[m - 1]
        head = neg <= cut
        part = pos[head]
        yield from part[np.lexsort((ids[part], -scores[part]))].tolist()
        pos = pos[~head]
        m *= 8


class TokenBudget:
    """A greedy budget of returned text: a text is taken when it fits in what is left.

    The rule of ``retrieve(max_tokens=...)``: candidates are walked best first and one that would exceed
    the budget is skipped (the walk goes on, a shorter one may still fit). Policies that pick their own
    candidates walk with the same rule, so a budget never leaves a retrieval short of candidates.

    Args:
        max_tokens: the budget in tokens (:func:`count_tokens`), or ``None`` for no budget.
    """

    def __init__(self, max_tokens: int | None) -> None:
        self.max_tokens = max_tokens
        self.used = 0

    def take(self, text: str) -> bool:
        """Whether ``text`` fits in what is left; when it does, it is counted as used."""
        if self.max_tokens is None:
            return True
        t = count_tokens(text)
        if self.used + t > self.max_tokens:
            return False
        self.used += t
        return True

    @property
    def spent(self) -> bool:
        """Whether nothing more can fit (only under a budget)."""
        return self.max_tokens is not None and self.used >= self.max_tokens
