"""Shaping a ranking before its top ``k`` are taken: a cap per group, and neighbours after each item.

Two LLM-free selection rules shared by the memories (:meth:`~shared_core.search.ranking.Ranking._shaped`,
groups and neighbours from the tree) and the flat baselines of ``hiermem eval`` (groups and neighbours
from the conversation's sessions and turn order), so that what the tree adds over them is measured with
the same rule on both sides:

* :func:`capped` (segment-diverse top-k): walk the ranking and keep at most ``cap`` items of any one
  group; the items over the cap follow, in rank order, and are taken only when the diverse ones ran
  out (a query whose evidence sits in several segments or sessions gets one hit from each before a
  second from any);
* :func:`with_neighbours` (neighbourhood expansion): each item followed by up to ``n`` of its
  neighbours (e.g. a hit's nearest siblings in its segment, or the adjacent turns of its session), so
  the context around a hit comes with it; an item already listed is not repeated.

Both are pure reorderings (no item is dropped, none added beyond the neighbours), deterministic
(ties keep the given order), and cost O(len(items) * (1 + n)) calls of ``group`` / ``neighbours``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from ..types import InvalidInputError

__all__ = ["capped", "check_cap", "with_neighbours"]

T = TypeVar("T")


def check_cap(value: object, name: str, *, minimum: int = 1, optional: bool = True) -> int | None:
    """``value`` as an int at least ``minimum`` (``None`` allowed when ``optional``).

    Raises:
        InvalidInputError: a bool, a non-integer, a value below ``minimum``, or ``None`` when not optional.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < minimum:  # type: ignore[call-overload]
        raise InvalidInputError(
            f"{name} must be an integer >= {minimum}{' or None' if optional else ''}, got {value!r}."
        )
    return int(value)  # type: ignore[call-overload]


def capped(items: Sequence[T], group: Callable[[T], Hashable | None], cap: int | None) -> list[T]:
    """The items with at most ``cap`` per group first (rank order), then the rest (rank order).

    Args:
        items: the ranking, best first.
        group: an item's group (e.g. its top-level segment or session); ``None`` is a group of its own
            for every item (never capped).
        cap: at most this many items of one group before the rest; ``None`` returns ``items`` as given.

    Returns:
        A new list holding every item once.

    Raises:
        InvalidInputError: ``cap`` below 1.

    Examples:
        >>> capped(["a1", "a2", "a3", "b1", "a4", "c1"], lambda s: s[0], 2)
        ['a1', 'a2', 'b1', 'c1', 'a3', 'a4']
    """
    cap = check_cap(cap, "cap")
    if cap is None:
        return list(items)
    first: list[T] = []
    rest: list[T] = []
    count: dict[Hashable, int] = {}
    for it in items:
        g = group(it)
        if g is None:
            first.append(it)
            continue
        c = count.get(g, 0)
        (first if c < cap else rest).append(it)
        count[g] = c + 1
    return first + rest


def with_neighbours(
    items: Sequence[T],
    neighbours: Callable[[T], Iterable[T]],
    n: int,
    key: Callable[[T], Hashable] = lambda x: x,  # type: ignore[assignment,return-value]
) -> list[T]:
    """Each item followed by up to ``n`` of its neighbours that are not listed yet.

    Args:
        items: the ranking, best first.
        neighbours: an item's neighbours, nearest first (e.g. the sibling leaves of a hit by distance in
            turn order, or the adjacent turns of its session).
        n: neighbours per item, ``0`` returns ``items`` as given.
        key: identity of an item (what "listed already" compares), default the item itself.

    Returns:
        A new list, every item and neighbour once (an item listed as an earlier item's neighbour keeps
        that earlier place).

    Raises:
        InvalidInputError: ``n`` below 0.

    Examples:
        >>> with_neighbours([5, 9, 6], lambda i: [i + 1, i - 1], 1)
        [5, 6, 9, 10]
    """
    n = check_cap(n, "n", minimum=0, optional=False)
    assert n is not None
    if n == 0:
        return list(items)
    out: list[T] = []
    seen: set[Hashable] = set()
    for it in items:
        kk = key(it)
        if kk in seen:
            continue
        seen.add(kk)
        out.append(it)
        added = 0
        for nb in neighbours(it):
            if added >= n:
                break
            kn = key(nb)
            if kn in seen:
                continue
            seen.add(kn)
            out.append(nb)
            added += 1
    return out
