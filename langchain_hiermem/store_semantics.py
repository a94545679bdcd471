"""LangGraph's item semantics for :class:`~langchain_hiermem.store.HierMemStore`: filters, scores, long texts.

- **Filters** (:func:`item_matches`) match as LangGraph's ``InMemoryStore`` does
  (``langgraph.store.memory._compare_values``): a dict without operators matches a dict value key by key
  (recursively, extra keys allowed); a list or tuple matches a list or tuple of the same length element
  by element (so ``("x", "y")`` matches ``["x", "y"]``); a dict of operators applies each of ``$eq $ne
  $gt $gte $lt $lte`` (``$eq`` / ``$ne`` with Python's ``==``, the others on ``float()`` of both sides);
  anything else is ``==``. ``$in`` / ``$nin`` (beyond LangGraph's operators: the core's ``where``, see
  ``shared_core.search.filters``) take a list of scalars; a list-valued field matches ``$in`` when any
  element is in the list, ``$nin`` when none is; an absent or ``None`` field fails ``$in`` and passes
  ``$nin``; ``{"$and": [filter, ...]}`` / ``{"$or": [...]}`` at the top combine filters as the core's
  ``where`` does (another top-level key starting with ``$`` is refused). A filter key names a top-level
  field; a key with dots (``"user.level"``) that is not itself a field names a nested field, as in
  LangGraph's ``SqliteStore`` (``json_extract``).
  Departures: an operator whose operands are not numbers (a missing field, a non-numeric string) does
  not match, where ``InMemoryStore`` raises ``TypeError`` / ``ValueError`` from the whole search; an
  unknown operator is refused before the search, whether or not an item reaches it.
- **Scores** (:func:`similarity_scores`): the cosine similarity of the query and an item's embedded texts,
  its best text counting (LangGraph's max pooling), from the vectors the memory already holds.
- **Long texts** (:func:`split_text`): a text over the memory's per-message limit is indexed in parts.

References:
    LangGraph ``langgraph.store.memory.InMemoryStore`` (``_compare_values``, ``_apply_operator``,
    ``_cosine_similarity``); ``langgraph.store.sqlite.SqliteStore`` (dotted filter keys).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np

from shared_core.search.filters import MAX_FILTER_DEPTH, check_in_values, in_values, parse_as_of
from shared_core.search.walk import check_score
from shared_core.types import InvalidInputError

__all__ = [
    "SEARCH_OPTIONS",
    "SearchOptions",
    "OPERATORS",
    "embedder_and_fields",
    "check_filter",
    "compare_values",
    "cosine_scores",
    "field_value",
    "item_matches",
    "json_form",
    "similarity_scores",
    "split_text",
]

#: The filter operators: LangGraph's stores' six, and the core's ``$in`` / ``$nin``.
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin")
#: The core's combinations of filters, at the top of a filter (LangGraph's stores have neither).
_LOGICAL = ("$and", "$or")
_MISSING = object()


def check_filter(flt: Any) -> None:
    """Check a search filter before it is used.

    Args:
        flt: ``None`` or a mapping of field name (or dotted path) to a condition.

    Raises:
        InvalidInputError: not a mapping, a field name that is not a string, an operator dict (one
            with a key starting with ``$``) holding a key that is not one of :data:`OPERATORS`, or an
            ``$in`` / ``$nin`` without a list of scalars, an ``$and`` / ``$or`` without a non-empty list of
            non-empty dicts, another top-level key starting with ``$``, or dicts and lists nested deeper
            than ``MAX_FILTER_DEPTH`` (32, the filter itself level 1).
    """
    if flt is None:
        return
    if not isinstance(flt, Mapping):
        raise InvalidInputError(
            f"filter must be a dict such as {{'kind': 'note'}}, got {type(flt).__name__}."
        )
    _check_filter(flt, 1)


def _too_deep(depth: int) -> None:
    if depth > MAX_FILTER_DEPTH:
        raise InvalidInputError(
            f"filter: dicts and lists are nested more than {MAX_FILTER_DEPTH} deep (MAX_FILTER_DEPTH); "
            "flatten the filter."
        )


def _check_filter(flt: Mapping[str, Any], depth: int) -> None:
    """:func:`check_filter` of a filter dict at nesting ``depth`` (the outer filter is 1)."""
    for key, cond in flt.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"A filter key is a field name (string), got {key!r}.")
        if key in _LOGICAL:
            if isinstance(cond, (str, bytes, Mapping)) or not isinstance(cond, Sequence) or not cond:
                raise InvalidInputError(f"filter {key} takes a non-empty list of filters, got {cond!r}.")
            _too_deep(depth + 2)
            for sub in cond:
                if not isinstance(sub, Mapping) or not sub:
                    raise InvalidInputError(f"filter {key} takes a list of non-empty dicts, got {sub!r}.")
                _check_filter(sub, depth + 2)
        elif key.startswith("$"):
            raise InvalidInputError(
                f"Unknown filter operator {key!r} at the top of a filter; use $and, $or or a field name."
            )
        else:
            _check_condition(cond, depth + 1)


def _check_condition(cond: Any, depth: int) -> None:
    if isinstance(cond, (Mapping, list, tuple)):
        _too_deep(depth)
    if isinstance(cond, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in cond):
            bad = [k for k in cond if k not in OPERATORS]
            if bad:
                raise InvalidInputError(
                    f"Unsupported filter operator(s) {', '.join(map(repr, bad))}; use {' '.join(OPERATORS)}."
                )
            for op in ("$in", "$nin"):
                if op in cond:
                    check_in_values(cond[op], f"filter {op}")
            return
        for v in cond.values():
            _check_condition(v, depth + 1)
    elif isinstance(cond, (list, tuple)):
        for v in cond:
            _check_condition(v, depth + 1)


def compare_values(value: Any, cond: Any) -> bool:
    """Whether a field's value matches a filter condition (``InMemoryStore``'s ``_compare_values``).

    Args:
        value: the item's field value (``None`` when absent).
        cond: the condition: an operator dict, a dict, a list / tuple, or a plain value.

    Returns:
        The verdict; an operator that cannot compare its operands gives ``False``.

    Raises:
        InvalidInputError: an unsupported operator.
    """
    if isinstance(cond, dict):
        if any(k.startswith("$") for k in cond if isinstance(k, str)):
            return all(_operator(value, op, arg) for op, arg in cond.items())
        if not isinstance(value, dict):
            return False
        return all(compare_values(value.get(k), v) for k, v in cond.items())
    if isinstance(cond, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(cond)
            and all(compare_values(v, c) for v, c in zip(value, cond))
        )
    return bool(value == cond)


def _operator(value: Any, op: Any, arg: Any) -> bool:
    if op == "$eq":
        return bool(value == arg)
    if op == "$ne":
        return bool(value != arg)
    if op in ("$in", "$nin"):
        found = in_values(value, check_in_values(arg, f"filter {op}"))
        return found if op == "$in" else not found
    if op in ("$gt", "$gte", "$lt", "$lte"):
        try:
            a, b = float(value), float(arg)
        except (TypeError, ValueError, OverflowError):
            return False
        if op == "$gt":
            return a > b
        if op == "$gte":
            return a >= b
        return a < b if op == "$lt" else a <= b
    raise InvalidInputError(f"Unsupported filter operator {op!r}; use one of {' '.join(OPERATORS)}.")


def field_value(value: Mapping[str, Any], key: str) -> Any:
    """The value a filter key names: the field ``key``, else (a key with dots that is not a field) the
    nested field it spells (``"user.level"`` -> ``value["user"]["level"]``); ``None`` when absent."""
    got = value.get(key, _MISSING)
    if got is not _MISSING:
        return got
    if "." not in key:
        return None
    cur: Any = value
    for part in key.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part, _MISSING)
        if cur is _MISSING:
            return None
    return cur


def item_matches(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Whether an item's value passes a search filter (every key's condition holds; ``$and`` / ``$or``
    over a list of filters; see the module)."""
    if not flt:
        return True
    for key, cond in flt.items():
        if key == "$and":
            ok = all(item_matches(value, sub) for sub in cond)
        elif key == "$or":
            ok = any(item_matches(value, sub) for sub in cond)
        else:
            ok = compare_values(field_value(value, key), cond)
        if not ok:
            return False
    return True


def json_form(x: Any) -> Any:
    """``x`` as a JSON round trip gives it back for comparison: tuples as lists, recursively (a durable
    store keeps values as JSON, so a filter is compared in the same form)."""
    if isinstance(x, (list, tuple)):
        return [json_form(v) for v in x]
    if isinstance(x, dict):
        return {k: json_form(v) for k, v in x.items()}
    return x


def cosine_scores(query_vec: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Cosine similarity of a query vector and each row, clipped to ``[-1, 1]`` (a zero row gives 0)."""
    q = np.asarray(query_vec, dtype=np.float64).reshape(-1)
    m = np.asarray(vectors, dtype=np.float64).reshape(len(vectors), -1)
    qn = float(np.linalg.norm(q))
    norms = np.linalg.norm(m, axis=1)
    out = np.zeros(len(m))
    ok = norms > 0
    if qn > 0 and ok.any():
        out[ok] = (m[ok] @ q) / (norms[ok] * qn)
    return np.clip(out, -1.0, 1.0)


def split_text(text: str, limit: int) -> list[str]:
    """Split a text into consecutive parts of at most ``limit`` characters that join back to it.

    A part ends after the last whitespace of its window when that lies in the window's second half
    (so words are not cut), else exactly at ``limit`` characters.

    Args:
        text: the text.
        limit: the longest part, in characters (at least 1).

    Returns:
        ``[text]`` when it fits, else the parts in order (``"".join(parts) == text``).

    Raises:
        InvalidInputError: ``limit`` below 1.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"limit must be a positive integer, got {limit!r}.")
    parts: list[str] = []
    start = 0
    while len(text) - start > limit:
        window = text[start : start + limit]
        cut = max(window.rfind(" "), window.rfind("\n"), window.rfind("\t")) + 1
        if cut <= limit // 2:
            cut = limit
        parts.append(text[start : start + cut])
        start += cut
    parts.append(text[start:])
    return parts


def similarity_scores(mem: Any, query: str, leaves: Mapping[str, Sequence[int]]) -> dict[str, float]:
    """Per key, the cosine similarity of the query and the key's embedded texts, the best one counting
    (LangGraph's max pooling over an item's fields).

    Args:
        mem: the namespace's memory (:meth:`~shared_core.search.vectors.NodeVectors.similarities` reads
            its node vectors; the query's embedding is the one its retrieval just made).
        query: the query.
        leaves: the memory leaves of each key to score.

    Returns:
        ``{key: score}`` with scores in ``[-1, 1]``, for keys that have at least one leaf in the memory.
    """
    sims = mem.similarities(query, [lid for lids in leaves.values() for lid in lids])
    out: dict[str, float] = {}
    for key, lids in leaves.items():
        got = [sims[lid] for lid in lids if lid in sims]
        if got:
            out[key] = max(got)
    return out


def embedder_and_fields(index: Mapping[str, Any]) -> tuple[Any, list[str] | None]:
    """The store's embedder and text fields from a LangGraph ``IndexConfig``.

    Args:
        index: ``{"dims": int, "embed": ..., "fields": [...]}`` (every key optional). ``embed`` is a
            LangChain ``Embeddings``, a function of a list of texts (sync or async), a
            ``"provider:model"`` string (``langchain.embeddings.init_embeddings``, needs the ``langchain``
            package and the provider's) or a hiermem embedder; ``dims`` is checked against the vectors.
            ``fields`` default ``None``: the store's default text (``"text"``, ``"content"``, the value).

    Returns:
        ``(embedder, fields)``: a core embedder (``None`` without ``embed``) and the field paths.

    Raises:
        InvalidInputError: not a mapping, an unknown key, ``dims`` not a positive integer, ``fields`` not a
            list of strings, or an ``embed`` that cannot be turned into embeddings.
    """
    from langchain_core.embeddings import Embeddings

    from .models import LangChainEmbedder, as_core_embedder

    if not isinstance(index, Mapping):
        raise InvalidInputError(
            f"index must be a LangGraph IndexConfig dict such as {{'dims': 384, 'embed': embeddings}}, got "
            f"{type(index).__name__}."
        )
    unknown = sorted(set(index) - {"dims", "embed", "fields"})
    if unknown:
        raise InvalidInputError(f"Unknown index keys {unknown}; an IndexConfig has dims, embed and fields.")
    dims = index.get("dims")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise InvalidInputError(f"index['dims'] must be a positive integer, got {dims!r}.")
    fields = index.get("fields")
    if fields is not None and (isinstance(fields, str) or not all(isinstance(f, str) for f in fields)):
        raise InvalidInputError("index['fields'] must be a list of field paths (strings), e.g. ['text'].")
    embed = index.get("embed")
    if embed is None:
        return None, list(fields) if fields is not None else None
    if not isinstance(embed, (Embeddings, str)) and hasattr(embed, "embed") and hasattr(embed, "dim"):
        embedder = embed  # already a hiermem embedder
    else:
        if not isinstance(embed, Embeddings):
            if not isinstance(embed, str) and not callable(embed):
                raise InvalidInputError(
                    "index['embed'] must be a LangChain Embeddings, a function of a list of texts, a "
                    f"'provider:model' string or a hiermem embedder, got {type(embed).__name__}."
                )
            from langgraph.store.base import ensure_embeddings

            try:
                embed = ensure_embeddings(embed)
            except (ImportError, ValueError) as e:
                raise InvalidInputError(f"Cannot use index['embed'] = {embed!r}: {e}") from None
        embedder = as_core_embedder(embed)
        if dims is not None and isinstance(embedder, LangChainEmbedder):
            embedder = LangChainEmbedder(embedder.embeddings, dim=dims)
    return embedder, list(fields) if fields is not None else None


def _threshold(min_score: Any) -> float | None:
    return check_score(min_score, "min_score", low=-1.0)


#: the retrieval arguments of the store search under way (``as_of``), set by :class:`SearchOptions` and
#: read by the store's query search; a context variable, so each thread and task sees its own
SEARCH_OPTIONS: ContextVar[dict[str, Any] | None] = ContextVar("hiermem_search_options", default=None)


class SearchOptions:
    """``search(..., min_score=..., as_of=...)`` on :class:`~langchain_hiermem.store.HierMemStore`.

    ``min_score``: of the items a query search returns (after ``offset`` and ``limit``), only those whose
    ``SearchItem.score`` is at least it (the cosine similarity of the query and the item's text, in
    ``[-1, 1]``, as in LangGraph's stores; with ``score="relevance"``, the memory's ranking figure).
    ``as_of``: the time the query is asked at (``datetime``, ``date`` or ISO-8601): no text put after
    it comes back and the query's time expressions resolve against it (the core's ``retrieve(as_of=)``).
    Both need a ``query``: items listed without one are neither scored nor ranked."""

    def search(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        min_score: float | None = None,
        as_of: Any = None,
        **kw: Any,
    ) -> Any:
        """LangGraph's ``BaseStore.search`` (``query``, ``filter``, ``limit``, ``offset``, ``refresh_ttl``),
        plus ``min_score`` and ``as_of`` (see the class).

        Raises:
            InvalidInputError: ``min_score`` not a number in ``[-1, 1]``, an unreadable ``as_of``, or
                either given without ``query``.
        """
        threshold, options = self._options(min_score, as_of, kw)
        token = SEARCH_OPTIONS.set(options)
        try:
            items = super().search(namespace_prefix, **kw)  # type: ignore[misc]
        finally:
            SEARCH_OPTIONS.reset(token)
        return items if threshold is None else [it for it in items if (it.score or 0.0) >= threshold]

    async def asearch(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        min_score: float | None = None,
        as_of: Any = None,
        **kw: Any,
    ) -> Any:
        """Async :meth:`search`."""
        threshold, options = self._options(min_score, as_of, kw)
        token = SEARCH_OPTIONS.set(options)
        try:
            items = await super().asearch(namespace_prefix, **kw)  # type: ignore[misc]
        finally:
            SEARCH_OPTIONS.reset(token)
        return items if threshold is None else [it for it in items if (it.score or 0.0) >= threshold]

    @staticmethod
    def _options(min_score: Any, as_of: Any, kw: Mapping[str, Any]) -> tuple[float | None, dict[str, Any]]:
        threshold = _threshold(min_score)
        when = parse_as_of(as_of)
        for name, given in (("min_score", threshold), ("as_of", when)):
            if given is not None and not kw.get("query"):
                raise InvalidInputError(f"{name} needs a query: items listed without one are not ranked.")
        return threshold, ({} if when is None else {"as_of": when})
