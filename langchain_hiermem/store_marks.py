"""Supersession marks on the items a query search of :class:`~langchain_hiermem.store.HierMemStore` returns.

LangGraph's ``SearchItem`` has no metadata field, so a query search returns :class:`MarkedSearchItem`, a
``SearchItem`` (equal to, and serialised as, the plain one plus three fields) that also says whether a
newer item replaced the item's text: the core's :class:`~shared_core.types.Hit` marks, with source ids read
as item keys of the same namespace (see "Knowledge that changes" in docs/evaluation.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from langgraph.store.base import Item, SearchItem

from shared_core.types import Hit

__all__ = ["MarkedSearchItem", "search_item"]


class MarkedSearchItem(SearchItem):
    """A ``SearchItem`` of a query search, with the supersession marks of the memory's hit for it.

    Attributes:
        superseded_by: keys (same namespace) of the newer items whose text replaced this item's, oldest
            first; ``()`` while current (and for an item whose text the memory did not mark).
        valid_from: the time its text was put (ISO 8601, UTC), ``None`` when unknown.
        valid_to: the time the earliest replacing text was put (ISO 8601); ``None`` while current.
            Read as of the search's ``as_of`` when one is given.
    """

    __slots__ = ("superseded_by", "valid_from", "valid_to")

    def __init__(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        created_at: datetime,
        updated_at: datetime,
        score: float | None = None,
        *,
        superseded_by: tuple[str, ...] = (),
        valid_from: str | None = None,
        valid_to: str | None = None,
    ) -> None:
        super().__init__(namespace, key, value, created_at, updated_at, score)
        self.superseded_by = tuple(superseded_by)
        self.valid_from = valid_from
        self.valid_to = valid_to

    def dict(self) -> dict[str, Any]:
        """``SearchItem.dict()`` plus ``superseded_by`` (a list), ``valid_from`` and ``valid_to``."""
        out = super().dict()
        out.update(superseded_by=list(self.superseded_by), valid_from=self.valid_from, valid_to=self.valid_to)
        return out


def search_item(item: Item, score: float | None = None, hit: Hit | None = None) -> SearchItem:
    """The search result for ``item``: a plain ``SearchItem`` without a hit (a search without a query, an
    item that is not indexed), else a :class:`MarkedSearchItem` carrying ``hit``'s marks."""
    args = (item.namespace, item.key, item.value, item.created_at, item.updated_at)
    value = float(score) if score is not None else None
    if hit is None:
        return SearchItem(*args, score=value)
    return MarkedSearchItem(
        *args,
        score=value,
        superseded_by=tuple(dict.fromkeys(hit.superseded_by)),
        valid_from=hit.valid_from,
        valid_to=hit.valid_to,
    )
