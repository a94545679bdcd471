"""``hiermem bench --bulk``: the workloads it reads, its table, its errors (the timed run itself loads the
embedded model: it is exercised by ``benchmarks/results/ingest_bulk``, not here)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from shared_core.bench.bulk import bulk_datasets, bulk_markdown
from shared_core.bench.command import bench_command
from shared_core.types import InvalidInputError
from tests.support.eval import write_longmemeval


def _locomo(path, sample_id: str, n: int):
    turns = [{"speaker": "Ann", "dia_id": f"D1:{i + 1}", "text": f"Turn {sample_id} {i}."} for i in range(n)]
    conv = {"speaker_a": "Ann", "speaker_b": "Bob", "session_1": turns}
    conv["session_1_date_time"] = "1:56 pm on 8 May, 2023"
    path.write_text(json.dumps([{"sample_id": sample_id, "conversation": conv, "qa": []}]))
    return path


def test_datasets_take_the_first_haystack_and_turns_across_files(tmp_path):
    lme = write_longmemeval(tmp_path / "lme.json")
    a, b = _locomo(tmp_path / "a.json", "a", 4), _locomo(tmp_path / "b.json", "b", 5)
    (n1, haystack), (n2, turns) = bulk_datasets(lme, [a, b], 7)
    first = json.loads(lme.read_text())[0]
    assert n1 == f"longmemeval {first['question_id']}"
    assert len(haystack) == sum(1 for s in first["haystack_sessions"] for t in s if t["content"].strip())
    assert n2 == "locomo 7 turns" and [m.text for m in turns] == [f"Turn a {i}." for i in range(4)] + [
        f"Turn b {i}." for i in range(3)
    ]
    assert bulk_datasets(None, [a], 100)[0][0] == "locomo 4 turns"  # as many as the files hold


@pytest.mark.parametrize("turns", [0, -1, True, 2.5])
def test_datasets_refuse_bad_turns(tmp_path, turns):
    with pytest.raises(InvalidInputError, match="turns"):
        bulk_datasets(None, [_locomo(tmp_path / "a.json", "a", 2)], turns)


def test_datasets_need_an_input():
    with pytest.raises(InvalidInputError, match="LongMemEval"):
        bulk_datasets(None, [], 10)


def test_markdown_has_a_row_per_memory_and_a_column_per_workload():
    r = {"ratio": 1.5, "embedded_texts": 12}
    doc = {
        "datasets": {
            "lme q": {"messages": 3, "results": {"hat": r, "segtree": {**r, "ratio": 3.25}}},
            "locomo 5 turns": {"messages": 5, "results": {"hat": {**r, "ratio": None}}},
        }
    }
    lines = bulk_markdown(doc).splitlines()
    assert "| lme q (3 messages) | locomo 5 turns (5 messages) |" in lines[2]
    assert lines[4] == "| hat | 1.50x (12) | — |" and lines[5] == "| segtree | 3.25x (12) | — |"


def test_cli_bulk_without_data_exits_2(tmp_path, monkeypatch):
    app = typer.Typer()
    app.command("bench")(bench_command)
    app.command("noop")(lambda: None)
    monkeypatch.setenv("HIERMEM_DATA", str(tmp_path / "none"))
    res = CliRunner().invoke(app, ["bench", "--bulk", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    assert not (tmp_path / "x" / "bulk.json").exists()
