"""``hiermem eval``: method specs, online ingestion with one build per memory, metrics, reports, resume,
the CLI function, and the answer + LLM-judge path against the OpenAI-protocol test server."""

# ruff: noqa: F811  (pytest fixtures are passed as parameters named like the imported fixture)

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from shared_core.eval import runner as R
from shared_core.eval.command import eval_command
from shared_core.eval.data import Conversation, Query
from shared_core.eval.judge import AnswerJudge, format_context, parse_llm_spec
from shared_core.eval.metrics import rouge_l_recall
from shared_core.eval.report import markdown_table
from shared_core.models.openai_models import OpenAIChat
from shared_core.prompts import eval as P
from shared_core.types import InvalidInputError, LLMRequiredError, UnknownPolicyError
from tests.support import eval as support_eval
from tests.support.eval import BowEmbedder, aggregate_of, write_jsonl
from tests.support.openai_server import openai_server  # noqa: F401


def tiny_conversation() -> Conversation:
    """The support conversation, as a loader reports one that dropped a query and two evidence ids."""
    return support_eval.tiny_conversation(skipped_evidence=2, meta={"source": "jsonl", "skipped_queries": 1})


# --------------------------------------------------------------------------- method specs
def test_parse_methods_defaults_and_shared_builds():
    specs = R.parse_methods(None)
    names = [s.name for s in specs]
    mems = R.available_memories()
    for kind, cls in mems.items():
        usable = [p for p in cls.policies if p not in getattr(cls, "llm_policies", ())]
        assert [n for n in names if n.startswith(kind + ":")] == [f"{kind}:{p}" for p in usable]
    assert names[-4:] == ["flat_dense", "bm25", "hybrid", "fusion"]
    assert "hat:agent" not in names  # LLM-only policy left out without an LLM in the memories
    assert "hat:agent" in [s.name for s in R.parse_methods("hat", memory_llm=True)]

    specs = R.parse_methods("segtree:top_down, segtree:collapsed,dense,rrf,segtree:top_down")
    assert [s.name for s in specs] == ["segtree:top_down", "segtree:collapsed", "flat_dense", "hybrid"]
    assert {s.build for s in specs[:2]} == {"segtree"}

    (s,) = R.parse_methods("segtree[threshold=0.4,relevance=dense]:bottom_up")
    assert s.build == "segtree[relevance=dense,threshold=0.4]"
    assert dict(s.params) == {"relevance": "dense", "threshold": 0.4}
    assert s.name == s.build + ":bottom_up"


def test_parse_fusion_groups_and_options():
    assert [s.name for s in R.parse_methods("baselines")] == ["flat_dense", "bm25", "hybrid", "fusion"]
    assert R.DEFAULT_BASELINES == ("flat_dense", "bm25", "hybrid", "fusion")
    assert (*R.DEFAULT_BASELINES, "session_docs") == R.COUNTED_BASELINES
    all_names = [s.name for s in R.parse_methods("all")]
    assert "fusion" in all_names and "bm25_unstemmed" not in all_names
    (f,) = R.parse_methods("fusion")
    assert (f.name, f.build, f.kind, f.policy, f.params, f.is_memory) == (
        "fusion",
        "fusion",
        "fusion",
        None,
        (),
        False,
    )
    (g,) = R.parse_methods("fusion[hybrid_weight=0.3]")
    assert g.name == g.build == "fusion[hybrid_weight=0.3]" and dict(g.params) == {"hybrid_weight": 0.3}
    # the default weight written out is the same build; an integer weight is read as a float
    assert [s.name for s in R.parse_methods("fusion[hybrid_weight=0.5],fusion,fusion[hybrid_weight=1]")] == [
        "fusion",
        "fusion[hybrid_weight=1.0]",
    ]
    for bad in ("fusion[hybrid_weight=2]", "fusion[hybrid_weight=x]", "fusion[hybrid_weight=true]"):
        with pytest.raises(InvalidInputError):
            R.parse_methods(bad)
    with pytest.raises(UnknownPolicyError):
        R.parse_methods("fusion:top_down")
    with pytest.raises(InvalidInputError, match="bad option"):
        R._make_build(R.parse_methods("fusion[k_rrf=3]")[0], BowEmbedder(), None)
    obj = R._make_build(g, BowEmbedder(), None)
    assert type(obj).__name__ == "FlatFusion" and obj.hybrid_weight == 0.3


def test_time_prior_options_are_set_on_the_memory():
    """``xmemory[time_weight=0]`` is a separate build whose time prior is off; a bad weight is refused
    when the build is made; the time weight changes nothing of the memory's facts."""
    (blind,) = R.parse_methods("segtree[time_weight=0,order_weight=0.5]:collapsed")
    mem = R._make_build(blind, BowEmbedder(), None)
    assert (mem.time_weight, mem.order_weight) == (0.0, 0.5)
    assert type(mem).time_weight > 0  # the class default is untouched
    assert R._make_build(R.parse_methods("segtree:collapsed")[0], BowEmbedder(), None).time_weight > 0
    assert R.memory_facts(blind) == R.memory_facts(R.parse_methods("segtree:collapsed")[0])
    with pytest.raises(InvalidInputError, match="time_weight"):
        R._make_build(R.parse_methods("segtree[time_weight=2]")[0], BowEmbedder(), None)


def test_supersession_option_is_set_on_the_memory():
    """``segtree[supersession=off]`` is the same memory marking no update; an unknown mode is refused."""
    (off,) = R.parse_methods("segtree[supersession=off]:collapsed")
    mem = R._make_build(off, BowEmbedder(), None)
    assert mem.supersession == "off" and type(mem).supersession == "auto"
    assert (
        R._make_build(R.parse_methods("hat[supersession=rule]")[0], BowEmbedder(), None).supersession
        == "rule"
    )
    with pytest.raises(InvalidInputError, match="supersession"):
        R._make_build(R.parse_methods("segtree[supersession=sometimes]")[0], BowEmbedder(), None)


def test_reference_specs_and_added_methods():
    assert R.reference_spec("dense").name == "flat_dense"
    assert R.reference_spec("bm25").name == "bm25"
    assert R.reference_spec("hybrid").name == "fusion"
    assert R.reference_spec("hybrid", 0.25).name == "fusion[hybrid_weight=0.25]"
    with pytest.raises(UnknownPolicyError):
        R.reference_spec("sparse")
    seg = R.parse_methods("segtree:collapsed")[0]
    assert R.memory_facts(seg) == {
        "default_policy": "collapsed",
        "tree_policy": "top_down",
        "relevance": "hybrid",
        "hybrid_weight": 0.5,
    }
    prop = R.parse_methods("segtree[policy=top_down]:collapsed")[0]
    assert R.memory_facts(prop)["default_policy"] == R.memory_facts(prop)["tree_policy"] == "top_down"
    seg_dense = R.parse_methods("segtree[relevance=dense]:collapsed")[0]
    assert R.memory_facts(seg_dense)["relevance"] == "dense"
    hat = R.parse_methods("hat:greedy")[0]
    assert R.memory_facts(hat)["default_policy"] == "collapsed"
    assert R.memory_facts(hat)["tree_policy"] == "top_down"
    assert R.memory_facts(hat, memory_llm=True)["default_policy"] == "agent"
    with pytest.raises(InvalidInputError):
        R.memory_facts(R.parse_methods("bm25")[0])
    # the default, tree and collapsed policies go after the build's methods, the flat reference at the
    # end, once
    specs = R.with_references(R.parse_methods("segtree:collapsed,bm25,segtree[hybrid_weight=0.3]:top_down"))
    assert [s.name for s in specs] == [
        "segtree:collapsed",
        "segtree:top_down",
        "bm25",
        "segtree[hybrid_weight=0.3]:top_down",
        "segtree[hybrid_weight=0.3]:collapsed",
        "fusion",
        "fusion[hybrid_weight=0.3]",
    ]
    assert specs[4].policy == "collapsed" and specs[4].build == "segtree[hybrid_weight=0.3]"
    assert specs[1].build == "segtree" and specs[1].policy == "top_down"
    # other memories: whatever their configuration says (their defaults may change)
    specs = R.parse_methods("memtree:traversal,hat:greedy,fusion")
    expected, refs = [], []
    for s in specs[:2]:
        facts = R.memory_facts(s)
        names = [s.policy, facts["default_policy"], facts["tree_policy"], "collapsed"]
        expected += [f"{s.build}:{p}" for p in dict.fromkeys(names)]
        ref = R.reference_spec(facts["relevance"], facts["hybrid_weight"]).name
        if ref != "fusion" and ref not in refs:
            refs.append(ref)
    assert [s.name for s in R.with_references(specs)] == [*expected, "fusion", *refs]
    assert R.with_references(R.parse_methods("baselines")) == R.parse_methods("baselines")


def test_compare_methods_by_hand():
    methods = {
        "segtree:collapsed": aggregate_of({"d1": 0.80, "d2": 0.40}, "segtree", "segtree"),
        "segtree:top_down": aggregate_of({"d1": 0.70, "d2": 0.50}, "segtree", "segtree"),
        "hat:greedy": aggregate_of({"d1": 0.30, "d2": 0.20}, "hat", "hat"),
        "hat:collapsed": aggregate_of({"d1": 0.35, "d2": 0.25}, "hat", "hat"),
        "flat_dense": aggregate_of({"d1": 0.40, "d2": 0.30}, "flat_dense"),
        "bm25": aggregate_of({"d1": 0.65, "d2": 0.35}, "bm25"),
        "bm25_unstemmed": aggregate_of({"d1": 0.95, "d2": 0.95}, "bm25_unstemmed"),  # does not count
        "hybrid": aggregate_of({"d1": 0.55, "d2": 0.45}, "hybrid"),
        "fusion": aggregate_of({"d1": 0.60, "d2": 0.42}, "fusion"),
    }
    facts = {
        "segtree": {"default_policy": "top_down", "relevance": "hybrid", "hybrid_weight": 0.5},
        "hat": {"default_policy": "greedy", "relevance": "dense", "hybrid_weight": 0.5},
    }
    comp = R.compare_methods(methods, facts)
    assert comp["flat_baselines"] == ["flat_dense", "bm25", "hybrid", "fusion"]
    assert comp["best_flat"]["by_dataset"]["d1"]["evidence_recall"] == {"method": "bm25", "value": 0.65}
    assert comp["best_flat"]["by_dataset"]["d2"]["evidence_recall"] == {"method": "hybrid", "value": 0.45}
    # pooled: fusion (0.60 + 0.42) / 2 = 0.51 beats bm25 and hybrid (0.50)
    assert comp["best_flat"]["overall"]["evidence_recall"] == {
        "method": "fusion",
        "value": pytest.approx(0.51),
    }
    seg = comp["memories"]["segtree"]
    assert (seg["default"], seg["collapsed"], seg["reference"], seg["relevance"], seg["hybrid_weight"]) == (
        "segtree:top_down",
        "segtree:collapsed",
        "fusion",
        "hybrid",
        0.5,
    )
    # the three numbers: margin = default - best flat, tree share = default - collapsed (same relevance,
    # no structure), corpus share = collapsed - the flat reference with that relevance (fusion)
    d1 = seg["by_dataset"]["d1"]["evidence_recall"]
    assert d1["margin_over_best_flat"] == pytest.approx(0.70 - 0.65) and d1["best_flat_method"] == "bm25"
    assert d1["tree_share"] == pytest.approx(0.70 - 0.80)
    assert d1["corpus_share"] == pytest.approx(0.80 - 0.60)
    assert (d1["default"], d1["collapsed"], d1["reference"]) == (0.70, 0.80, 0.60)
    d2 = seg["by_dataset"]["d2"]["span_recall"]
    assert d2["margin_over_best_flat"] == pytest.approx(0.60 - 0.55)
    assert d2["tree_share"] == pytest.approx(0.60 - 0.50)
    assert d2["corpus_share"] == pytest.approx(0.50 - 0.52)
    pooled = seg["overall"]["evidence_recall"]
    assert pooled["tree_share"] == pytest.approx(0.60 - 0.60, abs=1e-12)
    assert pooled["corpus_share"] == pytest.approx(0.60 - 0.51)
    assert "ci95" not in pooled and "bootstrap" not in comp  # no per-query rows, no intervals
    hat = comp["memories"]["hat"]
    assert (hat["reference"], hat["hybrid_weight"]) == ("flat_dense", None)
    hat_d1 = hat["by_dataset"]["d1"]["answer_token_recall"]
    assert hat_d1["tree_share"] == pytest.approx(0.30 - 0.35)
    assert hat_d1["corpus_share"] == pytest.approx(0.35 - 0.40)
    assert hat_d1["margin_over_best_flat"] == pytest.approx(0.30 - 0.65)
    assert "note" not in seg and "note" not in hat
    assert comp["fusion_weights"] is None  # one fusion weight: no sweep
    assert (seg["tree"], seg["tree_policy"]) == ("segtree:top_down", "top_down")  # none named: the default

    # a default that is not the tree policy: the margin is the default's, the tree share the tree
    # policy's against collapsed, whatever the default
    facts2 = {"segtree": {**facts["segtree"], "default_policy": "collapsed", "tree_policy": "top_down"}}
    seg2 = R.compare_methods(methods, facts2)["memories"]["segtree"]
    assert (seg2["default"], seg2["tree"], seg2["collapsed"]) == (
        "segtree:collapsed",
        "segtree:top_down",
        "segtree:collapsed",
    )
    c2 = seg2["by_dataset"]["d1"]["evidence_recall"]
    assert (c2["default"], c2["tree"], c2["collapsed"]) == (0.80, 0.70, 0.80)
    assert c2["margin_over_best_flat"] == pytest.approx(0.80 - 0.65)
    assert c2["tree_share"] == pytest.approx(0.70 - 0.80)
    assert c2["corpus_share"] == pytest.approx(0.80 - 0.60)
    facts3 = {"segtree": {**facts2["segtree"], "tree_policy": "bottom_up"}}  # never evaluated
    seg3 = R.compare_methods(methods, facts3)["memories"]["segtree"]
    assert seg3["overall"]["evidence_recall"]["tree_share"] is None
    assert "segtree:bottom_up was not evaluated" in seg3["note"]
    assert seg3["overall"]["evidence_recall"]["margin_over_best_flat"] is not None

    # a missing reference or default leaves the shares that need it undefined, with a note
    del methods["fusion"]
    facts["hat"] = {"default_policy": "agent", "relevance": "dense", "hybrid_weight": 0.5}
    comp = R.compare_methods(methods, facts)
    seg = comp["memories"]["segtree"]
    assert seg["overall"]["evidence_recall"]["corpus_share"] is None
    assert "fusion was not evaluated" in seg["note"]
    assert seg["overall"]["evidence_recall"]["tree_share"] is not None
    assert seg["overall"]["evidence_recall"]["margin_over_best_flat"] is not None
    hat_o = comp["memories"]["hat"]["overall"]["evidence_recall"]
    assert hat_o["default"] is None and hat_o["tree_share"] is None and hat_o["corpus_share"] is not None

    # the Markdown marks the best flat baseline and shows margin and share for each memory default
    doc = {
        "config": {"k": 10},
        "data": {
            "d1": {"source": "jsonl", "conversations": {}},
            "d2": {"source": "jsonl", "conversations": {}},
        },
        "methods": {**methods, "fusion": aggregate_of({"d1": 0.60, "d2": 0.42}, "fusion")},
    }
    doc["comparison"] = R.compare_methods(doc["methods"], {"segtree": facts["segtree"]})
    md = markdown_table(doc)
    assert "| bm25 | **0.650** | **0.750** | — | **0.450** |" in md  # subtree recall: reported, never bold
    assert "| bm25_unstemmed | 0.950 |" in md  # reported, never marked
    assert (
        "| segtree:top_down | hybrid, w = 0.5 | evidence recall@10 | 0.700 | bm25 0.650 | +0.050 | "
        "top_down 0.700 | 0.800 | -0.100 | fusion 0.600 | +0.200 |" in md
    )
    assert (
        "| segtree:top_down | hybrid, w = 0.5 | evidence recall@10 | 0.600 | fusion 0.510 | +0.090 | "
        "top_down 0.600 | 0.600 | +0.000 | fusion 0.510 | +0.090 |" in md
    )


@pytest.mark.parametrize(
    "spec, error",
    [
        ("nosuch", InvalidInputError),
        ("segtree:sideways", UnknownPolicyError),
        ("bm25:top_down", UnknownPolicyError),
        ("hat:agent", LLMRequiredError),
        ("segtree[threshold]", InvalidInputError),
        ("segtree:top:down", InvalidInputError),
        ("", InvalidInputError),
    ],
)
def test_parse_methods_errors(spec, error):
    with pytest.raises(error):
        R.parse_methods(spec)


def test_bad_option_is_a_clear_error():
    spec = R.parse_methods("segtree[no_such_option=1]:top_down")
    with pytest.raises(InvalidInputError, match="no_such_option"):
        R.evaluate_conversation(tiny_conversation(), spec, embedder=BowEmbedder())


# --------------------------------------------------------------------------- ingestion and metrics
def test_batches_never_cross_queries_or_sessions():
    conv = tiny_conversation()
    assert R._batches(conv, 6, "session") == [(0, 3), (3, 6)]
    assert R._batches(conv, 6, "query") == [(0, 3), (3, 6)]
    assert R._batches(conv, 6, "message") == [(i, i + 1) for i in range(6)]
    conv.queries.append(Query("x", "y", ["D1:1"], 1, position=1, id="early"))
    assert R._batches(conv, 6, "session") == [(0, 1), (1, 3), (3, 6)]
    assert R._batches(conv, 3, "query") == [(0, 1), (1, 3)]


def test_one_build_per_memory_and_online_visibility(monkeypatch):
    conv = tiny_conversation()
    made: list[str] = []
    real = R._make_build
    adds: dict[str, list[int]] = {}

    def spy(spec, embedder, llm):
        obj = real(spec, embedder, llm)
        made.append(spec.build)
        orig = obj.add

        def add(msgs, **kw):
            adds.setdefault(spec.build, []).append(len(msgs))
            return orig(msgs, **kw)

        obj.add = add
        return obj

    monkeypatch.setattr(R, "_make_build", spy)
    specs = R.parse_methods("segtree:top_down,segtree:collapsed,segtree:bottom_up,bm25,memtree")
    res = R.evaluate_conversation(conv, specs, embedder=BowEmbedder(), k=2, add_batch="session")
    assert made == ["segtree", "bm25", "memtree"]  # one object per build, policies share it
    assert adds == {b: [3, 3] for b in made}
    assert res["builds"]["segtree"]["messages"] == 6 and res["builds"]["segtree"]["add_calls"] == 2
    for name in ("segtree:top_down", "bm25", "memtree:traversal"):
        rows = res["methods"][name]["queries"]
        assert [r["query_id"] for r in rows] == ["q0", "q1", "q2"]
        # the first query is asked after session 1 only: no hit may come from session 2
        first = [sid for h in rows[0]["hits"] for sid in h.get("source_ids", [])]
        assert all(s.startswith("D1:") for s in first)
        assert rows[0]["hits"] and max(h["span"][1] for h in rows[0]["hits"]) <= 2


def test_metric_invariants_and_exact_bm25_case():
    conv = tiny_conversation()
    specs = R.parse_methods("segtree,memtree,hat,bm25,flat_dense")
    res = R.evaluate_conversation(conv, specs, embedder=BowEmbedder(), k=3)
    for name, m in res["methods"].items():
        for r in m["queries"]:
            assert 0.0 <= r["evidence_recall"] <= r["span_recall"] <= 1.0, name
            assert 0.0 <= r["answer_token_recall"] <= 1.0
            assert r["n_hits"] <= 3 and r["leaf_hits"] <= r["n_hits"]
            assert r["latency_ms"] >= 0 and r["latency_cpu_ms"] >= 0
    # BM25 with k=1 on distinctive words, worked by hand: "apples" only in D1:2; "Lisbon" in D2:1 and D2:2
    res = R.evaluate_conversation(conv, R.parse_methods("bm25"), embedder=BowEmbedder(), k=1)
    rows = {r["query_id"]: r for r in res["methods"]["bm25"]["queries"]}
    assert rows["q0"]["evidence_recall"] == 1.0
    assert rows["q1"]["evidence_recall"] == 0.5  # one of the two evidence turns fits in k=1
    assert rows["q1"]["answer_token_recall"] == 1.0  # "lisbon" is in the hit
    assert rows["q0"]["returned_tokens"] == len(
        re.findall(r"\w+|[^\w\s]", "Ann: My sister grows apples in Kent.")
    )


def test_token_budget_is_respected_by_every_method():
    conv = tiny_conversation()
    specs = R.parse_methods("segtree:collapsed,memtree:collapsed,hat:greedy,flat_dense,bm25,hybrid,fusion")
    res = R.evaluate_conversation(conv, specs, embedder=BowEmbedder(), k=10, max_tokens=12)
    for name, m in res["methods"].items():
        for r in m["queries"]:
            assert r["returned_tokens"] <= 12, name
            if name in R.BASELINES:
                assert r["n_hits"] >= 1, name  # every message here is under 12 tokens


@pytest.mark.parametrize("kind", ["flat_dense", "bm25", "hybrid", "fusion"])
def test_flat_baseline_budget_skips_what_does_not_fit(kind):
    from shared_core.eval.baselines import FlatBM25, FlatDense, FlatFusion, FlatHybridRRF

    obj = {
        "flat_dense": lambda: FlatDense(BowEmbedder()),
        "bm25": FlatBM25,
        "hybrid": lambda: FlatHybridRRF(BowEmbedder()),
        "fusion": lambda: FlatFusion(BowEmbedder()),
    }[kind]()
    obj.add(["apples apples and more apples from the big orchard of apples", "apples here", "pears"])
    assert [h.text for h in obj.retrieve("apples", k=2)][0].startswith("apples apples")
    # the best match (11 tokens) does not fit in 5 tokens: it is skipped and the walk goes on
    assert [h.text for h in obj.retrieve("apples", k=2, max_tokens=5)] == ["apples here", "pears"]
    assert [h.text for h in obj.retrieve("apples", k=1, max_tokens=5)] == ["apples here"]
    with pytest.raises(InvalidInputError):
        obj.retrieve("apples", k=2, max_tokens=0)


def test_aggregates_pool_queries_and_construction_per_message():
    conv = tiny_conversation()
    specs = R.parse_methods("segtree:top_down,bm25")
    a = R.evaluate_conversation(conv, specs, embedder=BowEmbedder(), k=2, dataset="d")
    agg = R.aggregate_results([a], specs)
    rows = a["methods"]["segtree:top_down"]["queries"]
    o = agg["segtree:top_down"]["overall"]
    assert o["n_queries"] == 3
    assert o["evidence_recall"] == pytest.approx(np.mean([r["evidence_recall"] for r in rows]))
    assert agg["segtree:top_down"]["by_category"]["4"]["n_queries"] == 2
    c = agg["segtree:top_down"]["construction"]
    u = a["builds"]["segtree"]["usage"]
    assert c["messages"] == 6
    assert c["embed_calls_per_message"] == pytest.approx(u["embed_calls"] / 6)
    assert c["embed_calls_per_message"] > 0
    assert agg["bm25"]["construction"]["embed_calls_per_message"] == 0
    b = a["builds"]["bm25"]
    assert b["refresh_wall_seconds"] > 0  # the lazy BM25 rebuild is charged to construction
    assert agg["bm25"]["construction"]["cpu_ms_per_message"] == pytest.approx(
        1e3 * (b["cpu_seconds"] + b["refresh_cpu_seconds"]) / 6
    )
    assert agg["bm25"]["by_dataset"]["d"]["overall"]["n_queries"] == 3


def test_caching_embedder_shares_vectors():
    base = BowEmbedder()
    emb = R.CachingEmbedder(base)
    emb.prime(["a b", "c d", "a b"])
    assert base.calls == 1 and emb.misses == 2
    v = emb.embed(["c d", "a b"])
    assert base.calls == 1 and emb.hits == 2
    np.testing.assert_allclose(v, base.embed(["c d", "a b"]))
    emb.embed(["new text"])
    assert base.calls == 3 and emb.misses == 3


# --------------------------------------------------------------------------- run_eval, files, resume


def test_resume_recomputes_a_missing_conversation_only(tmp_path, monkeypatch):
    conv = tiny_conversation()
    f1 = write_jsonl(tmp_path / "one.jsonl", conv)
    f2 = write_jsonl(tmp_path / "two.jsonl", conv)
    kw = dict(
        jsonl=[f1, f2],
        methods="bm25,segtree:top_down",
        k=2,
        out=tmp_path / "o",
        progress=False,
        embedder=BowEmbedder(),
    )
    first = R.run_eval(**kw)
    assert first["resumed_conversations"] == []
    (tmp_path / "o" / "conversations" / "two__two.json").unlink()
    calls = []
    real = R.evaluate_conversation
    monkeypatch.setattr(R, "evaluate_conversation", lambda c, *a, **k: calls.append(c.id) or real(c, *a, **k))
    second = R.run_eval(**kw, resume=True)
    assert calls == ["two"] and second["resumed_conversations"] == ["one"]
    for name in ("bm25", "segtree:top_down"):
        for key in ("evidence_recall", "span_recall", "answer_token_recall", "returned_tokens"):
            assert second["methods"][name]["overall"][key] == first["methods"][name]["overall"][key]
    assert set(second["methods"]["bm25"]["by_dataset"]) == {"one", "two"}


def test_three_numbers_in_results_json_are_differences_of_the_rows(tmp_path):
    conv = tiny_conversation()
    f1 = write_jsonl(tmp_path / "one.jsonl", conv)
    conv2 = tiny_conversation()
    conv2.queries = conv2.queries[1:]
    f2 = write_jsonl(tmp_path / "two.jsonl", conv2)
    out = tmp_path / "o"
    R.run_eval(
        jsonl=[f1, f2],
        methods="segtree[relevance=bm25]:collapsed,segtree[relevance=dense]:bottom_up,flat_dense,xmemory",
        k=1,
        out=out,
        progress=False,
        embedder=BowEmbedder(),
        n_resamples=500,
    )
    doc = json.loads((out / "results.json").read_text())
    names = [m["name"] for m in doc["config"]["methods"]]
    # added for the comparison: each memory's default, tree and collapsed policies and its flat reference
    assert names[:6] == [
        "segtree[relevance=bm25]:collapsed",
        "segtree[relevance=bm25]:top_down",
        "segtree[relevance=dense]:bottom_up",
        "segtree[relevance=dense]:collapsed",
        "segtree[relevance=dense]:top_down",
        "flat_dense",
    ]
    assert "bm25" in names[6:] and "xmemory:collapsed" in names
    comp = doc["comparison"]
    flats = [n for n in names if n in R.COUNTED_BASELINES]
    assert comp["flat_baselines"] == flats
    assert comp["bootstrap"]["resamples"] == 500 and comp["bootstrap"]["seed"] == 0
    mems = comp["memories"]
    assert list(mems) == ["segtree[relevance=bm25]", "segtree[relevance=dense]", "xmemory"]
    assert mems["segtree[relevance=bm25]"]["reference"] == "bm25"
    assert mems["segtree[relevance=dense]"]["reference"] == "flat_dense"
    assert mems["segtree[relevance=dense]"]["collapsed"] == "segtree[relevance=dense]:collapsed"
    built = json.loads((out / "conversations" / "one__one.json").read_text())["builds"]
    assert built["segtree[relevance=bm25]"]["memory"]["relevance"] == "bm25"
    # the per-query rows: one JSON line per question and method
    lines = [json.loads(x) for x in (out / "queries.jsonl").read_text().splitlines()]
    n_q = len(conv.queries) + len(conv2.queries)
    assert len(lines) == n_q * len(names)
    assert set(lines[0]) >= {"conversation", "query_id", "category", "method", "evidence_recall"}
    assert {"returned_tokens", "span_recall", "answer_token_recall"} <= set(lines[0])
    per: dict[str, list[dict]] = {}
    for row in lines:
        per.setdefault(row["method"], []).append(row)
    values: list[float] = []
    n_cells = 0
    for m in mems.values():
        for scope, cells in [(None, m["overall"]), *m["by_dataset"].items()]:
            for metric, c in cells.items():
                rows = {
                    n: (
                        doc["methods"][n]["overall"]
                        if scope is None
                        else doc["methods"][n]["by_dataset"][scope]["overall"]
                    )
                    for n in (m["default"], m["tree"], m["collapsed"], m["reference"], *flats)
                }
                d, t, col, r = (
                    rows[n][metric] for n in (m["default"], m["tree"], m["collapsed"], m["reference"])
                )
                assert (c["default"], c["tree"], c["collapsed"], c["reference"]) == (d, t, col, r)
                assert c["tree_share"] == pytest.approx(t - col, abs=1e-12)
                assert c["corpus_share"] == pytest.approx(col - r, abs=1e-12)
                best = max(rows[n][metric] for n in flats)
                assert c["best_flat"] == best
                assert c["margin_over_best_flat"] == pytest.approx(d - best, abs=1e-12)
                # each interval: the bootstrap recomputed from queries.jsonl with numpy
                for key, (a, b) in {
                    "margin_over_best_flat": (m["default"], c["best_flat_method"]),
                    "tree_share": (m["tree"], m["collapsed"]),
                    "corpus_share": (m["collapsed"], m["reference"]),
                }.items():
                    ra = [x for x in per[a] if scope is None or x["dataset"] == scope]
                    rb = {(x["dataset"], x["query_id"]): x[metric] for x in per[b]}
                    pairs = [
                        (x[metric], rb[(x["dataset"], x["query_id"])])
                        for x in ra
                        if x[metric] is not None and rb[(x["dataset"], x["query_id"])] is not None
                    ]
                    diff = np.array([p - q for p, q in pairs])
                    idx = np.random.default_rng(0).integers(0, len(diff), size=(500, len(diff)))
                    lo, hi = np.percentile(diff[idx].mean(axis=1), [2.5, 97.5])
                    assert c["ci95"][key] == pytest.approx([lo, hi], abs=1e-12)
                    assert float(np.mean(diff)) == pytest.approx(c[key], abs=1e-12)
                n_cells += 1
                values.extend([d, t, col, r])
    assert n_cells == 3 * 3 * 3  # three memories, overall + two datasets, three metrics
    # not vacuous: the rows compared hold values (the arithmetic itself is worked by hand in
    # test_compare_methods_by_hand, where the shares are non-zero)
    assert any(v > 0 for v in values)
    assert set(mems["segtree[relevance=dense]"]["by_dataset"]) == {"one", "two"}
    md = (out / "results.md").read_text()
    assert "Memories against the flat baselines (one)" in md and "(all queries pooled)" in md
    assert "| segtree[relevance=dense]:collapsed | dense | evidence recall@1 |" in md
    assert "95% paired bootstrap intervals (500 resamples of the questions, seed 0" in md
    assert doc["files"]["queries"] == "queries.jsonl"


def test_run_eval_input_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="No data"):
        R.run_eval(methods="bm25")
    with pytest.raises(InvalidInputError, match="no such file"):
        R.run_eval(locomo=[tmp_path / "missing.json"], methods="bm25")
    f = write_jsonl(tmp_path / "c.jsonl", tiny_conversation())
    with pytest.raises(InvalidInputError, match="not found"):
        R.run_eval(jsonl=[f], methods="bm25", conversations=["nope"], embedder=BowEmbedder())
    with pytest.raises(InvalidInputError, match="llm"):
        R.run_eval(jsonl=[f], methods="bm25", llm_memories=True, embedder=BowEmbedder())
    with pytest.raises(InvalidInputError, match="add_batch"):
        R.run_eval(jsonl=[f], methods="bm25", add_batch="weekly", embedder=BowEmbedder())


# --------------------------------------------------------------------------- answer generation + judge
def test_judge_prompts_parse_and_rouge(openai_server):
    openai_server.script_chat("Lisbon, next month.", "maybe", "1")
    judge = AnswerJudge(OpenAIChat("test-model", base_url=openai_server.base_url))
    ja = judge("Where does Ann fly?", "Lisbon", ["Ann: The flight to Lisbon leaves at nine.", "Ann: hi"])
    assert ja.answer == "Lisbon, next month." and ja.verdict == 1
    assert ja.judge_raw == ["maybe", "1"]  # one corrective retry
    assert ja.rouge_l_recall == 1.0
    assert ja.usage.llm_calls == 3
    reqs = openai_server.chat_requests()
    ans_prompt = reqs[0]["messages"][-1]["content"]
    assert reqs[0]["messages"][0]["content"] == P.ANSWER_SYSTEM
    assert "[1] Ann: The flight to Lisbon leaves at nine.\n[2] Ann: hi" in ans_prompt
    assert "<<<\nWhere does Ann fly?\n>>>" in ans_prompt
    judge_prompt = reqs[1]["messages"][-1]["content"]
    assert reqs[1]["messages"][0]["content"] == P.JUDGE_SYSTEM
    assert "<<<\nLisbon\n>>>" in judge_prompt and "<<<\nLisbon, next month.\n>>>" in judge_prompt
    assert "could not be parsed" in reqs[2]["messages"][-1]["content"]

    openai_server.script_chat("Paris", "no idea", "still no idea")
    ja = judge("q?", "Lisbon", [])
    assert ja.verdict is None and ja.rouge_l_recall == 0.0  # never a guessed verdict
    assert format_context([]) in openai_server.chat_requests()[3]["messages"][-1]["content"]


def test_rouge_l_recall_by_hand():
    assert rouge_l_recall("the cat sat on the mat", "the cat was on a mat") == pytest.approx(4 / 6)
    assert rouge_l_recall("Lisbon", "") == 0.0
    assert math.isnan(rouge_l_recall("", "anything"))


def test_parse_llm_spec():
    assert parse_llm_spec("openai:gpt-4o-mini") == ("openai", "gpt-4o-mini")
    for bad in ("gpt-4o", "anthropic:claude", "openai:"):
        with pytest.raises(InvalidInputError):
            parse_llm_spec(bad)


ANSWERS = {
    "fly": ("lisbon", "Lisbon"),
    "bake": ("banana bread", "banana bread"),
    "apples": ("sister", "her sister"),
}


def scripted_llm(request: dict) -> str:
    """The answerer names the answer only when a retrieved excerpt holds its key words; the judge says 1
    exactly when the predicted answer contains the reference."""
    system = request["messages"][0]["content"]
    blocks = re.findall(r"<<<\n(.*?)\n>>>", request["messages"][-1]["content"], re.S)
    if system == P.JUDGE_SYSTEM:
        _, reference, prediction = blocks
        return "1" if reference.lower() in prediction.lower() else "0"
    question, context = blocks
    for word, (needle, answer) in ANSWERS.items():
        if word in question and needle in context.lower():
            return answer
    return "The memory does not say."


def test_llm_answer_and_judge_through_the_cli(tmp_path, openai_server):
    openai_server.default_chat = scripted_llm
    conv = tiny_conversation()
    f = write_jsonl(tmp_path / "tiny.jsonl", conv)
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("noop")(lambda: None)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--jsonl",
            str(f),
            "--methods",
            "bm25",
            "--k",
            "1",
            "--llm",
            "openai:test-model",
            "--embedder",
            "openai:test-embed",
            "--base-url",
            openai_server.base_url,
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["llm"] == "openai:test-model"
    assert doc["config"]["embedder"] == "openai:test-embed" and openai_server.embed_requests()
    rows = json.loads(next((out / "conversations").glob("*.json")).read_text())["methods"]["bm25"]["queries"]
    assert len(openai_server.chat_requests()) == 2 * len(rows)  # one answer and one verdict per query
    for r in rows:
        # the judge's verdict follows the retrieved evidence: exact by construction of the script
        assert r["llm_accuracy"] == (1 if r["answer"] != "The memory does not say." else 0)
        assert r["llm_accuracy"] == int(r["evidence_recall"] > 0)
    o = doc["methods"]["bm25"]["overall"]
    assert o["llm_accuracy"] == pytest.approx(np.mean([r["llm_accuracy"] for r in rows]))
    assert o["judged"] == 3
    assert "LLM-judge accuracy" in (out / "results.md").read_text()


def test_judge_unparseable_verdicts_are_left_out_of_accuracy(tmp_path, openai_server):
    def llm(request: dict) -> str:
        if request["messages"][0]["content"] == P.JUDGE_SYSTEM:
            q = re.findall(r"<<<\n(.*?)\n>>>", request["messages"][-1]["content"], re.S)[0]
            return "1" if "apples" in q else "unsure"
        return "some answer"

    openai_server.default_chat = llm
    f = write_jsonl(tmp_path / "tiny.jsonl", tiny_conversation())
    doc = R.run_eval(
        jsonl=[f],
        methods="bm25",
        k=2,
        llm=OpenAIChat("m", base_url=openai_server.base_url),
        llm_name="openai:m",
        embedder=BowEmbedder(),
        progress=False,
    )
    o = doc["methods"]["bm25"]["overall"]
    assert o["judged"] == 1 and o["llm_accuracy"] == 1.0
    # 3 answers + 1 verdict + 2 x (verdict + retry)
    assert len(openai_server.chat_requests()) == 3 + 1 + 4
    md = markdown_table(doc)
    assert "LLM-judge accuracy" in md and "| bm25 |" in md
