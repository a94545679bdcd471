"""``hiermem eval --longmemeval`` on two real LongMemEval_S dev questions (``../shared/data``) with the
embedded embedder and the flat baselines: the file loads whole, the haystacks are ingested in one add per
method, and the figures are in range and consistent with each other."""

from __future__ import annotations

import pytest

from shared_core.eval import runner as R
from shared_core.eval.longmemeval import LME_METRICS, load_longmemeval
from tests.support import SHARED_DATA as DATA

LME = DATA / "longmemeval" / "longmemeval_s_dev.json"
pytestmark = pytest.mark.skipif(not LME.is_file(), reason=f"LongMemEval dev data not found at {LME}")


def test_the_dev_file_loads_whole():
    qs = load_longmemeval(LME)
    assert len(qs) == 74 and len({c.id for c in qs}) == 74
    types = {c.meta["question_type"] for c in qs}
    assert len(types) == 6
    for c in qs:
        (q,) = c.queries
        assert q.position == len(c.messages) > 400
        stamps = [m.timestamp for m in c.messages]
        assert stamps == sorted(stamps)
        assert len({m.id for m in c.messages}) == len(c.messages)
        assert c.meta["missing_evidence_sessions"] == 0
        assert q.meta["abstention"] or q.evidence


def test_two_real_questions_end_to_end(tmp_path):
    doc = R.run_eval(longmemeval=[LME], limit=2, methods="baselines", k=10, out=tmp_path, progress=False)
    convs = doc["data"]["longmemeval_s_dev"]["conversations"]
    assert len(convs) == 2
    for name, m in doc["methods"].items():
        o = m["overall"]
        assert o["n_queries"] == 2
        for metric in LME_METRICS:
            v = o.get(metric)
            assert v is None or 0.0 <= v <= 1.0, (name, metric)
        assert o["turn_recall@5"] <= o["turn_recall@10"]
        assert o["session_recall_all@10"] <= o["session_recall_any@10"]
        assert o["evidence_recall"] == pytest.approx(o["turn_recall@10"])
        # one bulk add per question: one embedding call each, none for BM25
        assert m["construction"]["total"]["embed_calls"] == (0 if m["kind"] == "bm25" else 2)
    for c in convs.values():
        assert c["messages_ingested"] == c["messages"] and c["embed_cache"]["hits"] > 0
