"""Time in a query: its time expressions resolved against the moment it is asked, and a soft time prior.

"What did I do last Friday?", "four weeks ago", "in June", "in the past three months": :func:`time_cue`
finds such expressions with ``dateparser`` (its ``search_dates``, English, relative to ``now``, past
dates preferred) and turns each into a window of wall-clock time from the granularity ``dateparser``
reports for it (a day, a week either side of a week's date, a calendar month or year; "the last/past N
<units>" is the range from then to ``now``); words of order ("most recently", "latest", "now",
"first", "earliest") give a preference for the newer or the older end of the candidates.

:func:`time_rerank` applies the cue to ranked candidates: each candidate's ranking figure divided by the
best one, plus ``weight`` times how close its message's timestamp is to a window (1 inside, decaying as
``exp(-gap / width)`` outside) plus ``order_weight`` times its place in time among the candidates; ties
keep the policy's order. A soft prior, never a filter: a message outside every window can still rank
first on relevance, because the time a message was said is not always the time it speaks of ("the BBQ
in June", told in July).

References:
    LongMemEval (Wu et al., ICLR 2025), Sec. 5.4: time-aware query expansion for temporal reasoning.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

__all__ = ["TimeCue", "time_cue", "time_rerank"]

#: a found expression counts only with one of these words in it or just before it (``dateparser`` also
#: reads "now", "a $5", "days a week" or "in two weeks" as dates)
_ANCHOR = re.compile(
    r"\b(ago|yesterday|today|tonight|last|past|previous|this|since|"
    r"jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(t(ember)?)?|oct(ober)?|"
    r"nov(ember)?|dec(ember)?|mon(day)?|tue(s(day)?)?|wed(nesday)?|thu(rs(day)?)?|fri(day)?|"
    r"sat(urday)?|sun(day)?|\d{4}|\d{1,2}/\d{1,2})\b",
    re.IGNORECASE,
)
#: "the last / past / previous N <units>": a range from then until now
_SPAN = re.compile(r"\b(last|past|previous)\s+(\w+\s+)?(days|weeks|months|years)\b", re.IGNORECASE)
_LATE = re.compile(
    r"\b(most recent(ly)?|latest|lately|recently|currently|nowadays|these days|now|at the moment)\b",
    re.IGNORECASE,
)
_EARLY = re.compile(r"\b(first|earliest|initially|originally|in the beginning)\b", re.IGNORECASE)
#: "(participated) in a week ago": ``search_dates`` reads "in a week" (a week ahead) into the expression
_IN_AGO = re.compile(r"^in\s+(?=.*\bago$)", re.IGNORECASE)
_DAY = timedelta(days=1)


@dataclass(frozen=True)
class TimeCue:
    """What a query says about time.

    Attributes:
        windows: ``(start, end)`` naive datetimes, each a period the query names.
        order: ``"late"`` (newer preferred), ``"early"`` (older preferred) or ``None``.
        expressions: the expressions read, as they appear in the query.
    """

    windows: tuple[tuple[datetime, datetime], ...] = ()
    order: str | None = None
    expressions: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.windows) or self.order is not None


def _parser(now: datetime) -> Any:
    """``dateparser``'s parser of one expression: English, relative to ``now``, past dates preferred."""
    from dateparser.date import DateDataParser

    return DateDataParser(
        languages=["en"],
        settings={"RELATIVE_BASE": now, "PREFER_DATES_FROM": "past", "RETURN_AS_TIMEZONE_AWARE": False},
    )


def _window(expr: str, context: str, when: datetime, now: datetime) -> tuple[datetime, datetime] | None:
    period = _parser(now).get_date_data(expr).period
    day = datetime.combine(when.date(), datetime.min.time())
    if _SPAN.search(context):
        start, end = day, now
    elif period == "year":
        start, end = datetime(when.year, 1, 1), datetime(when.year + 1, 1, 1) - timedelta(microseconds=1)
    elif period == "month":
        first = datetime(when.year, when.month, 1)
        nxt = datetime(when.year + (when.month == 12), when.month % 12 + 1, 1)
        start, end = first, nxt - timedelta(microseconds=1)
    elif period == "week":
        start, end = day - 7 * _DAY, day + 8 * _DAY - timedelta(microseconds=1)
    else:
        start, end = day, day + _DAY - timedelta(microseconds=1)
    end = min(end, now) if start <= now else end
    return (start, end) if start <= end else None


def time_cue(query: str, now: datetime) -> TimeCue:
    """The time expressions and order words of ``query``, resolved against ``now``.

    Args:
        query: the query text.
        now: the moment the query is asked at (naive datetime; ``retrieve``'s ``as_of``, else the
            current time).

    Returns:
        A :class:`TimeCue` (false when the query says nothing about time).
    """
    if not _ANCHOR.search(query):  # no expression could be kept: skip dateparser (most queries)
        order = "late" if _LATE.search(query) else "early" if _EARLY.search(query) else None
        return TimeCue((), order, ())
    from dateparser.search import search_dates

    found = search_dates(
        query,
        languages=["en"],
        settings={"RELATIVE_BASE": now, "PREFER_DATES_FROM": "past", "RETURN_AS_TIMEZONE_AWARE": False},
    )
    windows: list[tuple[datetime, datetime]] = []
    exprs: list[str] = []
    rest = query
    for expr, when in found or []:
        at = query.find(expr)
        if _IN_AGO.match(expr):  # "in a week ago" is "a week ago"
            at, expr = at + len(expr) - len(_IN_AGO.sub("", expr)), _IN_AGO.sub("", expr)
            when = _parser(now).get_date_data(expr).date_obj or when
        context = query[max(0, at - 12) : at + len(expr)] if at >= 0 else expr
        if not _ANCHOR.search(context):
            continue
        w = _window(expr, context, when.replace(tzinfo=None), now)
        if w is not None:
            windows.append(w)
            exprs.append(expr)
            rest = rest.replace(expr, " ")
    order = "late" if _LATE.search(rest) else "early" if _EARLY.search(rest) else None
    return TimeCue(tuple(windows), order, tuple(exprs))


def _closeness(t: datetime, windows: Sequence[tuple[datetime, datetime]]) -> float:
    best = 0.0
    for start, end in windows:
        if start <= t <= end:
            return 1.0
        gap = (start - t) if t < start else (t - end)
        width = max(end - start, _DAY)
        best = max(best, math.exp(-gap / width))
    return best


def time_rerank(
    cands: Sequence[tuple[int, float, dict[str, Any]]],
    when: Callable[[int], datetime | None],
    cue: TimeCue,
    weight: float,
    order_weight: float,
) -> list[tuple[int, float, dict[str, Any]]]:
    """Candidates reordered by their ranking figure and the query's time cue (see the module).

    Args:
        cands: ``(node_id, score, metadata)`` in the policy's order (scores non-negative).
        when: a node's message time (``None``: no timestamp, or not a message: no time bonus).
        cue: from :func:`time_cue`.
        weight: bonus for a message inside a window, ``>= 0``.
        order_weight: bonus for the newest (``"late"``) or oldest (``"early"``) candidate, ``>= 0``.

    Returns:
        The same candidates, best first by ``score / max(score) + bonuses``, where a candidate's
        ``score / max(score)`` is capped by those before it (so without a bonus the given order stays,
        whatever the policy's order); ties in the given order; each candidate's score is kept as it was.
    """
    if not cands or not cue:
        return list(cands)
    top = max((float(c[1]) for c in cands), default=0.0)
    times = [when(int(c[0])) for c in cands]
    order_at: dict[int, float] = {}
    if cue.order is not None and order_weight > 0:
        dated = sorted({t for t in times if t is not None})
        if len(dated) > 1:
            pos = {t: i / (len(dated) - 1) for i, t in enumerate(dated)}
            for j, t in enumerate(times):
                if t is not None:
                    order_at[j] = pos[t] if cue.order == "late" else 1.0 - pos[t]
    keyed = []
    base = math.inf
    for j, (c, t) in enumerate(zip(cands, times)):
        # the policy's order is kept where no bonus applies: a running minimum of score / top
        base = min(base, float(c[1]) / top if top > 0 else 0.0)
        value = base
        if t is not None and cue.windows and weight > 0:
            value += weight * _closeness(t, cue.windows)
        value += order_weight * order_at.get(j, 0.0)
        keyed.append((-value, j))
    keyed.sort()
    return [cands[j] for _, j in keyed]
