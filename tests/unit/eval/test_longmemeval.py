"""LongMemEval in ``hiermem eval``: the loader and its errors, the retrieval metrics by hand, the question
selection, abstention questions counted apart, one bulk add per method, the sessions-as-documents
baseline, the embedding cache shared by every method of a question, and the CLI."""

# ruff: noqa: F811  (pytest fixtures are passed as parameters named like the imported fixture)

from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from shared_core.eval import longmemeval_judge as J
from shared_core.eval import runner as R
from shared_core.eval.command import eval_command
from shared_core.eval.longmemeval import (
    ABSTENTION,
    REQUIRED_FIELDS,
    LongMemEvalFormatError,
    load_longmemeval,
    parse_longmemeval,
    question_metrics,
    select_questions,
)
from shared_core.eval.session_docs import FlatSessionDocs
from shared_core.scores import normalize_rows
from shared_core.search.lexical import LexicalIndex
from shared_core.search.relevance import fuse
from shared_core.types import Hit, InvalidInputError, Message
from tests.support.eval import BowEmbedder, tiny_longmemeval, write_longmemeval
from tests.support.openai_server import openai_server  # noqa: F401


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("other")(lambda: None)
    return app


# --------------------------------------------------------------------------- loader
def test_loader_orders_sessions_by_date_with_stable_ids(tmp_path):
    q_user, q_multi, q_abs = load_longmemeval(write_longmemeval(tmp_path / "lme.json"))
    assert [m.id for m in q_user.messages] == [
        "answer_g_1:0",
        "answer_g_1:1",
        "answer_g_1:2",
        "filler_1:0",
        "filler_1:1",
        "filler_1#2:0",  # the repeated session keeps its turns under its own key
        "filler_1#2:1",
    ]
    assert [m.timestamp for m in q_user.messages][::2] == [
        "2023-05-02 08:30",
        "2023-05-02 08:30",
        "2023-05-20 09:00",
        "2023-05-25 12:00",
    ]
    m = q_user.messages[2]
    assert (m.speaker, m.role, m.text) == ("user", "user", "My dog Rex dug up the tomato bed.")
    assert m.metadata == {"session": "answer_g_1", "session_id": "answer_g_1", "turn": 2}
    assert q_user.messages[5].metadata["session_id"] == "filler_1"
    assert q_user.meta["repeated_sessions"] == 1
    (q,) = q_user.queries
    assert (q.id, q.category, q.position, q.evidence) == (
        "q_user",
        "single-session-user",
        7,
        ["answer_g_1:2"],
    )
    assert q.meta["question_date"] == "2023-06-01 10:00" and q.meta["evidence_sessions"] == ["answer_g_1"]
    # the empty turn is left out (counted), the other turns keep their index
    assert [m.id for m in q_multi.messages][-2:] == ["answer_t_2:1", "answer_t_2:2"]
    assert q_multi.meta["skipped_messages"] == 1
    assert q_multi.queries[0].evidence == ["answer_t_1:0", "answer_t_2:1"]
    # abstention: its own category, no turn evidence (nothing to find)
    assert q_abs.queries[0].category == ABSTENTION and q_abs.queries[0].evidence == []
    assert q_abs.queries[0].meta["abstention"] is True


@pytest.mark.parametrize("field", REQUIRED_FIELDS)
def test_a_missing_field_is_named_with_the_question_id(tmp_path, field):
    items = tiny_longmemeval()
    del items[1][field]
    path = write_longmemeval(tmp_path / "bad.json", items)
    with pytest.raises(LongMemEvalFormatError) as e:
        load_longmemeval(path)
    assert isinstance(e.value, InvalidInputError) and e.value.field == field
    assert f"missing field {field!r}" in str(e.value)
    if field == "question_id":
        assert e.value.question_id is None and "item #1" in str(e.value)
    else:
        assert e.value.question_id == "q_multi" and "'q_multi'" in str(e.value)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda q: q.update(haystack_dates=q["haystack_dates"][:1]), "haystack_dates"),
        (lambda q: q.update(haystack_sessions=[[{"content": "no role"}]] * 3), "haystack_sessions"),
        (lambda q: q.update(answer_session_ids="answer_t_1"), "answer_session_ids"),
        (lambda q: q.update(question_date="June 10"), "question_date"),
        (lambda q: q.update(question="  "), "question"),
    ],
)
def test_a_malformed_field_is_named_with_the_question_id(tmp_path, change, field):
    items = tiny_longmemeval()
    change(items[1])
    with pytest.raises(LongMemEvalFormatError) as e:
        load_longmemeval(write_longmemeval(tmp_path / "bad.json", items))
    assert (e.value.field, e.value.question_id) == (field, "q_multi") and "q_multi" in str(e.value)


def test_not_a_longmemeval_file(tmp_path):
    for data in ({"dialogues": []}, [["not", "an", "object"]], "text"):
        p = tmp_path / "x.json"
        p.write_text(json.dumps(data), encoding="utf-8")
        with pytest.raises(LongMemEvalFormatError):
            load_longmemeval(p)
    items = tiny_longmemeval()
    items[2]["question_id"] = "q_user"
    with pytest.raises(LongMemEvalFormatError, match="'q_user' occurs more than once"):
        load_longmemeval(write_longmemeval(tmp_path / "dup.json", items))


def test_evidence_outside_the_haystack_is_counted_and_reported(tmp_path):
    items = tiny_longmemeval()
    items[1]["answer_session_ids"].append("answer_ghost_9")
    path = write_longmemeval(tmp_path / "lme.json", items)
    q_multi = load_longmemeval(path)[1]
    assert q_multi.meta["missing_evidence_sessions"] == 1 and q_multi.skipped_evidence == 1
    assert q_multi.queries[0].meta["missing_evidence_sessions"] == ["answer_ghost_9"]
    out = tmp_path / "out"
    doc = R.run_eval(
        longmemeval=[path],
        methods="bm25",
        k=10,
        out=out,
        progress=False,
        embedder=BowEmbedder(),
        n_resamples=50,
    )
    data = doc["data"]["lme"]
    assert data["skipped_evidence"] == 1
    assert data["conversations"]["q_multi"]["missing_evidence_sessions"] == 1
    # the question is still evaluated, over the evidence its haystack holds; the rows carry the
    # LongMemEval figures and the abstention flag
    rows = {
        (r["query_id"], r["method"]): r
        for r in (json.loads(x) for x in (out / "queries.jsonl").read_text().splitlines())
    }
    assert {q for q, m in rows if m == "bm25"} == {"q_user", "q_multi", "q_user_abs"}
    assert rows[("q_user_abs", "bm25")]["abstention"] is True
    assert rows[("q_user_abs", "bm25")]["category"] == ABSTENTION
    r = rows[("q_multi", "bm25")]
    assert r["abstention"] is False and set(r) >= {"turn_recall@10", "session_recall_all@5", "ndcg@10"}
    assert r["session_recall_all@10"] == 1.0  # both sessions present found: the missing one is left out
    md = (out / "results.md").read_text()
    assert "evidence sessions not in their haystack: 1 (questions q_multi" in md


# --------------------------------------------------------------------------- metrics
_Q_MULTI = parse_longmemeval(tiny_longmemeval())[1]


def _hit(ids: list[str], leaf: bool = True) -> Hit:
    return Hit(node_id=0, text="x", score=0.0, depth=1, is_leaf=leaf, span=(0, 0), source_ids=ids)


def test_question_metrics_by_hand(tmp_path):
    q_multi = load_longmemeval(write_longmemeval(tmp_path / "lme.json"))[1]
    q = q_multi.queries[0]  # evidence turns answer_t_1:0 and answer_t_2:1, sessions answer_t_1, answer_t_2
    canon = q_multi.meta["canonical_turns"]
    hits = [
        _hit(["answer_t_1:0", "answer_t_2:1"], leaf=False),  # a summary over both: counts for nothing
        _hit(["filler_2:0"]),
        _hit(["answer_t_1:0"]),  # rank 3
        *[_hit([f"filler_2:{i}"]) for i in range(1, 4)],
        _hit(["answer_t_2:2"]),  # rank 7: evidence session, not an evidence turn
        _hit(["answer_t_2:1"]),  # rank 8
    ]
    m = question_metrics(q, hits, 10, canon)
    assert m["turn_recall@5"] == 0.5 and m["turn_recall@10"] == 1.0
    assert (m["session_recall_any@5"], m["session_recall_all@5"]) == (1.0, 0.0)
    assert (m["session_recall_any@10"], m["session_recall_all@10"]) == (1.0, 1.0)
    ideal = 1 + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(4) + 1 / math.log2(9)) / ideal)
    assert m["abstention"] is False and m["question_type"] == "multi-session"
    # a cutoff above k is not computed
    m5 = question_metrics(q, hits[:5], 5, canon)
    assert m5["turn_recall@5"] == 0.5 and m5["turn_recall@10"] is None and m5["ndcg@10"] is None
    assert question_metrics(q, [], 10, canon)["session_recall_any@10"] == 0.0


def test_select_questions_spreads_over_types(tmp_path):
    qs = load_longmemeval(write_longmemeval(tmp_path / "lme.json"))
    assert [c.id for c in select_questions(qs, 2)] == ["q_user", "q_multi"]
    assert [c.id for c in select_questions(qs, 1)] == ["q_user"]
    assert [c.id for c in select_questions(qs, 9)] == ["q_user", "q_multi", "q_user_abs"]
    assert [c.id for c in load_longmemeval(tmp_path / "lme.json", limit=2)] == ["q_user", "q_multi"]
    with pytest.raises(InvalidInputError):
        select_questions(qs, 0)


# --------------------------------------------------------------------------- the run
def test_run_counts_abstention_apart_and_adds_each_haystack_in_one_add(tmp_path):
    path = write_longmemeval(tmp_path / "lme.json")
    doc = R.run_eval(
        longmemeval=[path],
        methods="segtree:collapsed,fusion",
        k=5,
        progress=False,
        embedder=BowEmbedder(),
        n_resamples=50,
    )
    names = [m["name"] for m in doc["config"]["methods"]]
    assert "session_docs" in names  # sessions as documents joins the flat baselines on LongMemEval
    for name in names:
        m = doc["methods"][name]
        assert m["overall"]["n_queries"] == 2  # pooled: the abstention question left out
        assert m["by_category"][ABSTENTION]["n_queries"] == 1
        assert m["overall"]["turn_recall@5"] is not None and m["overall"]["turn_recall@10"] is None
    for conv in doc["data"]["lme"]["conversations"].values():
        assert conv["messages_ingested"] == conv["messages"]
    # one bulk add per build and question
    seg = doc["methods"]["segtree:collapsed"]["construction"]
    assert seg["total"]["embed_calls"] >= 1
    cmp_ = doc["comparison"]
    assert "turn_recall@5" in cmp_["metrics"] and "session_docs" in cmp_["flat_baselines"]
    cell = cmp_["memories"]["segtree"]["overall"]["turn_recall@5"]
    assert cell["default"] == doc["methods"]["segtree:collapsed"]["overall"]["turn_recall@5"]


def test_each_haystack_is_one_add_call_per_build(tmp_path):
    path = write_longmemeval(tmp_path / "lme.json")
    datasets = R.load_datasets(longmemeval=[path])
    specs = R.with_references(R.parse_methods("segtree:collapsed,bm25"))
    for conv in datasets[0].conversations:
        res = R.evaluate_conversation(conv, specs, embedder=R.CachingEmbedder(BowEmbedder()), k=5)
        assert {b: c["add_calls"] for b, c in res["builds"].items()} == dict.fromkeys(res["builds"], 1)


class CountingEmbedder(BowEmbedder):
    """Counts how often each text is embedded."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: Counter[str] = Counter()

    def embed(self, texts):
        self.texts.update(texts)
        return super().embed(texts)


def test_every_method_of_a_question_shares_one_embedding_per_text(tmp_path):
    path = write_longmemeval(tmp_path / "lme.json")
    base = CountingEmbedder()
    doc = R.run_eval(
        longmemeval=[path], methods="segtree,memtree,baselines", k=5, progress=False, embedder=base
    )
    convs = load_longmemeval(path)
    # within a question each text reaches the base embedder once, whatever the number of methods
    per_question = Counter()
    for c in convs:
        per_question.update(dict.fromkeys([m.render() for m in c.messages] + [c.queries[0].question], 1))
    for text, n in per_question.items():
        assert base.texts[text] == n, text
    for qid, c in doc["data"]["lme"]["conversations"].items():
        assert c["embed_cache"]["hits"] > 0 and c["embed_cache"]["misses"] > 0, qid


# --------------------------------------------------------------------------- sessions as documents
def _msgs() -> list[Message]:
    sessions = {
        "a": ["the red apple", "a quiet lake walk", "the banana bread"],
        "b": ["apple banana smoothie recipe", "weather talk", "more weather"],
        "c": ["cherry pie", "apple tart"],
    }
    return [
        Message(t, speaker="user", id=f"{s}:{j}", metadata={"session": s})
        for s, turns in sessions.items()
        for j, t in enumerate(turns)
    ]


@pytest.mark.parametrize("n_sessions", [1, 2, 3])
def test_session_docs_match_a_direct_computation(n_sessions):
    emb = BowEmbedder()
    msgs = _msgs()
    flat = FlatSessionDocs(emb, sessions=n_sessions)
    flat.add(msgs[:4])
    flat.add(msgs[4:])  # a session spread over two add calls
    query = "apple banana"
    keys, scores = flat.session_scores(query)
    assert keys == ["a", "b", "c"]
    # by hand: mean of the turns' unit vectors, BM25 over the joined turn texts, the same fusion
    texts = [m.render() for m in msgs]
    vec = normalize_rows(emb.embed(texts))
    qv = normalize_rows(emb.embed([query]))[0]
    members = {k: [i for i, m in enumerate(msgs) if m.metadata["session"] == k] for k in keys}
    dense = []
    for k in keys:
        mean = vec[members[k]].mean(axis=0)
        dense.append(max(float(mean @ qv / np.linalg.norm(mean)), 0.0))
    lex = LexicalIndex()
    lex.upsert([0, 1, 2], ["\n".join(texts[i] for i in members[k]) for k in keys])
    ids, bm = lex.scores(query)
    lexs = np.zeros(3, np.float32)
    lexs[ids] = bm
    want = fuse(np.asarray(dense, np.float32), lexs, 0.5)
    assert np.allclose(scores, want, atol=1e-5)
    turn = flat.turns.scores(query)
    order = sorted(range(3), key=lambda j: (-want[j], j))
    chosen = [i for j in order[:n_sessions] for i in members[keys[j]]]
    expect = sorted(chosen, key=lambda i: (-turn[i], i)) + [
        i for j in order[n_sessions:] for i in sorted(members[keys[j]], key=lambda i: (-turn[i], i))
    ]
    hits = flat.retrieve(query, k=len(msgs))
    assert [h.source_ids[0] for h in hits] == [msgs[i].id for i in expect]
    assert all(h.is_leaf for h in hits)


def test_session_docs_errors_and_budget():
    with pytest.raises(InvalidInputError):
        FlatSessionDocs(BowEmbedder(), sessions=0)
    flat = FlatSessionDocs(BowEmbedder())
    assert flat.retrieve("apple", k=3) == []
    flat.add(_msgs())
    with pytest.raises(InvalidInputError):
        flat.retrieve("", k=3)
    assert len(flat.retrieve("apple", k=3, max_tokens=4)) >= 1
    assert sum(len(h.text.split()) for h in flat.retrieve("apple", k=3, max_tokens=4)) <= 4


# --------------------------------------------------------------------------- CLI
def test_cli_longmemeval_with_limit(tmp_path):
    path = write_longmemeval(tmp_path / "lme.json")
    out = tmp_path / "o"
    res = CliRunner().invoke(
        _app(),
        [
            "eval",
            "--longmemeval",
            str(path),
            "--limit",
            "2",
            "--methods",
            "bm25",
            "--k",
            "10",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "LongMemEval (pooled; abstention questions apart" in " ".join(res.output.split())
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["limit"] == 2
    assert sorted(doc["data"]["lme"]["conversations"]) == ["q_multi", "q_user"]
    md = (out / "results.md").read_text()
    assert "LongMemEval retrieval" in md and "RRF and fusion and sessions as documents)" in md


def test_cli_bad_longmemeval_file_names_the_field_and_question(tmp_path):
    items = tiny_longmemeval()
    del items[0]["haystack_dates"]
    path = write_longmemeval(tmp_path / "bad.json", items)
    res = CliRunner().invoke(_app(), ["eval", "--longmemeval", str(path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "'q_user': missing field 'haystack_dates'" in text


def test_newest_first_on_knowledge_update_questions(tmp_path):
    items = tiny_longmemeval()
    items[1]["question_type"] = "knowledge-update"  # answer_t_1 (1 May) is older than answer_t_2 (9 May)
    conv = load_longmemeval(write_longmemeval(tmp_path / "ku.json", items))[1]
    q, canon = conv.queries[0], conv.meta["canonical_turns"]
    assert q.meta["newest_evidence_session"] == "answer_t_2"
    older_first = [_hit(["filler_2:0"]), _hit(["answer_t_1:1"]), _hit(["answer_t_2:1"])]
    newer_first = [_hit(["answer_t_2:2"]), _hit(["answer_t_1:0"])]
    assert question_metrics(q, older_first, 10, canon)["newest_first@10"] == 0.0
    assert question_metrics(q, newer_first, 10, canon)["newest_first@10"] == 1.0
    assert math.isnan(question_metrics(q, [_hit(["filler_2:0"])], 10, canon)["newest_first@10"])
    assert question_metrics(q, newer_first, 5, canon)["newest_first@10"] is None
    other = load_longmemeval(write_longmemeval(tmp_path / "m.json"))[1]
    m = question_metrics(other.queries[0], newer_first, 10, other.meta["canonical_turns"])
    assert math.isnan(m["newest_first@10"])  # defined for knowledge-update questions only


def test_newest_turn_first_reads_the_evidence_turns_only(tmp_path):
    """answer_t_1:0 and answer_t_2:1 are the labelled turns; other turns of their sessions do not decide."""
    items = tiny_longmemeval()
    items[1]["question_type"] = "knowledge-update"
    conv = load_longmemeval(write_longmemeval(tmp_path / "ku.json", items))[1]
    q, canon = conv.queries[0], conv.meta["canonical_turns"]
    # the older session's unlabelled reply ranks first, then the newer statement, then the older one
    hits = [_hit(["answer_t_1:1"]), _hit(["answer_t_2:1"]), _hit(["answer_t_1:0"])]
    m = question_metrics(q, hits, 10, canon)
    assert (m["newest_first@10"], m["newest_turn_first@10"]) == (0.0, 1.0)
    hits = [_hit(["answer_t_2:2"]), _hit(["answer_t_1:0"]), _hit(["answer_t_2:1"])]
    m = question_metrics(q, hits, 10, canon)
    assert (m["newest_first@10"], m["newest_turn_first@10"]) == (1.0, 0.0)
    assert math.isnan(question_metrics(q, [_hit(["answer_t_2:2"])], 10, canon)["newest_turn_first@10"])
    assert question_metrics(q, hits, 5, canon)["newest_turn_first@10"] is None


# --------------------------------------------------------------------------- reader and judge
def test_longmemeval_judge_rubric_per_type_through_the_cli(tmp_path, openai_server):
    def llm(request: dict) -> str:
        system, user = request["messages"][0]["content"], request["messages"][-1]["content"]
        if system == J.LME_JUDGE_SYSTEM:
            return "no" if "Explanation:" in user else "Yes."
        return "Rex, your dog."

    openai_server.default_chat = llm
    out = tmp_path / "o"
    res = CliRunner().invoke(
        _app(),
        [
            "eval",
            "--longmemeval",
            str(write_longmemeval(tmp_path / "lme.json")),
            "--methods",
            "bm25",
            "--llm",
            "openai:test-model",
            "--base-url",
            openai_server.base_url,
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    reqs = openai_server.chat_requests()
    answers = [r for r in reqs if r["messages"][0]["content"] != J.LME_JUDGE_SYSTEM]
    verdicts = [
        r["messages"][-1]["content"] for r in reqs if r["messages"][0]["content"] == J.LME_JUDGE_SYSTEM
    ]
    # one answer and one verdict per question and method (bm25, and session_docs added on LongMemEval)
    assert len(answers) == len(verdicts) == 3 * 2
    # the reader knows the question's date; each judge prompt carries its type's rubric
    assert any("(Current date: 2023-06-10 18:00.)" in r["messages"][-1]["content"] for r in answers)
    by_q = {re.findall(r"<<<\n(.*?)\n>>>", v, re.S)[0]: v for v in verdicts}
    assert J.rubric("multi-session")[1] in by_q["Which places did I book a flight and a train to?"]
    abs_prompt = by_q["What is the name of my cat?"]
    assert "Explanation:" in abs_prompt and J.rubric("single-session-user", True)[1] in abs_prompt
    doc = json.loads((out / "results.json").read_text())
    bm25 = doc["methods"]["bm25"]
    assert bm25["overall"]["llm_accuracy"] == 1.0 and bm25["overall"]["judged"] == 2  # abstention apart
    assert bm25["by_category"][ABSTENTION]["llm_accuracy"] == 0.0


def test_rubrics_differ_by_type():
    texts = {t: J.rubric(t)[1] for t in ("multi-session", "temporal-reasoning", "knowledge-update")}
    assert "off-by-one" in texts["temporal-reasoning"] and "off-by-one" not in texts["multi-session"]
    assert "updated answer" in texts["knowledge-update"]
    assert J.rubric("single-session-preference")[0] == "Rubric"
    assert J.rubric("knowledge-update", abstention=True)[0] == "Explanation"


_IDS = [f"{s}:{j}" for s, n in (("answer_t_1", 2), ("filler_2", 4), ("answer_t_2", 3)) for j in range(n)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.sampled_from(_IDS), min_size=1, max_size=3), st.booleans()), max_size=12),
    st.integers(1, 12),
)
def test_metric_invariants(hits, k):
    conv = _Q_MULTI
    q, canon = conv.queries[0], conv.meta["canonical_turns"]
    m = question_metrics(q, [_hit(ids, leaf) for ids, leaf in hits], k, canon)
    for c in (5, 10):
        if c > k:
            assert m[f"turn_recall@{c}"] is None and m[f"session_recall_all@{c}"] is None
            continue
        assert 0.0 <= m[f"session_recall_all@{c}"] <= m[f"session_recall_any@{c}"] <= 1.0
        assert 0.0 <= m[f"turn_recall@{c}"] <= 1.0
        # every evidence turn found puts its session among the found ones
        if m[f"turn_recall@{c}"] == 1.0:
            assert m[f"session_recall_all@{c}"] == 1.0
    if k >= 10:
        assert m["turn_recall@5"] <= m["turn_recall@10"]
        assert m["session_recall_all@5"] <= m["session_recall_all@10"]
        assert 0.0 <= m["ndcg@10"] <= 1.0 + 1e-12
        assert (m["ndcg@10"] == 0.0) == (m["turn_recall@10"] == 0.0)
