"""Time in retrieval: ``as_of`` (nothing said after it), the query's time expressions resolved against it
(``search.temporal.time_cue``) and the soft time prior (``time_rerank``), worked by hand."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared_core import InvalidInputError, Message
from shared_core.search.temporal import TimeCue, time_cue, time_rerank
from tests.support.memory import KINDS, make_memory

NOW = datetime(2023, 4, 5, 19, 25)  # a Wednesday


def _day(y: int, m: int, d: int) -> tuple[datetime, datetime]:
    return datetime(y, m, d), datetime(y, m, d, 23, 59, 59, 999999)


@pytest.mark.parametrize(
    ("query", "window"),
    [
        ("What is the artist that I started to listen to last Friday?", _day(2023, 3, 31)),
        ("What did I cook yesterday?", _day(2023, 4, 4)),
        ("Where did I run two days ago?", _day(2023, 4, 3)),
        # a week's date, a week either side (until now)
        (
            "What milestone did I mention four weeks ago?",
            (datetime(2023, 3, 1), datetime(2023, 3, 15, 23, 59, 59, 999999)),
        ),
        # a month name in the past: the last such month; a month ahead of now is last year's
        (
            "Which museums did I visit in March?",
            (datetime(2023, 3, 1), datetime(2023, 3, 31, 23, 59, 59, 999999)),
        ),
        (
            "Which BBQ did I attend in June?",
            (datetime(2022, 6, 1), datetime(2022, 6, 30, 23, 59, 59, 999999)),
        ),
        # "the past N months": from then until now
        ("Which trips did I take in the past three months?", (datetime(2023, 1, 5), NOW)),
        ("How many films did I watch in the last 3 months?", (datetime(2023, 1, 5), NOW)),
        # "participated in a week ago": the "in" belongs to the verb, not to "in a week" (ahead)
        (
            "What life event did I participate in a week ago?",
            (datetime(2023, 3, 22), NOW),
        ),
        (
            "What charity event did I participate in a month ago?",
            (datetime(2023, 3, 1), datetime(2023, 3, 31, 23, 59, 59, 999999)),
        ),
    ],
)
def test_time_expressions_resolve_against_now(query, window):
    cue = time_cue(query, NOW)
    assert cue.windows == (window,), cue


@pytest.mark.parametrize(
    "query",
    [
        "Where did I redeem a $5 coupon on coffee creamer?",
        "How many days a week do I attend fitness classes?",
        "What was the increase in followers I experienced in two weeks?",
        "Can you suggest some activities for the evening?",
        "What is my dog's name?",
    ],
)
def test_no_window_without_a_time_anchor(query):
    assert time_cue(query, NOW).windows == ()


def test_order_words():
    assert time_cue("How many followers do I have on Instagram now?", NOW).order == "late"
    assert time_cue("Which streaming service did I start using most recently?", NOW).order == "late"
    assert time_cue("Which trip did I take first, Europe or the road trip?", NOW).order == "early"
    # "last" inside a time expression is not an order word
    assert time_cue("What did I buy last Friday?", NOW).order is None
    assert not time_cue("What is my dog's name?", NOW)


def test_rerank_by_hand():
    cands = [(1, 0.8, {}), (2, 0.6, {}), (3, 0.5, {})]
    times = {1: datetime(2023, 2, 1), 2: datetime(2023, 3, 31, 12), 3: None}
    cue = TimeCue(windows=(_day(2023, 3, 31),))
    # 0.8/0.8 = 1.0 against 0.6/0.8 + 0.3 = 1.05: the message inside the window moves up
    assert [c[0] for c in time_rerank(cands, times.get, cue, 0.3, 0.0)] == [2, 1, 3]
    # 0.6/0.8 + 0.2 = 0.95 < 1.0: not enough
    assert [c[0] for c in time_rerank(cands, times.get, cue, 0.2, 0.0)] == [1, 2, 3]
    # outside the window the bonus decays with the gap (59 days at a width of 1 day: ~0)
    late = TimeCue(order="late")
    assert [c[0] for c in time_rerank(cands, times.get, late, 0.0, 0.5)] == [2, 1, 3]
    early = TimeCue(order="early")
    assert [c[0] for c in time_rerank(cands, times.get, early, 0.0, 0.5)] == [1, 2, 3]


@given(
    scores=st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12),
    order=st.sampled_from([None, "late", "early"]),
)
def test_rerank_with_zero_weights_keeps_the_order(scores, order):
    cands = [(i, s, {}) for i, s in enumerate(scores)]
    cue = TimeCue(windows=(_day(2023, 3, 31),), order=order)
    got = time_rerank(cands, lambda i: datetime(2023, 3, 1 + i), cue, 0.0, 0.0)
    assert [c[0] for c in got] == [c[0] for c in cands]  # the policy's order, whatever its scores
    assert sorted(got) == sorted(cands)  # the same candidates, scores kept


@pytest.mark.parametrize("kind", KINDS)
def test_as_of_keeps_out_what_was_said_later(kind):
    mem = make_memory(kind)
    mem.add(
        [
            Message("I live in Lyon with my cat", timestamp="2023-01-10T09:00", id="old"),
            Message("I moved to Bordeaux with my cat", timestamp="2023-03-02T18:00", id="new"),
            Message("My cat sleeps all day", id="undated"),
        ]
    )
    ids = lambda hits: {s for h in hits for s in h.source_ids}  # noqa: E731
    assert ids(mem.retrieve("where do I live with my cat", as_of="2023-02-01")) == {"old", "undated"}
    # a date means the end of that day
    assert "new" in ids(mem.retrieve("where do I live with my cat", as_of="2023-03-02"))
    assert "new" not in ids(mem.retrieve("where do I live with my cat", as_of="2023-03-02T17:59"))
    assert ids(mem.retrieve("where do I live with my cat")) == {"old", "new", "undated"}


@pytest.mark.parametrize("bad", [12, "last tuesday-ish", b"2023-01-01", ["2023-01-01"]])
def test_unreadable_as_of_is_refused_naming_it(bad):
    mem = make_memory("segtree")
    mem.add(["one message"])
    with pytest.raises(InvalidInputError, match="as_of") as e:
        mem.retrieve("one", as_of=bad)
    assert repr(bad) in str(e.value)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.3"])
def test_time_weight_out_of_range_is_refused(bad):
    mem = make_memory("segtree")
    mem.add(["one message"])
    with pytest.raises(InvalidInputError, match="time_weight"):
        mem.retrieve("one", time_weight=bad)


@pytest.mark.parametrize("kind", KINDS)
def test_a_named_day_lifts_its_message(kind):
    """The message of the day the query names ranks first with the prior, second without it."""
    mem = make_memory(kind)
    mem.add(
        [
            Message("I serviced my mountain bike at the shop", timestamp="2023-02-01T08:00", id="feb"),
            Message("I fixed the road bike chain", timestamp="2023-03-31T07:08", id="friday"),
            *[
                Message(f"note {i} about cooking pasta", timestamp=f"2023-03-{10 + i}T12:00")
                for i in range(8)
            ],
        ]
    )
    q = "Which bike did I service at the shop last Friday?"
    blind = mem.retrieve(q, k=2, as_of="2023-04-05", time_weight=0.0)
    aware = mem.retrieve(q, k=2, as_of="2023-04-05", time_weight=1.0)
    assert blind[0].source_ids == ["feb"]
    assert aware[0].source_ids == ["friday"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_window_far_from_every_message_changes_nothing(kind):
    """No dated message within reach of the window (or none dated at all): every policy returns what it
    returns time-blind, the candidates not even fetched wider."""
    dated = make_memory(kind)
    dated.add([Message(f"I cooked pasta on day {i}", timestamp=f"2023-03-{10 + i}T12:00") for i in range(12)])
    undated = make_memory(kind)
    undated.add([f"I cooked pasta on day {i}" for i in range(12)])
    for mem in (dated, undated):
        for policy in mem.policies:
            if policy in mem.llm_policies:
                continue
            q = "what did I cook last Friday"
            aware = mem.retrieve(q, k=3, policy=policy, as_of="2026-11-27")
            blind = mem.retrieve(q, k=3, policy=policy, as_of="2026-11-27", time_weight=0.0)
            assert [(h.node_id, h.score) for h in aware] == [(h.node_id, h.score) for h in blind]
