"""``retrieve(time_range=..., where=...)``: the grammar, worked cases, and every memory and policy.

The property that matters: a filtered-out message's text never comes back, not in a leaf and not inside
a summary, and the filter applies before top-k (``k`` hits come back whenever ``k`` messages pass).
"""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core.search.filters import message_filter, parse_time_range, where_matcher
from shared_core.types import InvalidInputError, Message
from tests.support.memory import KINDS, HashEmbedder, make_memory

# ----------------------------------------------------------------------------------- the grammar


@pytest.mark.parametrize(
    ("where", "md", "expected"),
    [
        ({"user": "ann"}, {"user": "ann"}, True),
        ({"user": "ann"}, {"user": "bob"}, False),
        ({"user": "ann"}, {}, False),
        ({"user": {"$eq": "ann"}}, {"user": "ann"}, True),
        ({"user": {"$ne": "ann"}}, {"user": "bob"}, True),
        ({"user": {"$ne": "ann"}}, {}, True),  # missing: $ne holds
        ({"user": {"$in": ["ann", "cy"]}}, {"user": "cy"}, True),
        ({"user": {"$in": ["ann", "cy"]}}, {}, False),
        ({"user": {"$nin": ["ann", "cy"]}}, {"user": "bob"}, True),
        ({"user": {"$nin": ["ann", "cy"]}}, {}, True),
        ({"n": {"$gt": 2}}, {"n": 3}, True),
        ({"n": {"$gt": 2}}, {"n": 2}, False),
        ({"n": {"$gte": 2, "$lt": 5}}, {"n": 2}, True),
        ({"n": {"$gte": 2, "$lt": 5}}, {"n": 5}, False),
        ({"n": {"$lte": 2.5}}, {"n": 2}, True),
        ({"n": {"$gt": 2}}, {"n": "3"}, False),  # a string is not order-compared with a number
        ({"n": {"$gt": 2}}, {"n": True}, False),  # nor is a bool
        ({"s": {"$lt": "m"}}, {"s": "alpha"}, True),
        ({"$or": [{"user": "ann"}, {"n": {"$gt": 9}}]}, {"user": "bob", "n": 10}, True),
        ({"$or": [{"user": "ann"}, {"n": {"$gt": 9}}]}, {"user": "bob", "n": 1}, False),
        ({"$and": [{"user": "ann"}, {"n": 1}]}, {"user": "ann", "n": 1}, True),
        ({"$and": [{"user": "ann"}, {"n": 1}]}, {"user": "ann", "n": 2}, False),
        ({"user": "ann", "n": 1}, {"user": "ann", "n": 2}, False),  # several keys: all hold
        ({"tags": ["a", "b"]}, {"tags": ["a", "b"]}, True),
        ({"tags": ["a", "b"]}, {"tags": ["b", "a"]}, False),
    ],
)
def test_where_worked_cases(where, md, expected):
    assert where_matcher(where)(md) is expected


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("user=ann", "dict"),
        ({}, "non-empty"),
        ({"user": {"$like": "a%"}}, "unknown operator '\\$like'"),
        ({"$not": {"user": "ann"}}, "unknown operator '\\$not'"),
        ({"user": {"$in": "ann"}}, "list of values"),
        ({"n": {"$gt": [1]}}, "number or a string"),
        ({"$or": []}, "non-empty list"),
        ({"$and": {"user": "ann"}}, "non-empty list"),
        ({"$or": ["x"]}, "dict"),
    ],
)
def test_where_errors_name_the_problem(where, match):
    with pytest.raises(InvalidInputError, match=match):
        where_matcher(where)


def test_time_range_bounds():
    assert parse_time_range((None, None)) == (None, None)
    s, e = parse_time_range(("2024-05-01", "2024-05-09"))
    assert s == datetime(2024, 5, 1) and e == datetime(2024, 5, 9, 23, 59, 59, 999999)  # whole end day
    s, e = parse_time_range([date(2024, 5, 1), "2024-05-09T10:30:00"])
    assert s == datetime(2024, 5, 1) and e == datetime(2024, 5, 9, 10, 30)
    s, _ = parse_time_range((datetime(2024, 5, 1, 8, tzinfo=timezone.utc), None))
    assert s == datetime(2024, 5, 1, 8)  # wall-clock: the zone is dropped
    with pytest.raises(InvalidInputError, match="after its end"):
        parse_time_range(("2024-05-09", "2024-05-01"))
    with pytest.raises(InvalidInputError, match="ISO-8601"):
        parse_time_range(("last tuesday", None))
    with pytest.raises(InvalidInputError, match="pair"):
        parse_time_range("2024-05-01")
    with pytest.raises(InvalidInputError, match="pair"):
        parse_time_range(("2024-05-01",))
    with pytest.raises(InvalidInputError, match="datetime"):
        parse_time_range((20240501, None))


def test_message_filter_on_messages():
    assert message_filter() is None and message_filter((None, None)) is None
    f = message_filter(("2023-05-08", "2023-05-08"), {"lang": "en"})
    assert f is not None
    assert f.matches(Message("a", timestamp="1:56 pm on 8 May, 2023", metadata={"lang": "en"}))
    assert not f.matches(Message("a", timestamp="1:56 pm on 9 May, 2023", metadata={"lang": "en"}))
    assert not f.matches(Message("a", timestamp="8 May 2023", metadata={"lang": "de"}))
    assert not f.matches(Message("a", timestamp="someday", metadata={"lang": "en"}))  # unreadable
    assert not f.matches(Message("a", metadata={"lang": "en"}))  # no timestamp
    assert not f.matches(None)
    g = message_filter(where=lambda m: m.speaker == "Ann")
    assert g is not None and g.matches(Message("a", speaker="Ann")) and not g.matches(Message("a"))


# ----------------------------------------------------------------------------------- the memories

# every LLM-free policy of each memory
POLICIES = {
    "segtree": ["top_down", "collapsed", "bottom_up"],
    "memtree": ["top_down", "collapsed", "traversal"],
    "hat": ["top_down", "collapsed", "greedy"],
    "xmemory": ["top_down", "collapsed", "adaptive", "representative"],
}
RANKING = {"top_down", "collapsed", "bottom_up"}  # apply the filter before top-k


def _stream(n: int = 48) -> list[Message]:
    """Alternating users; bob's messages carry a secret word and are the ones closest to the query."""
    topics = ["garden", "travel", "cooking"]
    out = []
    for i in range(n):
        user = "bob" if i % 2 else "ann"
        t = topics[(i // 4) % 3]
        text = (
            f"garden garden secret{i} about {t} from bob, garden tools."
            if user == "bob"
            else f"ann note {i} on {t} and the garden."
        )
        out.append(
            Message(
                text,
                speaker=user,
                id=f"m{i}",
                timestamp=f"2024-05-{1 + i // 4:02d}T10:00:00",
                metadata={"user": user, "n": i},
            )
        )
    return out


def _drawn_texts(mem, hit) -> list[str]:
    st = mem._store
    leaves = list(st.leaves_under(hit.node_id)) + list(mem._drawn_leaves(hit.node_id))
    return [st.nodes[lid].message.text for lid in leaves]


@pytest.fixture(scope="module", params=KINDS)
def memory(request):
    mem = make_memory(request.param, HashEmbedder(), admissible="all") if request.param != "xmemory" else None
    if mem is None:
        mem = make_memory("xmemory", HashEmbedder())
    mem.add(_stream())
    return request.param, mem


@pytest.mark.parametrize("k", [5, 12])
def test_filtered_text_never_comes_back(memory, k):
    kind, mem = memory
    for policy in POLICIES[kind]:
        for params in ({}, {"admissible": "all"}) if policy in RANKING else ({},):
            try:
                hits = mem.retrieve("garden secret", k=k, policy=policy, where={"user": "ann"}, **params)
            except InvalidInputError:
                continue  # a policy without the admissible parameter
            assert hits, (kind, policy)
            for h in hits:
                assert "secret" not in h.text, (kind, policy, h)
                assert all("secret" not in t for t in _drawn_texts(mem, h)), (kind, policy, h)
            if policy in RANKING:  # before top-k: k of the 24 messages of ann come back
                assert len(hits) == k, (kind, policy, len(hits))


def test_time_range_before_top_k(memory):
    kind, mem = memory
    hits = mem.retrieve("garden", k=6, time_range=("2024-05-03", "2024-05-04"), admissible="leaves")
    assert len(hits) == 6  # days 3-4 hold 8 messages
    for h in hits:
        (lid,) = mem._store.leaves_under(h.node_id)
        assert mem._store.nodes[lid].message.timestamp[:10] in ("2024-05-03", "2024-05-04")
    assert mem.retrieve("garden", k=6, time_range=("2030-01-01", None)) == []


def test_filter_errors_through_retrieve(memory):
    _, mem = memory
    with pytest.raises(InvalidInputError, match="after its end"):
        mem.retrieve("garden", time_range=("2024-05-09", "2024-05-01"))
    with pytest.raises(InvalidInputError, match="unknown operator"):
        mem.retrieve("garden", where={"user": {"$regex": "a"}})


@settings(max_examples=25, deadline=None)
@given(
    users=st.sets(st.sampled_from(["ann", "bob"]), min_size=1),
    lo=st.integers(0, 47),
    span=st.integers(0, 47),
    k=st.integers(1, 30),
)
def test_collapsed_leaves_filter_equals_filtering_the_full_ranking(users, lo, span, k):
    # differential: the pre-filtered top-k is the top-k of the unfiltered full ranking, filtered
    mem = _hypo_memory()
    where = {"user": {"$in": sorted(users)}, "n": {"$gte": lo, "$lte": lo + span}}
    ok = where_matcher(where)
    full = mem.retrieve("garden tools", k=1000, policy="collapsed", admissible="leaves")
    expect = [h.node_id for h in full if ok(mem._store.nodes[h.node_id].message.metadata)][:k]
    got = mem.retrieve("garden tools", k=k, policy="collapsed", admissible="leaves", where=where)
    assert [h.node_id for h in got] == expect


_HYPO: list = []


def _hypo_memory():
    if not _HYPO:
        mem = make_memory("segtree", HashEmbedder())
        mem.add(_stream())
        _HYPO.append(mem)
    return _HYPO[0]


def test_a_filter_every_message_passes_changes_nothing(memory):
    kind, mem = memory
    for policy in POLICIES[kind]:
        plain = mem.retrieve("garden secret", k=12, policy=policy)
        passing = mem.retrieve("garden secret", k=12, policy=policy, where={"n": {"$gte": 0}})
        assert [(h.node_id, h.score) for h in passing] == [(h.node_id, h.score) for h in plain], policy
        if kind in ("segtree", "hat") and policy == "collapsed":
            assert any(not h.is_leaf for h in plain)  # summaries pass when every message under them does


def test_langchain_retriever_filter_and_time_range():
    pytest.importorskip("langchain_core")
    from langchain_hiermem import HierMemRetriever

    mem = _hypo_memory()
    r = HierMemRetriever(memory=mem, k=5, search_kwargs={"filter": {"user": "ann"}})
    docs = r.invoke("garden secret")
    assert len(docs) == 5 and all("secret" not in d.page_content for d in docs)
    docs = r.invoke("garden secret", filter={"user": "bob"}, time_range=("2024-05-02", "2024-05-02"))
    assert len(docs) == 2 and all("secret" in d.page_content for d in docs)  # day 2: m5, m7 of bob
    with pytest.raises(InvalidInputError, match="not both"):
        r.invoke("garden", where={"user": "ann"})
    with pytest.raises(InvalidInputError, match="unknown operator"):
        r.invoke("garden", filter={"user": {"$regex": "a"}})
