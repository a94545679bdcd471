"""Filters on the messages a retrieval may return: a time range and a metadata condition.

``retrieve(query, time_range=(start, end), where={...})`` on every memory builds a :class:`MessageFilter`
with :func:`message_filter`. A leaf passes when its message matches; a summary or any other internal node
passes only when every message its text draws on matches (the leaves under it, and for xMemory the
messages a fact was distilled from), so a filtered-out message's text never comes back, not even inside
a summary. The memories apply it before top-k; propagation still runs over the whole tree.

``where`` grammar (the operators of LangGraph's store filter and of MongoDB-style metadata filters):

* ``{"field": value}``: equality (``Message.metadata["field"] == value``);
* ``{"field": {"$eq": v, "$ne": v, "$in": [...], "$nin": [...], "$gt": v, "$gte": v, "$lt": v,
  "$lte": v}}``: every operator given must hold;
* ``{"$and": [cond, ...]}``, ``{"$or": [cond, ...]}``; several keys in one dict must all hold; at most
  :data:`MAX_FILTER_DEPTH` (32) conditions inside one another, the outer dict included.

A message without the field fails every operator but ``$ne`` and ``$nin``. Order comparisons hold only
between numbers or between strings (anything else fails, it is not an error).

Lists (:func:`in_values`): ``$in`` / ``$nin`` take a list of scalars (str, int, float, bool; not
``None``). A scalar field matches ``$in`` when it equals one of them; a list-valued field (a list or
tuple, e.g. ``"tags": ["finance", "q3"]``) when any of its elements does; ``$nin`` is the negation, and a
field that is absent or ``None`` is in no list (``$in`` fails, ``$nin`` holds, as LlamaIndex's
``MetadataFilter`` ``in`` / ``nin`` treat a missing value). Equality (``{"field": value}``, ``$eq``,
``$ne``) compares the whole value, as LangGraph's ``InMemoryStore`` does: ``{"tags": "finance"}`` does
not match ``["finance", "q3"]`` (use ``$in``), ``{"tags": ["finance", "q3"]}`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from ..types import InvalidInputError, Message, parse_timestamp

__all__ = [
    "MAX_FILTER_DEPTH",
    "MessageFilter",
    "TimeRange",
    "check_in_values",
    "in_values",
    "message_filter",
    "parse_as_of",
    "parse_time_range",
    "where_matcher",
]

#: deepest nesting of a filter: a ``where`` condition (the outer dict is level 1, each condition of an
#: ``$and`` / ``$or`` one level below its own), and a LangGraph store ``filter`` (each dict or list
#: inside it one more level)
MAX_FILTER_DEPTH = 32

#: ``(start, end)``: each a ``datetime``, a ``date``, an ISO-8601 string or ``None`` (open end)
TimeRange = tuple[Any, Any]

_COMPARE = ("$gt", "$gte", "$lt", "$lte")
_OPERATORS = ("$eq", "$ne", "$in", "$nin", *_COMPARE)
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _bound(value: Any, name: str, end: bool, label: str = "time_range ") -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, date):
        return datetime.combine(value, time.max if end else time.min)
    if isinstance(value, str):
        s = value.strip()
        try:
            dt = datetime.fromisoformat(s).replace(tzinfo=None)
        except ValueError:
            raise InvalidInputError(
                f"{label}{name} must be an ISO-8601 date or date-time (e.g. '2024-05-01' or "
                f"'2024-05-01T13:00:00'), a datetime or None; got {value!r}."
            ) from None
        if end and _DATE_ONLY.match(s):  # a date as the end includes that whole day
            dt = datetime.combine(dt.date(), time.max)
        return dt
    raise InvalidInputError(
        f"{label}{name} must be a datetime, a date, an ISO-8601 string or None; "
        f"got {type(value).__name__} {value!r}."
    )


def parse_time_range(time_range: Any) -> tuple[datetime | None, datetime | None]:
    """Validate a ``(start, end)`` time range into naive datetimes (``None`` = open end).

    Time zones are dropped (message timestamps are compared as wall-clock times, as
    :func:`~shared_core.viz.parse_timestamp` reads them). A date-only end (``"2024-05-09"`` or a
    ``date``) includes that whole day.

    Args:
        time_range: a pair ``(start, end)`` (tuple or list), each a ``datetime``, ``date``, ISO-8601
            string or ``None``.

    Returns:
        ``(start, end)`` as naive datetimes or ``None``.

    Raises:
        InvalidInputError: not a pair, an unreadable bound, or ``start > end``.
    """
    if isinstance(time_range, (str, bytes)) or not isinstance(time_range, Sequence) or len(time_range) != 2:
        raise InvalidInputError(
            f"time_range must be a pair (start, end), either end None; got {time_range!r}."
        )
    start = _bound(time_range[0], "start", end=False)
    end = _bound(time_range[1], "end", end=True)
    if start is not None and end is not None and start > end:
        raise InvalidInputError(f"time_range start {time_range[0]!r} is after its end {time_range[1]!r}.")
    return start, end


def parse_as_of(value: Any) -> datetime | None:
    """Validate ``retrieve(as_of=...)``, the time a question is asked at, into a naive datetime.

    A date-only value (``"2024-05-09"`` or a ``date``) means the end of that day; time zones are dropped
    as in :func:`parse_time_range`.

    Args:
        value: ``None``, a ``datetime``, a ``date`` or an ISO-8601 string.

    Returns:
        The naive datetime, or ``None``.

    Raises:
        InvalidInputError: any other type or an unreadable string, naming the value.
    """
    return _bound(value, "as_of", end=True, label="")


def _ordered(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` may be order-compared: both numbers (not bools) or both strings."""
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        return True
    return isinstance(a, str) and isinstance(b, str)


def _apply(op: str, present: bool, value: Any, arg: Any) -> bool:
    if op == "$eq":
        return present and value == arg
    if op == "$ne":
        return not present or value != arg
    if op == "$in":
        return present and in_values(value, arg)
    if op == "$nin":
        return not (present and in_values(value, arg))
    if not present or not _ordered(value, arg):
        return False
    if op == "$gt":
        return value > arg
    if op == "$gte":
        return value >= arg
    if op == "$lt":
        return value < arg
    return value <= arg


def _scalar(x: Any) -> bool:
    return isinstance(x, (str, int, float)) and not (isinstance(x, float) and x != x)


def check_in_values(values: Any, where: str) -> list[Any]:
    """Validate the list of an ``$in`` / ``$nin`` condition (module docstring, "Lists").

    Args:
        values: the condition's argument.
        where: where it stands, for the message (e.g. ``"where.tags.$in"``).

    Returns:
        ``values`` as a list.

    Raises:
        InvalidInputError: not a list or tuple, or an element that is not a str, int, float or bool
            (``None``, NaN, a list, a dict), naming it.
    """
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise InvalidInputError(f"{where} takes a list of values, e.g. ['a', 'b']; got {values!r}.")
    for v in values:
        if not _scalar(v):
            raise InvalidInputError(
                f"{where} lists strings, numbers or booleans; got {v!r} (an absent or None field is in no "
                "list: it fails $in and passes $nin)."
            )
    return list(values)


def in_values(value: Any, values: Sequence[Any]) -> bool:
    """Whether a field's value is in an ``$in`` list: a list or tuple value when any element is (``==``),
    another value when it is itself; ``None`` (an absent field) never is.

    Args:
        value: the field's value (``None`` when absent).
        values: the condition's list (see :func:`check_in_values`).

    Returns:
        The verdict of ``$in``; ``$nin`` is its negation.
    """
    if value is None:
        return False
    if isinstance(value, (list, tuple)):
        return any(v is not None and v in values for v in value)
    return bool(value in values)


def _compile(where: Any, path: str, depth: int = 1) -> Callable[[Mapping[str, Any]], bool]:
    if depth > MAX_FILTER_DEPTH:
        raise InvalidInputError(
            f"where: conditions are nested more than {MAX_FILTER_DEPTH} deep (MAX_FILTER_DEPTH); "
            "flatten the $and / $or."
        )
    if not isinstance(where, Mapping) or not where:
        raise InvalidInputError(f"{path} must be a non-empty dict of conditions; got {where!r}.")
    parts: list[Callable[[Mapping[str, Any]], bool]] = []
    for key, cond in where.items():
        if not isinstance(key, str) or not key:
            raise InvalidInputError(f"{path}: field names must be non-empty strings; got {key!r}.")
        if key in ("$and", "$or"):
            if isinstance(cond, (str, bytes, Mapping)) or not isinstance(cond, Sequence) or not cond:
                raise InvalidInputError(f"{path}.{key} must be a non-empty list of conditions; got {cond!r}.")
            subs = [_compile(c, f"{path}.{key}[{i}]", depth + 1) for i, c in enumerate(cond)]
            if key == "$and":
                parts.append(lambda md, subs=subs: all(s(md) for s in subs))
            else:
                parts.append(lambda md, subs=subs: any(s(md) for s in subs))
            continue
        if key.startswith("$"):
            raise InvalidInputError(
                f"{path}: unknown operator {key!r} at the top of a condition; use $and, $or or a field name."
            )
        if isinstance(cond, Mapping) and any(isinstance(k, str) and k.startswith("$") for k in cond):
            ops: list[tuple[str, Any]] = []
            for op, arg in cond.items():
                if op not in _OPERATORS:
                    raise InvalidInputError(
                        f"{path}.{key}: unknown operator {op!r}; choose one of {', '.join(_OPERATORS)}."
                    )
                if op in ("$in", "$nin"):
                    arg = check_in_values(arg, f"{path}.{key}.{op}")
                elif op in _COMPARE and not _ordered(arg, arg):
                    raise InvalidInputError(f"{path}.{key}.{op} takes a number or a string; got {arg!r}.")
                ops.append((op, arg))
            parts.append(
                lambda md, key=key, ops=ops: all(_apply(op, key in md, md.get(key), arg) for op, arg in ops)
            )
        else:
            parts.append(lambda md, key=key, cond=cond: key in md and md[key] == cond)
    return lambda md: all(p(md) for p in parts)


def where_matcher(where: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
    """Compile a ``where`` condition (module docstring) into a predicate on a metadata dict.

    Raises:
        InvalidInputError: not a dict, an unknown operator, ``$in`` / ``$nin`` without a list, an order
            comparison with a value that is neither a number nor a string, an empty ``$and`` / ``$or``,
            conditions nested deeper than :data:`MAX_FILTER_DEPTH`.
    """
    return _compile(where, "where")


@dataclass(frozen=True)
class MessageFilter:
    """Which messages a retrieval may draw on.

    Attributes:
        start, end: the time range (naive datetimes, ``None`` = open); a message whose timestamp cannot
            be read (:func:`~shared_core.viz.parse_timestamp`) fails a time range.
        where: the compiled metadata condition, or ``None``.
        predicate: an extra test of the whole :class:`~shared_core.types.Message` (the adapters pass their
            framework's filters this way), or ``None``.
        as_of: the time the question is asked at (naive datetime, ``None`` = no bound): a message whose
            timestamp is after it fails; unlike a time range, a message without a readable timestamp
            passes (nothing says it was said later).
    """

    start: datetime | None = None
    end: datetime | None = None
    where: Callable[[Mapping[str, Any]], bool] | None = None
    predicate: Callable[[Message], bool] | None = None
    as_of: datetime | None = None

    def matches(self, message: Message | None) -> bool:
        """Whether ``message`` passes (``None``, a node without a message, never does)."""
        if message is None:
            return False
        if self.as_of is not None:
            t = parse_timestamp(message.timestamp)
            if t is not None and t > self.as_of:
                return False
        if self.start is not None or self.end is not None:
            t = parse_timestamp(message.timestamp)
            if t is None:
                return False
            if (self.start is not None and t < self.start) or (self.end is not None and t > self.end):
                return False
        if self.where is not None and not self.where(message.metadata or {}):
            return False
        return self.predicate is None or bool(self.predicate(message))


def message_filter(time_range: Any = None, where: Any = None, as_of: Any = None) -> MessageFilter | None:
    """The filter of ``retrieve(time_range=..., where=..., as_of=...)``, or ``None`` when nothing is filtered.

    Args:
        time_range: ``None`` or ``(start, end)`` (see :func:`parse_time_range`); ``(None, None)`` filters
            nothing.
        where: ``None``, a condition dict (module docstring), or a callable ``Message -> bool``.
        as_of: ``None`` or the time the question is asked at (see :func:`parse_as_of`).

    Raises:
        InvalidInputError: an invalid time range or condition.
    """
    start = end = None
    if time_range is not None:
        start, end = parse_time_range(time_range)
    matcher = predicate = None
    if callable(where) and not isinstance(where, Mapping):
        predicate = where
    elif where is not None:
        matcher = where_matcher(where)
    cutoff = parse_as_of(as_of)
    if start is None and end is None and matcher is None and predicate is None and cutoff is None:
        return None
    return MessageFilter(start, end, matcher, predicate, cutoff)
