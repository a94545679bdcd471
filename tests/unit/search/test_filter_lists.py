"""``$in`` / ``$nin`` on scalar and list-valued fields: one rule for the core's ``where`` and the LangGraph
store's ``filter`` (differentially, with hypothesis, against each other and a model of the rule), the
refusals, whole-value equality; and the core's public reads of the vectors retrieval compares
(``embed_query``, ``node_vectors``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from langchain_hiermem.store_semantics import check_filter, item_matches
from shared_core import SegTreeMem
from shared_core.search.filters import where_matcher
from shared_core.types import InvalidInputError, Message, NodeNotFoundError
from tests.support.memory import HashEmbedder

_ABSENT = object()
scalars = st.one_of(
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.5, 1.0, -2.0]),
    st.sampled_from(["finance", "q3", "1", ""]),
)
field_values = st.one_of(
    st.just(_ABSENT),
    st.none(),
    scalars,
    st.lists(scalars, max_size=3),
    st.lists(scalars, max_size=3).map(tuple),
    st.lists(st.one_of(scalars, st.none()), max_size=3),
)


def _model(value: Any, values: list[Any]) -> bool:
    """The documented rule of ``$in``: an absent or ``None`` field is in no list; a list or tuple is in
    when any element equals a listed value; another value when it equals one."""
    if value is _ABSENT or value is None:
        return False
    elems = list(value) if isinstance(value, (list, tuple)) else [value]
    return any(e is not None and any(e == v for v in values) for e in elems)


@given(value=field_values, values=st.lists(scalars, max_size=4), op=st.sampled_from(["$in", "$nin"]))
def test_core_where_and_store_filter_agree_on_in_and_nin(value: Any, values: list[Any], op: str) -> None:
    md = {"n": 1} if value is _ABSENT else {"tags": value, "n": 1}
    cond = {"tags": {op: values}}
    want = _model(value, values) == (op == "$in")
    assert where_matcher(cond)(md) is want
    check_filter(cond)
    assert item_matches(md, cond) is want


leaf_conditions = st.builds(
    lambda field, op, values: {field: {op: values}},
    st.sampled_from(["tags", "n"]),
    st.sampled_from(["$in", "$nin"]),
    st.lists(scalars, max_size=3),
)
conditions = st.recursive(
    leaf_conditions,
    lambda inner: st.builds(
        lambda op, subs: {op: subs}, st.sampled_from(["$and", "$or"]), st.lists(inner, min_size=1, max_size=3)
    ),
    max_leaves=6,
)


@given(value=field_values, n=field_values, cond=conditions)
def test_core_where_and_store_filter_agree_on_and_or(value: Any, n: Any, cond: dict) -> None:
    md = {k: v for k, v in (("tags", value), ("n", n)) if v is not _ABSENT}
    check_filter(cond)
    assert item_matches(md, cond) is where_matcher(cond)(md)


@pytest.mark.parametrize(
    ("flt", "named"),
    [
        ({"$or": []}, "non-empty list"),
        ({"$and": {"a": 1}}, "non-empty list"),
        ({"$or": [{}]}, "non-empty dicts"),
        ({"$nor": [{"a": 1}]}, r"'\$nor'"),
        ({"$or": [{"a": {"$regex": "x"}}]}, r"\$regex"),
    ],
)
def test_store_and_or_refusals(flt: dict, named: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        check_filter(flt)


@pytest.mark.parametrize(
    ("cond", "md", "want"),
    [
        ({"tags": {"$in": ["finance"]}}, {"tags": ["finance", "q3"]}, True),
        ({"tags": {"$in": ["finance"]}}, {"tags": ("q3",)}, False),
        ({"tags": {"$in": ["finance"]}}, {"tags": []}, False),
        ({"tags": {"$nin": ["finance"]}}, {"tags": []}, True),
        ({"tags": {"$nin": ["finance"]}}, {"tags": ["q3", "finance"]}, False),
        ({"tags": {"$nin": ["finance"]}}, {}, True),
        ({"tags": {"$nin": ["finance"]}}, {"tags": None}, True),
        ({"tags": {"$in": ["finance"]}}, {"tags": None}, False),
        ({"tags": "finance"}, {"tags": ["finance"]}, False),  # equality compares the whole value
        ({"tags": ["finance", "q3"]}, {"tags": ["finance", "q3"]}, True),
        ({"tags": {"$eq": "finance"}}, {"tags": ["finance"]}, False),
    ],
)
def test_list_valued_fields(cond: dict, md: dict, want: bool) -> None:
    assert where_matcher(cond)(md) is want
    assert item_matches(md, cond) is want


@pytest.mark.parametrize(
    ("arg", "named"),
    [
        ([None], "got None"),
        ([["a"]], r"got \['a'\]"),
        ([{"a": 1}], "got {'a': 1}"),
        ([float("nan")], "got nan"),
    ],
)
@pytest.mark.parametrize("op", ["$in", "$nin"])
def test_in_lists_hold_scalars_only(arg: list, named: str, op: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        where_matcher({"tags": {op: arg}})
    with pytest.raises(InvalidInputError, match=named):
        check_filter({"tags": {op: arg}})
    with pytest.raises(InvalidInputError, match="list of values"):
        check_filter({"tags": {op: "finance"}})


# ---------------------------------------------------------------------------------------------- vectors
def test_node_vectors_and_embed_query_are_the_memory_own_vectors() -> None:
    emb = HashEmbedder()
    mem = SegTreeMem(embedder=emb)
    mem.add([Message(f"note {i} about {t}") for i, t in enumerate(["tea", "sea", "pea"] * 3)])
    hits = [h for h in mem.retrieve("tea", k=20) if h.is_leaf]
    got = mem.node_vectors([h.node_id for h in hits] + [hits[0].node_id])
    raw = emb.embed([h.text for h in hits] + [hits[0].text])
    assert got.dtype == np.float32 and got.shape == (len(hits) + 1, emb.dim)
    assert np.allclose(got, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    assert mem.node_vectors([]).shape[0] == 0
    q = mem.embed_query("tea")
    assert q.dtype == np.float32 and np.allclose(
        q, emb.embed(["tea"])[0] / np.linalg.norm(emb.embed(["tea"])[0])
    )
    missing = max(h.node_id for h in mem.retrieve("tea", k=20, admissible="all")) + 1000
    with pytest.raises(NodeNotFoundError, match=str(missing)):
        mem.node_vectors([hits[0].node_id, missing])
    with pytest.raises(InvalidInputError, match="got True"):
        mem.node_vectors([True])
    with pytest.raises(InvalidInputError, match="non-empty"):
        mem.embed_query("  ")
