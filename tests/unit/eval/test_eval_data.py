"""Evaluation data loaders (LoCoMo, RealMem, JSONL, bundled excerpt) and metrics."""

from __future__ import annotations

import json
import math
from importlib import resources

import pytest

from shared_core.eval import (
    answer_token_recall,
    content_words,
    count_tokens,
    evidence_recall,
    load_jsonl,
    load_locomo,
    load_realmem,
    load_realmem_excerpt,
    mean_by,
    normalize_evidence_id,
    render_message,
    span_recall,
)
from shared_core.types import InvalidInputError, Message
from tests.support import SHARED_DATA as DATA

LOCOMO = DATA / "locomo" / "locomo_dev.json"
REALMEM = DATA / "realmem" / "Kenta_Tanaka_dialogues_256k.json"
needs_locomo = pytest.mark.skipif(not LOCOMO.is_file(), reason=f"LoCoMo dev data not found at {LOCOMO}")
needs_realmem = pytest.mark.skipif(not REALMEM.is_file(), reason=f"RealMem data not found at {REALMEM}")


# --------------------------------------------------------------------------- LoCoMo, real file
@needs_locomo
def test_locomo_dev_counts():
    convs = {c.id: c for c in load_locomo(LOCOMO)}
    assert list(convs) == ["conv-26", "conv-30"]
    c26, c30 = convs["conv-26"], convs["conv-30"]
    # README: conv-26 19 sessions, 419 turns, 152 QA in categories 1-4; conv-30 19 / 369 / 81.
    assert (c26.meta["sessions"], len(c26.messages)) == (19, 419)
    assert (c30.meta["sessions"], len(c30.messages)) == (19, 369)
    assert len(c26.queries) + c26.meta["skipped_queries"] == 152
    assert len(c30.queries) + c30.meta["skipped_queries"] == 81
    assert len(c26.queries) + len(c30.queries) == 231  # two QA of conv-26 have no evidence at all
    for c in (c26, c30):
        ids = {m.id for m in c.messages}
        assert len(ids) == len(c.messages)
        for q in c.queries:
            assert q.position == len(c.messages) and q.category in (1, 2, 3, 4)
            assert q.evidence and set(q.evidence) <= ids and len(set(q.evidence)) == len(q.evidence)


@needs_locomo
def test_locomo_dev_turns_and_malformed_evidence():
    c26 = load_locomo(LOCOMO)[0]
    # expected values are read from the file itself (LoCoMo is CC BY-NC: no text of it is copied here)
    source = json.loads(LOCOMO.read_text(encoding="utf-8"))[0]
    first = c26.messages[0]
    assert (first.id, first.speaker, first.timestamp, first.metadata) == (
        "D1:1",
        source["conversation"]["session_1"][0]["speaker"],
        source["conversation"]["session_1_date_time"],
        {"session": 1},
    )
    sessions = [m.metadata["session"] for m in c26.messages]
    assert sessions == sorted(sessions)
    turn = next(t for t in source["conversation"]["session_1"] if t["dia_id"] == "D1:5")
    photo = next(m for m in c26.messages if m.id == "D1:5")
    assert photo.text == f"{turn['text']} [shares a photo: {turn['blip_caption']}]"
    raw = next(m for m in load_locomo(LOCOMO, captions=False)[0].messages if m.id == "D1:5")
    assert raw.text == turn["text"] and "[shares a photo" not in raw.text
    malformed = next(qa for qa in source["qa"] if qa.get("evidence") == ["D8:6; D9:17"])
    painted = next(q for q in c26.queries if q.question == malformed["question"])
    assert painted.evidence == ["D8:6", "D9:17"]  # the file has "D8:6; D9:17"
    assert render_message(first) == "Caroline: " + first.text
    all_cats = load_locomo(LOCOMO, categories=None)
    assert {q.category for c in all_cats for q in c.queries} == {1, 2, 3, 4, 5}


# --------------------------------------------------------------------------- LoCoMo, inline cases
@pytest.mark.parametrize(
    "raw, ids",
    [
        ("D8:6; D9:17", ["D8:6", "D9:17"]),
        ("D:11:26", ["D11:26"]),
        ("D30:05", ["D30:5"]),
        ("D1:3 D1:4", ["D1:3", "D1:4"]),
        ("D1:3,D2:1", ["D1:3", "D2:1"]),
        ("D1:3, D2:1;D2:2", ["D1:3", "D2:1", "D2:2"]),
        ("D2", []),
        ("", []),
    ],
)
def test_normalize_evidence_id(raw, ids):
    assert normalize_evidence_id(raw) == ids


def _turns(session: int, n: int, speaker_a="Ann", speaker_b="Bob"):
    return [
        {
            "speaker": speaker_a if t % 2 else speaker_b,
            "dia_id": f"D{session}:{t}",
            "text": f"turn {session}.{t}",
        }
        for t in range(1, n + 1)
    ]


@pytest.fixture
def small_locomo(tmp_path):
    conv = {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_1_date_time": "1 May",
        "session_1": _turns(1, 3),
        "session_10_date_time": "10 May",
        "session_10": _turns(10, 2),
        "session_2_date_time": "2 May",
        "session_2": _turns(2, 2)
        + [{"speaker": "Ann", "dia_id": "D2:3", "text": "look", "blip_caption": "a cat"}],
        "session_11_date_time": "11 May",
        "session_11": _turns(11, 26),
        "session_30_date_time": "30 May",
        "session_30": _turns(30, 5),
        "session_31_date_time": "31 May",  # a date without a session
    }
    qa = [
        {"question": "q0", "answer": "a0", "evidence": ["D1:2; D2:1"], "category": 1},
        {"question": "q1", "answer": "a1", "evidence": ["D:11:26"], "category": 2},
        {"question": "q2", "answer": 2023, "evidence": ["D30:05", "D30:5"], "category": 3},
        {"question": "q3", "answer": "a3", "evidence": ["D1:1 D1:3", "D99:1"], "category": 4},
        {"question": "q4", "answer": "a4", "evidence": ["D99:1"], "category": 4},
        {"question": "q5", "answer": "a5", "evidence": [], "category": 1},
        {"question": "q6", "adversarial_answer": "x", "evidence": ["D1:1"], "category": 5},
        {"question": "q7", "answer": "a7", "evidence": ["D10:1,D10:2"], "category": 2},
    ]
    p = tmp_path / "locomo.json"
    p.write_text(json.dumps([{"sample_id": "s1", "conversation": conv, "qa": qa}]))
    return p


def test_locomo_inline_normalisation_and_order(small_locomo):
    (c,) = load_locomo(small_locomo)
    assert [m.metadata["session"] for m in c.messages][:6] == [1, 1, 1, 2, 2, 2]
    order = list(dict.fromkeys(m.metadata["session"] for m in c.messages))
    assert order == [1, 2, 10, 11, 30]
    assert len(c.messages) == 3 + 3 + 2 + 26 + 5
    assert c.messages[5].text == "look [shares a photo: a cat]"
    assert c.messages[5].timestamp == "2 May"
    by_q = {q.question: q for q in c.queries}
    assert list(by_q) == ["q0", "q1", "q2", "q3", "q7"]
    assert by_q["q0"].evidence == ["D1:2", "D2:1"]
    assert by_q["q1"].evidence == ["D11:26"]
    assert by_q["q2"].evidence == ["D30:5"] and by_q["q2"].answer == "2023"
    assert by_q["q3"].evidence == ["D1:1", "D1:3"]
    assert by_q["q7"].evidence == ["D10:1", "D10:2"]
    assert c.skipped_evidence == 2  # D99:1 twice
    assert c.meta["skipped_queries"] == 2  # q4 (unresolvable), q5 (empty)
    assert all(q.position == len(c.messages) for q in c.queries)
    (c5,) = load_locomo(small_locomo, categories=[5])
    assert [q.question for q in c5.queries] == ["q6"] and c5.queries[0].answer == ""
    assert c5.queries[0].meta["adversarial_answer"] == "x"


def test_locomo_bad_files(tmp_path):
    with pytest.raises(InvalidInputError, match="No such file"):
        load_locomo(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        load_locomo(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"foo": 1}]))
    with pytest.raises(InvalidInputError, match="LoCoMo"):
        load_locomo(wrong)


# --------------------------------------------------------------------------- RealMem
@needs_realmem
def test_realmem_queries_online():
    c = load_realmem(REALMEM)
    assert c.id == "Kenta_Tanaka"
    assert len(c.queries) == 153 and c.meta["skipped_queries"] == 0
    assert c.skipped_evidence == 1  # one query names its own, not yet ingested, session
    assert c.meta["skipped_messages"] == 1  # one assistant turn with empty content
    assert 1500 <= len(c.messages) <= 1543
    positions = [q.position for q in c.queries]
    assert positions == sorted(positions)
    for q in c.queries:
        asked = c.messages[q.position]
        assert asked.text == q.question and asked.role == "user" and asked.speaker == "User"
        before = {m.id for m in c.messages[: q.position]}
        assert q.evidence and set(q.evidence) <= before
        assert c.messages[q.position + 1].text == q.answer  # the next assistant turn
        assert q.meta["memory_used"]
    m0 = c.messages[0]
    assert (m0.id, m0.timestamp, m0.metadata) == (
        "d8461ffc",
        "2025-12-19 (Friday)",
        {"session": "Mental_Health_Support_421:S1_01"},
    )


def test_realmem_inline(tmp_path):
    data = {
        "_metadata": {"person_name": "P"},
        "dialogues": [
            {
                "session_identifier": "A:S1",
                "session_uuid": "u1",
                "current_time": "t1",
                "dialogue_turns": [
                    {"speaker": "User", "is_query": False, "content": "I like tea", "query_id": None},
                    {"speaker": "Assistant", "is_query": False, "content": "Noted", "query_id": None},
                ],
            },
            {
                "session_identifier": "A:S2",
                "session_uuid": "u2",
                "current_time": "t2",
                "dialogue_turns": [
                    {"speaker": "User", "is_query": True, "content": "What do I like?", "query_id": "Q1"},
                    {
                        "speaker": "Assistant",
                        "is_query": False,
                        "content": "Tea",
                        "memory_session_uuids": ["u1", "u2", "u9"],
                        "memory_used": [{"session_uuid": "u1", "content": "likes tea"}],
                    },
                    {"speaker": "User", "is_query": True, "content": "And?", "query_id": "Q2"},
                    {
                        "speaker": "Assistant",
                        "is_query": False,
                        "content": "Nothing",
                        "memory_session_uuids": [],
                    },
                    {"speaker": "User", "is_query": True, "content": "Last?", "query_id": "Q3"},
                ],
            },
        ],
    }
    p = tmp_path / "rm.json"
    p.write_text(json.dumps(data))
    c = load_realmem(p)
    assert [m.text for m in c.messages] == [
        "I like tea",
        "Noted",
        "What do I like?",
        "Tea",
        "And?",
        "Nothing",
        "Last?",
    ]
    assert [m.id for m in c.messages] == ["u1", "u1", "u2", "u2", "u2", "u2", "u2"]
    assert [m.role for m in c.messages[:2]] == ["user", "assistant"]
    (q,) = c.queries
    assert (q.id, q.position, q.evidence, q.answer) == ("Q1", 2, ["u1"], "Tea")
    assert q.meta["memory_used"] == ["likes tea"]
    assert c.skipped_evidence == 2  # u2 (not yet ingested) and u9 (unknown)
    assert c.meta["skipped_queries"] == 2  # Q2 without evidence, Q3 without an answer turn


def test_excerpt_is_small_self_contained_prefix():
    res = resources.files("shared_core") / "data" / "realmem_excerpt.json"
    raw = json.loads(res.read_text(encoding="utf-8"))
    assert len(res.read_bytes()) < 1_000_000
    assert raw["_metadata"]["license"] == "Apache-2.0" and "RealMem" in raw["_metadata"]["source"]
    c = load_realmem_excerpt()
    assert 250 <= len(c.messages) <= 450 and len(c.queries) >= 15
    assert c.skipped_evidence == 0 and c.meta["skipped_queries"] == 0
    for q in c.queries:
        assert set(q.evidence) <= {m.id for m in c.messages[: q.position]}
    if REALMEM.is_file():
        full = load_realmem(REALMEM)
        n = len(c.messages)
        assert [m.to_dict() for m in full.messages[:n]] == [m.to_dict() for m in c.messages]
        assert [q.to_dict() for q in full.queries[: len(c.queries)]] == [q.to_dict() for q in c.queries]
        assert full.queries[len(c.queries)].position >= n  # no query of the prefix was left out


# --------------------------------------------------------------------------- JSONL
def test_load_jsonl(tmp_path):
    p = tmp_path / "chat.jsonl"
    p.write_text(
        "\n".join(
            [
                json.dumps({"text": "I adopted a dog named Luna", "speaker": "Ann", "id": "m1"}),
                "",
                json.dumps({"text": "Nice!", "role": "assistant", "metadata": {"x": 1}}),
                json.dumps({"question": "Dog's name?", "answer": "Luna", "evidence": "m1"}),
            ]
        )
    )
    c = load_jsonl(p)
    assert c.id == "chat" and len(c.messages) == 2
    assert c.messages[0] == Message("I adopted a dog named Luna", speaker="Ann", id="m1")
    assert c.messages[1].metadata == {"x": 1}
    (q,) = c.queries
    assert (q.position, q.evidence, q.answer) == (2, ["m1"], "Luna")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"nope": 1}) + "\n")
    with pytest.raises(InvalidInputError, match=":2:"):
        load_jsonl(bad)
    bad.write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(InvalidInputError, match=":1:"):
        load_jsonl(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(InvalidInputError, match="JSON object"):
        load_jsonl(bad)


# --------------------------------------------------------------------------- metrics
def test_evidence_recall():
    assert evidence_recall(["a", "b", "x"], ["a", "c"]) == 0.5
    assert evidence_recall([["x"], ["a", "c"]], ["a", "c", "c"]) == 1.0  # per-hit lists, duplicates once
    assert evidence_recall([], ["a"]) == 0.0
    with pytest.raises(InvalidInputError):
        evidence_recall(["a"], [])


def test_span_recall():
    positions = {"a": [0], "b": [5, 6], "c": [9]}
    assert span_recall([(0, 1), (6, 6)], ["a", "b", "c"], positions) == pytest.approx(2 / 3)
    assert span_recall([(2, 4)], ["a", "b"], positions) == 0.0
    assert span_recall([], ["a"], positions) == 0.0
    assert span_recall([(0, 100)], ["zzz"], positions) == 0.0


def test_content_words_and_answer_token_recall():
    assert content_words("The Dog and the cats, in 2023!") == {"dog", "cats", "2023"}
    assert content_words("") == set()
    assert answer_token_recall("Luna, the dog", "Caroline: my dog is called Luna") == 1.0
    assert answer_token_recall("a red kite", "the kite flew") == 0.5
    assert answer_token_recall("a red kite", ["the kite", "is red"]) == 1.0
    assert answer_token_recall("The", "anything") == 1.0  # no content words: nothing to find
    assert answer_token_recall("painting", "paint") == 0.0  # unstemmed


def test_count_tokens_and_mean_by():
    assert count_tokens("Hi, you!") == 4
    assert count_tokens(["a b", "c."]) == 4
    assert count_tokens("") == 0
    out = mean_by([1.0, 2.0, 3.0, math.nan, 5.0], [1, 1, 2, 2, 3])
    assert out == {1: 1.5, 2: 3.0, 3: 5.0} and list(out) == [1, 2, 3]
    assert math.isnan(mean_by([math.nan], ["x"])["x"])
    with pytest.raises(InvalidInputError):
        mean_by([1.0], [1, 2])
