"""``hiermem eval`` on real data, end to end, with the real embedded embedder: a small evaluation of a
LoCoMo dev conversation (``../shared/data``), and the bundled RealMem excerpt through the CLI with a
resume."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import typer
from typer.testing import CliRunner

from shared_core.eval import runner as R
from shared_core.eval.command import eval_command
from shared_core.eval.data import load_realmem_excerpt
from tests.support import SHARED_DATA as DATA
from tests.support.openai_server import openai_server  # noqa: F401

LOCOMO = DATA / "locomo" / "locomo_dev.json"


def check_doc_schema(doc: dict, methods: Sequence[str], n_queries: int, k: int) -> None:
    assert doc["schema"] == R.SCHEMA
    cfg = doc["config"]
    assert cfg["k"] == k and [m["name"] for m in cfg["methods"]] == list(methods)
    assert set(doc["methods"]) == set(methods)
    for name, m in doc["methods"].items():
        assert set(m) >= {"build", "kind", "policy", "overall", "by_category", "by_dataset", "construction"}
        o = m["overall"]
        assert o["n_queries"] == n_queries, name
        for key in ("evidence_recall", "span_recall", "answer_token_recall"):
            assert isinstance(o[key], float) and 0.0 <= o[key] <= 1.0, (name, key)
        assert o["evidence_recall"] <= o["span_recall"] + 1e-12
        assert isinstance(o["returned_tokens"], float) and o["returned_tokens"] > 0
        assert 0 < o["n_hits"] <= k
        assert o["latency_ms"] > 0 and o["latency_ms_median"] > 0
        c = m["construction"]
        for key in (
            "embed_calls_per_message",
            "llm_calls_per_message",
            "wall_ms_per_message",
            "cpu_ms_per_message",
        ):
            assert isinstance(c[key], float) and c[key] >= 0, (name, key)
        assert c["llm_calls_per_message"] == 0
        assert sum(cat["n_queries"] for cat in m["by_category"].values()) == n_queries


@pytest.mark.slow
def test_realmem_excerpt_through_the_cli_and_resume(tmp_path, local_embedder, monkeypatch):
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("noop")(lambda: None)  # two commands, so "eval" is a sub-command as in hiermem
    out = tmp_path / "out"
    args = [
        "eval",
        "--realmem-excerpt",
        "--methods",
        "hat:greedy,bm25,flat_dense",
        "--max-queries",
        "1",
        "--out",
        str(out),
        "--no-progress",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "results.json").read_text())
    with_refs = [s.name for s in R.with_references(R.parse_methods("hat:greedy,bm25,flat_dense"))]
    check_doc_schema(doc, with_refs, 1, 10)
    conv = load_realmem_excerpt()
    facts = doc["data"]["realmem_excerpt"]["conversations"][conv.id]
    first = min(q.position for q in conv.queries)
    assert facts["messages_ingested"] == first and facts["queries_evaluated"] == 1
    assert doc["config"]["inputs"][0]["file"].startswith("bundled:")
    assert "| hat:greedy |" in (out / "results.md").read_text()
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    conv_file = next((out / "conversations").glob("*.json"))
    rows = json.loads(conv_file.read_text())["methods"]["bm25"]["queries"]
    assert [r["query_id"] for r in rows] == [min(conv.queries, key=lambda q: q.position).id]

    # --resume: nothing is recomputed, the results are the same
    def boom(*a, **kw):
        raise AssertionError("recomputed a conversation that --resume should skip")

    monkeypatch.setattr(R, "evaluate_conversation", boom)
    res = CliRunner().invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    again = json.loads((out / "results.json").read_text())
    assert again["resumed_conversations"] == [conv.id]
    assert again["methods"]["bm25"]["overall"] == doc["methods"]["bm25"]["overall"]
    # another configuration over the same directory is refused, with a clear message
    res = CliRunner().invoke(app, [*args[:-1], "--k", "5", "--no-progress", "--resume"])
    assert res.exit_code == 2
    assert "another configuration" in res.output


@pytest.mark.slow
def test_locomo_dev_small_evaluation_schema(tmp_path, local_embedder):
    if not LOCOMO.is_file():
        pytest.skip(
            "LoCoMo dev split not found at ../shared/data/locomo/locomo_dev.json (CC BY-NC, not bundled)"
        )
    methods = ["hat:greedy", "hat:collapsed", "flat_dense", "bm25"]
    doc = R.run_eval(
        locomo=[LOCOMO],
        conversations=["conv-30"],
        methods=",".join(methods),
        max_queries=12,
        out=tmp_path,
        embedder=local_embedder,
        progress=False,
    )
    check_doc_schema(doc, [s.name for s in R.with_references(R.parse_methods(methods))], 12, 10)
    data = doc["data"]["locomo_dev"]
    assert list(data["conversations"]) == ["conv-30"]
    facts = data["conversations"]["conv-30"]
    assert facts["messages"] == facts["messages_ingested"] == 369  # LoCoMo questions come after the dialogue
    assert isinstance(data["skipped_evidence"], int) and data["skipped_evidence"] >= 0
    for m in doc["methods"].values():
        assert set(m["by_category"]) <= {"1", "2", "3", "4"}
    assert doc["methods"]["hat:greedy"]["construction"]["embed_calls_per_message"] > 0
    md = (tmp_path / "results.md").read_text()
    assert all(f"| {m} |" in md for m in methods)
    assert (tmp_path / "results.png").stat().st_size > 1000
