"""LangGraph's semantics where users notice them, in the in-process ``HierMemStore`` and the durable store
(``HierMemStore.from_conn_string`` on SQLite): filters (differentially against LangGraph's own
``InMemoryStore``, with tuples, lists, nested dicts, operators and dotted paths), ``index_config``,
``SearchItem.score`` as the cosine of the query and the item's text, and puts over the memory's
per-message limit."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.memory import InMemoryStore

from langchain_hiermem import HierMemStore
from shared_core.types import InvalidInputError
from tests.support.langgraph_store import DIM, EMBEDDINGS, FACTS, MEMORY_KWARGS, index

_MISSING = object()
_COUNTER = itertools.count()

# ---------------------------------------------------------------------------------------------- strategies
FIELDS = ["a", "b", "tags", "a.b"]
FILTER_KEYS = ["a", "b", "tags", "a.b", "a.c", "b.a", "x.y.z"]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 2.0, -1.5]),
    st.sampled_from(["x", "y", "3", "2.5", "", "abc"]),
)


def values_of(children: Any) -> Any:
    return st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["a", "b", "c", "x"]), children, max_size=3),
    )


values = st.recursive(scalars, values_of, max_leaves=6)
item_values = st.dictionaries(st.sampled_from(FIELDS), values, max_size=4)
operators = st.dictionaries(
    st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]), values, min_size=1, max_size=2
)


def conditions_of(children: Any) -> Any:
    return st.one_of(
        st.lists(children, max_size=2),
        st.lists(children, max_size=2).map(tuple),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), children, min_size=1, max_size=2),
    )


conditions = st.one_of(operators, st.recursive(st.one_of(scalars, operators), conditions_of, max_leaves=4))
random_filters = st.dictionaries(st.sampled_from(FILTER_KEYS), conditions, min_size=1, max_size=2)


def swap(x: Any) -> Any:
    """Lists as tuples and tuples as lists, recursively."""
    if isinstance(x, list):
        return tuple(swap(v) for v in x)
    if isinstance(x, tuple):
        return [swap(v) for v in x]
    if isinstance(x, dict):
        return {k: swap(v) for k, v in x.items()}
    return x


def paths(value: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every field of a value as ``(path, value)``, nested dicts' fields by dotted path."""
    out = []
    for k, v in value.items():
        out.append((prefix + k, v))
        if isinstance(v, dict) and "." not in k:
            out.extend(paths(v, prefix + k + "."))
    return out


def variants(v: Any) -> Any:
    """Conditions made from a stored value, so that filters often match."""
    options = [v, swap(v), {"$eq": v}, {"$ne": v}, {"$eq": swap(v)}]
    if isinstance(v, dict) and v:
        options.append(dict(list(v.items())[:1]))  # a sub-dict matches
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], dict):
        options.append(type(v)([dict(list(v[0].items())[:1]), *v[1:]]))
    if isinstance(v, (int, float, str)):
        options.extend({op: v} for op in ("$gt", "$gte", "$lt", "$lte"))
    return st.sampled_from(options)


def filters_for(vals: list[dict[str, Any]]) -> Any:
    """Filters of one or two conditions, each random or made from a field of a stored value."""
    fields = [pv for v in vals for pv in paths(v)]
    derived = (
        st.sampled_from(fields).flatmap(lambda pv: variants(pv[1]).map(lambda c: (pv[0], c)))
        if fields
        else st.nothing()
    )
    entry = st.one_of(derived, st.tuples(st.sampled_from(FILTER_KEYS), conditions))
    return st.lists(entry, min_size=1, max_size=2).map(dict)


# ---------------------------------------------------------------------------------------------- reference
def json_form(x: Any) -> Any:
    """What a JSON round trip gives back (tuples as lists)."""
    if isinstance(x, (list, tuple)):
        return [json_form(v) for v in x]
    if isinstance(x, dict):
        return {k: json_form(v) for k, v in x.items()}
    return x


def nested(value: dict[str, Any], path: str) -> Any:
    cur: Any = value
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def reference_keys(items: list[tuple[str, dict[str, Any]]], flt: dict[str, Any]) -> list[str]:
    """The keys InMemoryStore's filter keeps, item by item. A dotted filter key that is not a field reads
    the nested field it spells (given to InMemoryStore as that top-level field); an item on which
    InMemoryStore raises (an operator on non-numbers) does not match."""
    out = []
    for key, value in items:
        seen = dict(value)
        for fk in flt:
            if fk not in value and "." in fk and (got := nested(value, fk)) is not _MISSING:
                seen[fk] = got
        ref = InMemoryStore()
        ref.put(("n",), key, seen)
        try:
            hit = bool(ref.search(("n",), filter=flt))
        except (TypeError, ValueError):
            hit = False
        if hit:
            out.append(key)
    return out


@pytest.fixture(scope="module")
def durable() -> Iterator[Any]:
    with (
        tempfile.TemporaryDirectory() as d,
        HierMemStore.from_conn_string(
            Path(d) / "s.sqlite", index=index(), memory_kwargs=MEMORY_KWARGS
        ) as store,
    ):
        yield store


def _keys(store: Any, ns: tuple[str, ...], flt: dict[str, Any]) -> list[str]:
    return [it.key for it in store.search(ns, filter=flt, limit=100)]


FILTER_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# ---------------------------------------------------------------------------------------------- filters
@FILTER_SETTINGS
@given(st.lists(item_values, min_size=1, max_size=5), st.data())
def test_filters_match_in_memory_store_in_process(vals: list[dict[str, Any]], data: Any) -> None:
    flt = data.draw(filters_for(vals), label="filter")
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    items = [(f"k{i}", v) for i, v in enumerate(vals)]
    for key, v in items:
        store.put(("n",), key, v, index=False)
    assert _keys(store, ("n",), flt) == reference_keys(items, flt)


@FILTER_SETTINGS
@given(st.lists(item_values, min_size=1, max_size=5), st.data())
def test_filters_match_in_memory_store_durable(durable: Any, vals: list[dict[str, Any]], data: Any) -> None:
    """The durable store keeps values as JSON: its filters match as InMemoryStore's over the values it
    returns, with the filter in the same JSON form (a tuple compares as a list)."""
    flt = data.draw(filters_for(vals), label="filter")
    ns = ("f", str(next(_COUNTER)))
    items = [(f"k{i}", v) for i, v in enumerate(vals)]
    for key, v in items:
        durable.put(ns, key, v, index=False)
    want = reference_keys([(k, json_form(v)) for k, v in items], json_form(flt))
    assert _keys(durable, ns, flt) == want


def test_tuple_filter_matches_stored_lists_in_both_stores(durable: Any) -> None:
    value = {"tags": ("x", "y"), "user": {"access-level": "nested", "n": 3}}
    ref = InMemoryStore()
    ref.put(("t",), "k", value)
    mem = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    mem.put(("t",), "k", value, index=False)
    durable.put(("t",), "k", value, index=False)
    for flt in ({"tags": ("x", "y")}, {"tags": ["x", "y"]}, {"user": {"n": 3}}):
        assert [i.key for i in ref.search(("t",), filter=flt)] == ["k"]
        assert _keys(mem, ("t",), flt) == ["k"]
        assert _keys(durable, ("t",), flt) == ["k"]
    for flt in ({"user.access-level": "nested"}, {"user.n": {"$gte": 3}}):  # dotted paths (SqliteStore)
        assert _keys(mem, ("t",), flt) == ["k"]
        assert _keys(durable, ("t",), flt) == ["k"]
    assert _keys(durable, ("t",), {"user.access-level": "other"}) == []


def test_filtered_query_search_uses_the_same_semantics(durable: Any) -> None:
    for store in (HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS), durable):
        ns = ("q", str(next(_COUNTER)))
        for i, fact in enumerate(FACTS):
            store.put(
                ns, f"k{i}", {"text": fact, "tags": ("even",) if i % 2 == 0 else ["odd"], "m": {"i": i}}
            )
        got = store.search(ns, query="dog hospital", filter={"tags": ("even",), "m.i": {"$lt": 4}}, limit=10)
        assert sorted(it.key for it in got) == ["k0", "k2"]


def test_an_unknown_operator_is_refused_even_without_items() -> None:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    with pytest.raises(InvalidInputError, match=r"\$regex"):
        store.search(("none",), filter={"a": {"$regex": "x"}})
    store.put(("n",), "k", {"a": 1}, index=False)
    with pytest.raises(InvalidInputError, match=r"\$regex"):
        store.search(("n",), filter={"a": {"$eq": 2, "$regex": "x"}})


# ---------------------------------------------------------------------------------------------- index_config
def test_index_config_is_the_index_given_or_none(durable: Any) -> None:
    assert HierMemStore().index_config is None
    assert InMemoryStore().index_config is None
    cfg = index(fields=["text"])
    store = HierMemStore(index=cfg)
    assert store.index_config == cfg and store.index_config is not cfg
    assert durable.index_config == index()


# ---------------------------------------------------------------------------------------------- scores
def test_score_is_the_cosine_of_query_and_item_text(durable: Any) -> None:
    ref = InMemoryStore(index={"dims": DIM, "embed": EMBEDDINGS, "fields": ["text"]})
    mem = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    ns = ("s", str(next(_COUNTER)))
    for store in (ref, mem, durable):
        for i, fact in enumerate(FACTS):
            store.put(ns, f"k{i}", {"text": fact})
    query = FACTS[1]
    want = {it.key: it.score for it in ref.search(ns, query=query, limit=10)}
    for store in (mem, durable):
        got = store.search(ns, query=query, limit=10)
        assert got[0].key == "k1" and got[0].score == pytest.approx(1.0, abs=1e-5)
        assert {it.key for it in got} == set(want)
        for it in got:
            assert -1.0 <= it.score <= 1.0
            assert it.score == pytest.approx(want[it.key], abs=1e-5)


def test_score_relevance_option_keeps_the_memorys_score() -> None:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS, score="relevance")
    for i, fact in enumerate(FACTS):
        store.put(("r",), f"k{i}", {"text": fact})
    mem = store.get_memory(("r",))
    hits = mem.retrieve(FACTS[1], k=1)
    got = store.search(("r",), query=FACTS[1], limit=1)
    assert got[0].score == pytest.approx(hits[0].components["rank"])
    with pytest.raises(InvalidInputError, match="score"):
        HierMemStore(score="cosine")


# ---------------------------------------------------------------------------------------------- long texts
@pytest.mark.parametrize("kind", ["memory", "durable"])
def test_a_put_over_the_message_limit_is_stored_found_once_and_deleted(kind: str, durable: Any) -> None:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS) if kind == "memory" else durable
    ns = ("long", str(next(_COUNTER)))
    text = ("the quick brown fox jumps over a lazy dog near the river bank " * 5000)[:250_000]
    store.put(ns, "big", {"text": text})
    store.put(ns, "small", {"text": FACTS[0]})
    assert store.get(ns, "big").value == {"text": text}
    mem = store.get_memory(ns)
    parts = [h for h in mem.to_dict()["tree"]["nodes"] if h["is_leaf"] and h["message"]["id"] == "big"]
    assert len(parts) == 3
    assert all(len(p["text"]) <= mem.max_message_chars for p in parts)
    assert "".join(p["text"] for p in sorted(parts, key=lambda p: p["message"]["metadata"]["part"])) == text
    found = store.search(ns, query="quick brown fox river", limit=10)
    assert [it.key for it in found].count("big") == 1
    assert found[0].key == "big" and found[0].value == {"text": text}
    store.delete(ns, "big")
    assert store.get(ns, "big") is None
    assert len(mem) == 1
    assert [it.key for it in store.search(ns, query="quick brown fox", limit=10)] == ["small"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab \n", max_size=60), st.integers(1, 12))
def test_split_text_parts_fit_the_limit_and_join_back(text: str, limit: int) -> None:
    from langchain_hiermem.store_semantics import split_text

    parts = split_text(text, limit)
    assert "".join(parts) == text
    assert all(len(p) <= limit for p in parts)
    assert all(parts) or parts == [text]
    with pytest.raises(InvalidInputError):
        split_text(text, 0)


def test_score_is_the_cosine_when_the_retrieval_embeds_no_query() -> None:
    """With BM25 relevance the memory never embeds the query: the store embeds it once for the score."""
    store = HierMemStore(index=index(), memory_kwargs={"relevance": "bm25"})
    for i, fact in enumerate(FACTS):
        store.put(("b",), f"k{i}", {"text": fact})
    got = {it.key: it.score for it in store.search(("b",), query=FACTS[2], limit=3)}
    assert got["k2"] == pytest.approx(1.0, abs=1e-5)
    assert all(-1.0 <= s <= 1.0 for s in got.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(item_values, min_size=1, max_size=5), st.data())
def test_filtered_query_searches_keep_the_items_in_memory_store_keeps(
    durable: Any, vals: list[dict[str, Any]], data: Any
) -> None:
    """A query search with a filter (applied inside the memory) returns exactly the indexed items the
    filter keeps, in both stores."""
    flt = data.draw(filters_for(vals), label="filter")
    items = [(f"k{i}", {**v, "text": FACTS[i]}) for i, v in enumerate(vals)]
    mem = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    ns = ("fq", str(next(_COUNTER)))
    for store in (mem, durable):
        for key, v in items:
            store.put(ns, key, v)
    want = sorted(reference_keys(items, flt))
    assert sorted(it.key for it in mem.search(ns, query="dog nurse", filter=flt, limit=10)) == want
    want = sorted(reference_keys([(k, json_form(v)) for k, v in items], json_form(flt)))
    assert sorted(it.key for it in durable.search(ns, query="dog nurse", filter=flt, limit=10)) == want


def test_a_long_item_survives_a_reopen_and_is_deleted_completely(tmp_path: Path) -> None:
    text = ("a long letter about the garden and the bees " * 6000)[:250_000]
    path = tmp_path / "long.sqlite"
    with HierMemStore.from_conn_string(path, index=index(), memory_kwargs=MEMORY_KWARGS) as store:
        store.put(("l",), "big", {"text": text})
        store.put(("l",), "small", {"text": FACTS[3]})
    with HierMemStore.from_conn_string(path, index=index(), memory_kwargs=MEMORY_KWARGS) as store:
        assert store.get(("l",), "big").value == {"text": text}
        found = store.search(("l",), query="garden bees", limit=5)
        assert [it.key for it in found] == ["big", "small"]
        assert len(store.get_memory(("l",))) == 4
        store.delete(("l",), "big")
    with HierMemStore.from_conn_string(path, index=index(), memory_kwargs=MEMORY_KWARGS) as store:
        assert store.get(("l",), "big") is None
        assert len(store.get_memory(("l",))) == 1


@pytest.mark.parametrize("threshold", [-1.0, 0.0, 0.2, 0.5, 0.9, 1.0])
def test_search_min_score_keeps_the_items_scoring_at_least_it(threshold: float) -> None:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    for i, fact in enumerate(FACTS):
        store.put(("t",), f"k{i}", {"text": fact})
    every = store.search(("t",), query=FACTS[2], limit=10)
    kept = store.search(("t",), query=FACTS[2], limit=10, min_score=threshold)
    assert [it.key for it in kept] == [it.key for it in every if it.score >= threshold]
    assert threshold > 0.99 or kept  # the item itself scores about 1


@pytest.mark.parametrize("bad", [1.5, -1.01, "0.3", True])
def test_search_min_score_out_of_range_or_without_query_is_refused(bad: Any) -> None:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    store.put(("t",), "k", {"text": FACTS[0]})
    with pytest.raises(InvalidInputError, match="min_score"):
        store.search(("t",), query="x", min_score=bad)
    with pytest.raises(InvalidInputError, match="min_score needs a query"):
        store.search(("t",), min_score=0.2)


async def test_asearch_min_score() -> None:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    for i, fact in enumerate(FACTS):
        await store.aput(("t",), f"k{i}", {"text": fact})
    kept = await store.asearch(("t",), query=FACTS[1], min_score=0.99)
    assert [it.key for it in kept] == ["k1"]


def test_search_items_carry_the_supersession_marks_and_read_them_as_of_a_time() -> None:
    """A newer put that restates a count replaces the older item's text: the newer item ranks first, the
    older one says which key replaced it and when; as of a time before the update it is current."""
    from datetime import datetime, timezone

    from langgraph.store.base import SearchItem

    from langchain_hiermem.store_marks import MarkedSearchItem

    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    clock = iter([datetime(2024, 1, d, 12, tzinfo=timezone.utc) for d in range(1, 20)])
    store._clock = lambda: next(clock)
    store.put(("a",), "old", {"text": "I walk my dog Luna twice a day around the park"})
    store.put(("a",), "other", {"text": "My sister lives in Lisbon"})
    store.put(("a",), "new", {"text": "I now walk my dog Luna 3 times a day around the park"})
    got = store.search(("a",), query="how often do I walk my dog Luna", limit=3)
    assert all(isinstance(it, MarkedSearchItem) for it in got)
    by_key = {it.key: it for it in got}
    assert [it.key for it in got].index("new") < [it.key for it in got].index("old")
    old, new = by_key["old"], by_key["new"]
    assert old.superseded_by == ("new",) and old.valid_to == new.valid_from is not None
    assert new.superseded_by == () and new.valid_to is None and old.valid_from < new.valid_from
    assert by_key["other"].superseded_by == ()
    row = old.dict()
    assert row["superseded_by"] == ["new"] and row["valid_to"] == new.valid_from and row["score"] == old.score
    plain = SearchItem(old.namespace, old.key, old.value, old.created_at, old.updated_at, old.score)
    assert old == plain  # equal to the plain item: LangGraph code comparing items is unaffected
    before = store.search(("a",), query="how often do I walk my dog Luna", limit=3, as_of=old.valid_from)
    assert [(it.key, it.superseded_by, it.valid_to) for it in before] == [("old", (), None)]
    store.delete(("a",), "new")  # deleting the newer item makes the older current again
    again = {it.key: it for it in store.search(("a",), query="how often do I walk my dog Luna", limit=3)}
    assert again["old"].superseded_by == () and again["old"].valid_to is None
    assert all(type(it) is SearchItem for it in store.search(("a",), limit=3))  # no query: no marks


def test_search_as_of_keeps_out_what_was_put_later() -> None:
    """Each put is stamped with the store's clock (UTC); a search as of a time sees only what was put by
    then, and its time expressions resolve against it."""
    from datetime import datetime, timezone

    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    clock = iter([datetime(2024, 1, d, 12, tzinfo=timezone.utc) for d in range(1, 20)])
    store._clock = lambda: next(clock)  # the store's replaceable clock (see store_ttl)
    store.put(("a",), "lyon", {"text": "I live in Lyon with my cat"})  # day 1 (a put reads it once)
    store.put(("a",), "bordeaux", {"text": "I moved to Bordeaux with my cat"})
    now = {it.key for it in store.search(("a",), query="where do I live with my cat", limit=10)}
    assert now == {"lyon", "bordeaux"}
    stamps = {
        n.source_id: n.message.timestamp
        for n in store.get_memory(("a",)).tree_view().nodes.values()
        if n.is_leaf
    }
    assert stamps["lyon"] < stamps["bordeaux"]  # ISO-8601 UTC, in put order
    early = store.search(("a",), query="where do I live with my cat", limit=10, as_of=stamps["lyon"])
    assert [it.key for it in early] == ["lyon"]
    with pytest.raises(InvalidInputError, match="as_of"):
        store.search(("a",), query="x", as_of="next tuesday-ish")
    with pytest.raises(InvalidInputError, match="as_of needs a query"):
        store.search(("a",), as_of="2024-01-01")
