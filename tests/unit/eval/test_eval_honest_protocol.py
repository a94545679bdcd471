"""Protocol rules of ``hiermem eval`` (issue 31): the flat fusion weight chosen on dev is the one that
counts on validate, span recall credits only what a returned text shows, and one render of returned
texts for every method alike. Hand-worked tiny cases."""

from __future__ import annotations

import pytest

from shared_core.eval import metrics as M
from shared_core.eval import protocol as P
from shared_core.eval import runner as R
from shared_core.types import Hit, InvalidInputError, Message
from tests.support.eval import BowEmbedder, aggregate_of, tiny_conversation, write_jsonl


# --------------------------------------------------------------------------- (a) dev-chosen fusion weight
def _fusion(values: dict[str, float], weight: float | None) -> dict:
    a = aggregate_of(values, "fusion", "fusion" if weight is None else f"fusion[hybrid_weight={weight}]")
    a["params"] = {} if weight is None else {"hybrid_weight": weight}
    return a


def _methods() -> dict:
    return {
        "segtree:top_down": aggregate_of({"d": 0.62}, "segtree", "segtree"),
        "segtree:collapsed": aggregate_of({"d": 0.60}, "segtree", "segtree"),
        "bm25": aggregate_of({"d": 0.50}, "bm25"),
        "fusion": _fusion({"d": 0.58}, None),  # w = 0.5
        "fusion[hybrid_weight=0.4]": _fusion({"d": 0.55}, 0.4),
        "fusion[hybrid_weight=0.7]": _fusion({"d": 0.64}, 0.7),  # best here, but not the dev choice
    }


FACTS = {"segtree": {"default_policy": "top_down", "relevance": "hybrid", "hybrid_weight": 0.5}}


def test_every_fusion_weight_counts_without_a_dev_choice():
    comp = R.compare_methods(_methods(), FACTS)
    assert comp["fusion_weight"] is None
    best = comp["best_flat"]["overall"]["evidence_recall"]
    assert best == {"method": "fusion[hybrid_weight=0.7]", "value": pytest.approx(0.64)}
    cell = comp["memories"]["segtree"]["overall"]["evidence_recall"]
    assert cell["margin_over_best_flat"] == pytest.approx(0.62 - 0.64)


def test_only_the_dev_chosen_fusion_weight_counts():
    comp = R.compare_methods(_methods(), FACTS, fusion_weight=0.4)
    assert comp["fusion_weight"] == 0.4
    assert comp["flat_baselines"] == ["bm25", "fusion[hybrid_weight=0.4]"]
    best = comp["best_flat"]["overall"]["evidence_recall"]
    assert best == {"method": "fusion[hybrid_weight=0.4]", "value": pytest.approx(0.55)}
    cell = comp["memories"]["segtree"]["overall"]["evidence_recall"]
    assert cell["margin_over_best_flat"] == pytest.approx(0.62 - 0.55)
    # the corpus share still uses the memory's own reference (fusion at the memory's weight, 0.5)
    assert cell["corpus_share"] == pytest.approx(0.60 - 0.58)
    # weight 0.5 is the unparameterised "fusion"
    comp = R.compare_methods(_methods(), FACTS, fusion_weight=0.5)
    assert comp["flat_baselines"] == ["bm25", "fusion"]
    with pytest.raises(InvalidInputError):
        R.compare_methods(_methods(), FACTS, fusion_weight=1.5)


def test_run_eval_adds_and_records_the_counted_fusion_weight(tmp_path):
    doc = R.run_eval(
        jsonl=[write_jsonl(tmp_path / "tiny.jsonl", tiny_conversation())],
        methods="bm25",
        embedder=BowEmbedder(),
        progress=False,
        fusion_weight=0.3,
    )
    assert doc["config"]["fusion_weight"] == 0.3
    assert "fusion[hybrid_weight=0.3]" in doc["methods"]
    assert doc["comparison"]["flat_baselines"] == ["bm25", "fusion[hybrid_weight=0.3]"]
    assert 0.0 <= P.DEV_FUSION_WEIGHT <= 1.0


# --------------------------------------------------------------------------- (b) span recall: shown text
SENTS = {
    "D1": ["Ann: I love bananas.", "Mangoes too."],
    "D2": ["Bob: My sister grows apples."],
    "D3": ["Ann: We fly to Lisbon."],
}


def test_contained_recall_credits_leaves_and_quoted_sentences_only():
    # a summary over D1..D3 quoting one sentence of D1 and one of D3 shows D1 and D3, not D2
    summary = ("Mangoes too. Ann: We fly to Lisbon.", False, ["D1", "D2", "D3"])
    assert M.contained_recall([summary], ["D1", "D2", "D3"], SENTS) == pytest.approx(2 / 3)
    # a leaf shows its own message whatever its text
    assert M.contained_recall([("anything", True, ["D2"])], ["D2"], SENTS) == 1.0
    # a quoted sentence counts only for ids the hit carries
    assert M.contained_recall([("Ann: We fly to Lisbon.", False, ["D1"])], ["D3"], SENTS) == 0.0
    # part of a word is no quote ("too." inside "tattoo."), nor is a sentence cut by "…"
    assert M.contained_recall([("Mangoes tattoo.", False, ["D1"])], ["D1"], {"D1": ["tattoo"]}) == 1.0
    assert M.contained_recall([("I love tattoo.", False, ["D1"])], ["D1"], {"D1": ["too."]}) == 0.0
    assert M.contained_recall([("Bob: My sister gr…", False, ["D2"])], ["D2"], SENTS) == 0.0
    # duplicates in the evidence count once; no hits, nothing shown
    assert M.contained_recall([summary], ["D1", "D1"], SENTS) == 1.0
    assert M.contained_recall([], ["D1"], SENTS) == 0.0
    with pytest.raises(InvalidInputError):
        M.contained_recall([summary], [], SENTS)


def test_message_sentences_split_the_rendered_messages_per_id():
    msgs = [
        Message("I love bananas. Mangoes too.", speaker="Ann", id="s1"),
        Message("Fine.", speaker="Bob", id="s1"),
        Message("No id here."),
    ]
    assert M.message_sentences(msgs) == {"s1": ["Ann: I love bananas.", "Mangoes too.", "Bob: Fine."]}


def test_runner_span_recall_is_the_shown_one_and_subtree_recall_the_span_one():
    conv = tiny_conversation()
    ctx = R._ScoreContext(conv, "d", None, "plain")
    q = conv.queries[1]  # evidence D2:1, D2:2
    summary = Hit(
        node_id=9,
        text="Ann: The flight to Lisbon leaves at nine.",
        score=1.0,
        depth=1,
        is_leaf=False,
        span=(3, 5),
        source_ids=["D2:1", "D2:2", "D2:3"],
    )
    row = R._score(ctx, q, [summary], 0.0, 0.0)
    assert row["evidence_recall"] == 0.0  # no leaf
    assert row["span_recall"] == 0.5  # quotes D2:2 only
    assert row["subtree_recall"] == 1.0  # both under the hit


# --------------------------------------------------------------------------- (c) one render for all
def test_date_text_and_render_returned():
    assert M.date_text("1:56 pm on 8 May, 2023") == "8 May 2023"
    assert M.date_text("2025-12-19 (Friday)") == "19 December 2025"
    assert M.date_text("sometime") == "sometime" and M.date_text(None) is None
    assert M.render_returned("Ann: hi", True, "8 May 2023", "dated") == "[8 May 2023] Ann: hi"
    assert M.render_returned("Ann: hi", True, "8 May 2023", "plain") == "Ann: hi"
    assert M.render_returned("a summary", False, "8 May 2023", "dated") == "a summary"
    assert M.render_returned("Ann: hi", True, None, "dated") == "Ann: hi"
    with pytest.raises(InvalidInputError):
        M.render_returned("x", True, None, "fancy")


def test_dated_render_applies_to_memories_and_flat_baselines_alike():
    conv = tiny_conversation()
    conv.queries[1].answer = "9 May 2023"  # only the date answers it
    specs = R.parse_methods("segtree:collapsed,fusion")
    plain = R.evaluate_conversation(conv, specs, embedder=BowEmbedder(), k=6)
    dated = R.evaluate_conversation(conv, specs, embedder=BowEmbedder(), k=6, render="dated")
    for name in ("segtree:collapsed", "fusion"):
        p = plain["methods"][name]["queries"][1]
        d = dated["methods"][name]["queries"][1]
        assert p["answer_token_recall"] == 0.0  # "may", "2023" are in no stored text
        assert d["answer_token_recall"] == 1.0  # the leaves of 9 May carry the date now
        assert d["returned_tokens"] > p["returned_tokens"]
        assert d["evidence_recall"] == p["evidence_recall"]  # retrieval itself is unchanged
    with pytest.raises(InvalidInputError):
        R.evaluate_conversation(conv, specs, embedder=BowEmbedder(), render="fancy")
