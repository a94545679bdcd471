"""The evaluation protocol of ``hiermem eval``: named splits under a data root, per-query JSON lines,
paired bootstrap intervals, the fusion weight sweep, and no absolute paths in the outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from shared_core.eval import protocol as P
from shared_core.eval import runner as R
from shared_core.eval.command import _recorded_command, eval_command
from shared_core.types import InvalidInputError
from tests.support.eval import BowEmbedder, write_longmemeval

# --------------------------------------------------------------------------- paired bootstrap


def test_paired_bootstrap_matches_a_direct_numpy_computation():
    a = [1.0, 0.5, 0.0, 1.0, 0.25, 1.0, 0.0]
    b = [0.5, 0.5, 0.0, 0.0, 0.75, 1.0, 0.5]
    r = P.paired_bootstrap(a, b, n_resamples=2000, seed=7)
    d = np.array(a) - np.array(b)  # 0.5, 0, 0, 1, -0.5, 0, -0.5
    idx = np.random.default_rng(7).integers(0, 7, size=(2000, 7))
    lo, hi = np.percentile(d[idx].mean(axis=1), [2.5, 97.5])
    assert r == {"mean": pytest.approx(0.5 / 7), "low": lo, "high": hi, "n": 7}
    assert lo < 0.5 / 7 < hi
    # the default: 10,000 resamples, seed 0, the same as passing them
    assert P.paired_bootstrap(a, b) == P.paired_bootstrap(a, b, n_resamples=10_000, seed=0)
    assert (P.BOOTSTRAP_RESAMPLES, P.BOOTSTRAP_SEED, P.BOOTSTRAP_LEVEL) == (10_000, 0, 0.95)


def test_paired_bootstrap_degenerate_cases_and_errors():
    # a constant difference has a zero-width interval at that difference
    r = P.paired_bootstrap([0.75, 0.5, 1.0], [0.5, 0.25, 0.75], n_resamples=100)
    assert (r["low"], r["high"], r["mean"]) == pytest.approx((0.25, 0.25, 0.25))
    assert P.paired_bootstrap([], []) is None
    with pytest.raises(InvalidInputError):
        P.paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(InvalidInputError):
        P.paired_bootstrap([1.0], [1.0], n_resamples=0)
    with pytest.raises(InvalidInputError):
        P.paired_bootstrap([1.0], [1.0], level=1.0)


def test_paired_values_match_questions_and_skip_undefined():
    a = [
        {"dataset": "x", "conversation": "c", "query_id": "q1", "m": 1.0},
        {"dataset": "x", "conversation": "c", "query_id": "q2", "m": None},
        {"dataset": "y", "conversation": "c", "query_id": "q1", "m": 0.5},
        {"dataset": "y", "conversation": "c", "query_id": "q3", "m": 0.25},
    ]
    b = [
        {"dataset": "y", "conversation": "c", "query_id": "q3", "m": math.nan},
        {"dataset": "y", "conversation": "c", "query_id": "q1", "m": 0.0},
        {"dataset": "x", "conversation": "c", "query_id": "q2", "m": 1.0},
        {"dataset": "x", "conversation": "c", "query_id": "q1", "m": 0.75},
    ]
    x, y = P.paired_values(a, b, "m")
    assert x.tolist() == [1.0, 0.5] and y.tolist() == [0.75, 0.0]
    x, y = P.paired_values(a, b, "m", dataset="y")
    assert x.tolist() == [0.5] and y.tolist() == [0.0]


def test_intervals_in_the_comparison_follow_the_rows():
    """compare_methods with per-query rows: each of the three numbers gets the bootstrap of its pairs."""

    def agg(kind: str, build: str, v: float) -> dict:
        return {"build": build, "kind": kind, "overall": {"evidence_recall": v}, "by_dataset": {}}

    per_q = {
        "seg:top_down": [1.0, 1.0, 0.0, 1.0],
        "seg:collapsed": [1.0, 0.0, 0.0, 1.0],
        "fusion": [0.0, 0.0, 1.0, 1.0],
        "bm25": [1.0, 0.0, 0.0, 0.0],
    }
    methods = {
        n: agg(n.split(":")[0] if ":" in n else n, n.split(":")[0], float(np.mean(v)))
        for n, v in per_q.items()
    }
    rows = {
        n: [
            {"dataset": "d", "conversation": "c", "query_id": i, "evidence_recall": x}
            for i, x in enumerate(v)
        ]
        for n, v in per_q.items()
    }
    facts = {"seg": {"default_policy": "top_down", "relevance": "hybrid", "hybrid_weight": 0.5}}
    comp = R.compare_methods(methods, facts, ["evidence_recall"], rows, n_resamples=300, seed=3)
    c = comp["memories"]["seg"]["overall"]["evidence_recall"]
    # best flat: fusion 0.5 > bm25 0.25; default 0.75, collapsed 0.5
    assert (c["margin_over_best_flat"], c["tree_share"], c["corpus_share"]) == pytest.approx(
        (0.25, 0.25, 0.0)
    )

    def direct(x: list[float], y: list[float]) -> list[float]:
        d = np.array(x) - np.array(y)
        idx = np.random.default_rng(3).integers(0, len(d), size=(300, len(d)))
        return list(np.percentile(d[idx].mean(axis=1), [2.5, 97.5]))

    assert c["ci95"]["margin_over_best_flat"] == pytest.approx(direct(per_q["seg:top_down"], per_q["fusion"]))
    assert c["ci95"]["tree_share"] == pytest.approx(direct(per_q["seg:top_down"], per_q["seg:collapsed"]))
    assert c["ci95"]["corpus_share"] == pytest.approx(direct(per_q["seg:collapsed"], per_q["fusion"]))
    assert comp["bootstrap"]["unit"].startswith("question")


# --------------------------------------------------------------------------- fusion weights


def test_fusion_weight_option_and_alias():
    assert R.parse_methods("fusion[weight=0.3]")[0].name == "fusion[hybrid_weight=0.3]"
    assert R.parse_methods("fusion[weight=0.5]")[0].name == "fusion"
    with pytest.raises(InvalidInputError):
        R.parse_methods("fusion[weight=0.3,hybrid_weight=0.3]")
    with pytest.raises(InvalidInputError):
        R.parse_methods("fusion[weight=2]")


# --------------------------------------------------------------------------- splits


def _tiny_locomo(sample_id: str) -> dict:
    turns = [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "I grow tomatoes in my garden."},
        {"speaker": "Bob", "dia_id": "D1:2", "text": "My brother moved to Oslo last year."},
        {"speaker": "Ann", "dia_id": "D1:3", "text": "We baked a lemon cake for the party."},
    ]
    return {
        "sample_id": sample_id,
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bob",
            "session_1": turns,
            "session_1_date_time": "1:56 pm on 8 May, 2023",
        },
        "qa": [
            {
                "question": "Where did Bob's brother move?",
                "answer": "Oslo",
                "evidence": ["D1:2"],
                "category": 4,
            },
            {
                "question": "What did they bake?",
                "answer": "a lemon cake",
                "evidence": ["D1:3"],
                "category": 4,
            },
            {"question": "What does Ann grow?", "answer": "tomatoes", "evidence": ["D1:1"], "category": 1},
        ],
    }


def _tiny_realmem(person: str) -> dict:
    s1 = {
        "session_identifier": "s1",
        "session_uuid": "u1",
        "current_time": "2025-12-27 (Saturday)",
        "dialogue_turns": [
            {"speaker": "User", "content": "I started learning the cello this week."},
            {"speaker": "Assistant", "content": "Great, the cello is a lovely instrument."},
        ],
    }
    s2 = {
        "session_identifier": "s2",
        "session_uuid": "u2",
        "current_time": "2025-12-28 (Sunday)",
        "dialogue_turns": [
            {
                "speaker": "User",
                "content": "Which instrument am I learning?",
                "is_query": True,
                "query_id": "r1",
            },
            {"speaker": "Assistant", "content": "The cello.", "memory_session_uuids": ["u1"]},
        ],
    }
    return {"_metadata": {"person_name": person}, "dialogues": [s1, s2]}


def _data_root(root: Path, split: str) -> Path:
    (root / "locomo").mkdir(parents=True)
    (root / "realmem").mkdir()
    (root / "longmemeval").mkdir()
    for kind, rels in P.SPLITS[split].items():
        for i, rel in enumerate(rels):
            if kind == "longmemeval":
                write_longmemeval(root / rel)
                continue
            data = (
                [_tiny_locomo(f"conv-{i}")]
                if kind == "locomo"
                else _tiny_realmem(Path(rel).stem.split("_")[0])
            )
            (root / rel).write_text(json.dumps(data), encoding="utf-8")
    return root


def test_splits_name_the_shared_files():
    assert P.SPLITS["dev"] == {
        "locomo": ("locomo/locomo_dev.json",),
        "realmem": ("realmem/Kenta_Tanaka_dialogues_256k.json",),
        "longmemeval": ("longmemeval/longmemeval_s_dev.json",),
    }
    assert P.SPLITS["validate"]["locomo"] == ("locomo/locomo_validate.json",)
    assert P.SPLITS["validate"]["longmemeval"] == ("longmemeval/longmemeval_s_validate.json",)
    assert [Path(p).name.split("_")[0] for p in P.SPLITS["validate"]["realmem"]] == ["Pak", "Oliver"]


def test_resolve_split_root_env_and_missing_files(tmp_path, monkeypatch):
    root = _data_root(tmp_path / "data", "validate")
    got = P.resolve_split("validate", root)
    assert got["locomo"] == [root / "locomo" / "locomo_validate.json"]
    assert got["longmemeval"] == [root / "longmemeval" / "longmemeval_s_validate.json"]
    assert [p.name for p in got["realmem"]] == [
        "Pak_Budi_dialogues_256k.json",
        "Oliver_Smith_dialogues_256k.json",
    ]
    monkeypatch.setenv("HIERMEM_DATA", str(root))
    assert P.default_data_root() == root and P.resolve_split("validate") == got
    monkeypatch.delenv("HIERMEM_DATA")
    assert P.default_data_root() == Path("..") / "shared" / "data"
    with pytest.raises(P.SplitDataMissingError, match="locomo/locomo_dev.json") as e:
        P.resolve_split("dev", root)
    assert isinstance(e.value, InvalidInputError) and "--data" in str(e.value)
    (root / "realmem" / "Oliver_Smith_dialogues_256k.json").unlink()
    with pytest.raises(P.SplitDataMissingError, match="Oliver_Smith") as e:
        P.resolve_split("validate", root)
    assert "Pak_Budi" not in str(e.value) and "longmemeval" not in str(e.value).split("under")[0]
    (root / "longmemeval" / "longmemeval_s_validate.json").unlink()
    with pytest.raises(P.SplitDataMissingError, match="longmemeval/longmemeval_s_validate.json"):
        P.resolve_split("validate", root)
    # the kinds asked for only: LoCoMo alone resolves without the others
    assert P.resolve_split("validate", root, kinds=["locomo"]) == {"locomo": got["locomo"]}
    with pytest.raises(InvalidInputError, match="Unknown input kind"):
        P.resolve_split("validate", root, kinds=["locomo", "other"])
    with pytest.raises(InvalidInputError, match="dev, validate"):
        P.resolve_split("test", root)


def test_cli_split_missing_is_a_clear_error(tmp_path):
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("other")(lambda: None)
    res = CliRunner().invoke(
        app, ["eval", "--split", "dev", "--data", str(tmp_path), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "Split 'dev': missing locomo/locomo_dev.json" in text


def test_recorded_command_keeps_no_absolute_path():
    cmd = _recorded_command(
        ["--split", "validate", "--data=/srv/x/data", "--out", "/tmp/run/evalp-val", "--k", "5"]
    )
    assert cmd == "hiermem eval --split validate --data=data --out evalp-val --k 5"


def test_split_run_writes_rows_sweep_and_no_absolute_paths(tmp_path):
    root = _data_root(tmp_path / "data", "dev")
    out = tmp_path / "out"
    doc = R.run_eval(
        split="dev",
        data_root=root,
        methods="bm25,fusion,fusion[weight=0.2],fusion[weight=0.8]",
        k=1,
        out=out,
        progress=False,
        embedder=BowEmbedder(),
        n_resamples=200,
    )
    assert doc["config"]["split"] == "dev"
    assert doc["config"]["split_files"] == [
        "locomo/locomo_dev.json",
        "realmem/Kenta_Tanaka_dialogues_256k.json",
        "longmemeval/longmemeval_s_dev.json",
    ]
    assert [d["file"] for d in doc["config"]["inputs"]] == [
        "locomo_dev.json",
        "Kenta_Tanaka_dialogues_256k.json",
        "longmemeval_s_dev.json",
    ]
    for name in ("results.json", "results.md", "queries.jsonl"):
        text = (out / name).read_text(encoding="utf-8")
        assert str(tmp_path) not in text and str(root) not in text
    # one line per question and method: 3 LoCoMo + 1 RealMem + 3 LongMemEval questions, 4 methods and
    # the sessions-as-documents baseline a run with LongMemEval data adds
    lines = [json.loads(x) for x in (out / "queries.jsonl").read_text().splitlines()]
    assert len(lines) == 7 * 5
    first = lines[0]
    assert (
        first["dataset"],
        first["conversation"],
        first["query_id"],
        first["category"],
        first["method"],
    ) == (
        "locomo_dev",
        "conv-0",
        "conv-0:q0",
        4,
        "bm25",
    )
    assert {"evidence_recall", "span_recall", "answer_token_recall", "returned_tokens"} <= set(first)
    # the weight sweep: each weight's pooled value, the best one (first in order on a tie)
    fw = doc["comparison"]["fusion_weights"]["overall"]["evidence_recall"]
    vals = {
        w: doc["methods"][n]["overall"]["evidence_recall"]
        for w, n in (
            ("0.5", "fusion"),
            ("0.2", "fusion[hybrid_weight=0.2]"),
            ("0.8", "fusion[hybrid_weight=0.8]"),
        )
    }
    assert fw["values"] == vals
    best = max(vals.values())
    assert fw["best_value"] == best and f"{fw['best_weight']:g}" == next(
        w for w, v in vals.items() if v == best
    )
    md = (out / "results.md").read_text()
    assert "Flat fusion weight sweep (best weight on the dev split" in md
    assert (
        "split dev (locomo/locomo_dev.json, realmem/Kenta_Tanaka_dialogues_256k.json, "
        "longmemeval/longmemeval_s_dev.json)" in md
    )
