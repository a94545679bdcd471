"""``hiermem bench``: stub models, synthetic streams, flat-search floor, the overhead run, reports, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from shared_core.bench import core as B
from shared_core.bench.command import bench_command
from shared_core.types import InvalidInputError


def test_topical_stream_is_deterministic_unit_and_topical():
    texts, table = B.topical_stream(300, seed=3)
    texts2, table2 = B.topical_stream(300, seed=3)
    assert texts == [f"message {i}" for i in range(300)] == texts2
    X = np.stack([table[t] for t in texts])
    np.testing.assert_array_equal(X, np.stack([table2[t] for t in texts]))
    assert X.dtype == np.float32 and X.shape == (300, B.DIM)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-5)
    # neighbours in the stream share a topic far more often than random pairs
    adjacent = float(np.mean(np.sum(X[1:] * X[:-1], axis=1)))
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, 300, 500), rng.integers(0, 300, 500)
    assert adjacent > float(np.mean(np.sum(X[i] * X[j], axis=1))) + 0.1


def test_clustered_stream_similarity_levels():
    texts, table, _ = B.clustered_stream(2000, seed=0)
    X = np.stack([table[t] for t in texts])
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-5)
    top = np.sort(X[:200] @ X.T, axis=1)[:, -2]  # nearest other message
    assert float(np.median(top)) > 0.8  # same subtopic, cosine about 0.92


def test_replay_embedder_and_stub_summarisers():
    table = {"a": np.eye(4, dtype=np.float32)[0], "b": np.eye(4, dtype=np.float32)[1]}
    emb = B.ReplayEmbedder(table, dim=4)
    np.testing.assert_array_equal(emb.embed(["a", "b"]), np.eye(4, dtype=np.float32)[:2])
    u1, u2 = emb.embed(["unknown"])[0], emb.embed(["unknown"])[0]
    np.testing.assert_array_equal(u1, u2)  # deterministic stand-in
    assert abs(np.linalg.norm(u1) - 1) < 1e-5 and not np.allclose(u1, emb.embed(["other"])[0])
    fixed = B.ReplayEmbedder({}, dim=4, unknown="fixed")
    np.testing.assert_array_equal(fixed.embed(["x"])[0], fixed.embed(["y"])[0])
    with pytest.raises(InvalidInputError):
        B.ReplayEmbedder({}, unknown="zero")

    s = B.SpanEndsSummarizer(emb)
    key, usage = s.summarize(["a", "middle", "b"])
    assert key == "summary 1" and usage.llm_calls == 0
    np.testing.assert_allclose(emb.embed([key])[0], np.array([1, 1, 0, 0]) / np.sqrt(2), rtol=1e-6)
    key2, _ = s.summarize([key, "b"])  # summaries of summaries use the registered vectors
    v = np.array([1, 1 + np.sqrt(2), 0, 0])
    np.testing.assert_allclose(emb.embed([key2])[0], v / np.linalg.norm(v), rtol=1e-5)
    assert B.FirstTextSummarizer().summarize(["old", "new"])[0] == "old"
    h = B.HashSummarizer()
    assert h.summarize(["x", "y"])[0] != h.summarize(["x", "z"])[0] and h.calls == 2


def test_span_ends_summarizer_keeps_only_the_recently_used_summaries():
    table = {t: v for t, v in zip("abcd", np.eye(4, dtype=np.float32))}
    s = B.SpanEndsSummarizer(B.ReplayEmbedder(table, dim=4), keep=2)
    k1, _ = s.summarize(["a", "b"])
    k2, _ = s.summarize(["c", "d"])
    k3, _ = s.summarize([k1, "c"])  # uses k1: k2 is now the least recently used
    assert k1 in table and k3 in table and k2 not in table
    assert set("abcd") <= set(table)  # the stream's own vectors are never dropped
    assert len([t for t in table if t.startswith("summary")]) == 2


def test_flat_search_timings_find_the_true_top_k():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 16)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    t = B.flat_search_timings(X, X[:5], k=10)
    for m in ("faiss", "numpy"):
        for clock in ("wall", "cpu"):
            s = t[m][clock]
            assert 0 <= s["median_ms"] <= s["p90_ms"] + 1e-12 and s["mean_ms"] >= 0


def test_bench_memory_small_run_schema_and_counts():
    r = B.bench_memory("memtree", [60, 120], window=20, queries=4, seed=1)
    assert r["kind"] == "memtree" and r["policies"] == ["collapsed", "top_down", "traversal"]
    assert [s["leaves"] for s in r["sizes"]] == [60, 120]
    for s in r["sizes"]:
        assert s["insert"]["measured"] == 20
        assert s["nodes"] >= s["leaves"]
        for p in r["policies"]:
            assert s["retrieve"][p]["cpu"]["median_ms"] >= 0
        assert s["flat"]["faiss"]["wall"]["median_ms"] > 0
    assert r["peak_rss_bytes"] > 0


def test_memory_profile_grows_with_leaves():
    p = B.memory_profile("hat", [100, 400])
    a, b = p["sizes"]
    assert 0 < a["traced_bytes"] < b["traced_bytes"] <= b["traced_peak_bytes"]


@pytest.mark.parametrize("sizes", [[], [5], ["x"]])
def test_bad_sizes(sizes):
    with pytest.raises(InvalidInputError):
        B.run_bench(sizes, memories=["hat"], throughput_turns=0, isolate=False)


def test_unknown_memory():
    with pytest.raises(InvalidInputError, match="Unknown memory"):
        B.run_bench([100], memories=["btree"], throughput_turns=0, isolate=False)


def test_run_bench_through_the_cli(tmp_path):
    app = typer.Typer()
    app.command("bench")(bench_command)
    app.command("noop")(lambda: None)
    out = tmp_path / "b"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--sizes",
            "40,80",
            "--memories",
            "segtree,hat",
            "--queries",
            "3",
            "--window",
            "10",
            "--throughput-turns",
            "3",
            "--no-isolate",
            "--trace-max",
            "40",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "bench.json").read_text())
    assert doc["schema"] == B.BENCH_SCHEMA
    assert doc["config"]["sizes"] == [40, 80] and doc["config"]["memories"] == ["segtree", "hat"]
    m = doc["machine"]["start"]
    assert m["logical_cpus"] >= 1 and len(m["load_average_1_5_15"]) == 3 and m["memory_gib"] > 0
    for kind in ("segtree", "hat"):
        r = doc["memories"][kind]
        rows = r["sizes"]
        g = r["growth"]["insert_cpu"]["80"]
        assert g == pytest.approx(
            rows[1]["insert"]["cpu"]["median_ms"] / rows[0]["insert"]["cpu"]["median_ms"]
        )
        fa = rows[1]["flat"]["faiss"]["cpu"]["median_ms"]
        for p in r["policies"]:
            want = rows[1]["retrieve"][p]["cpu"]["median_ms"] / fa if fa > 0 else None
            assert rows[1]["retrieve_over_faiss_cpu"][p] == pytest.approx(want)
        assert [s["leaves"] for s in r["memory_profile"]["sizes"]] == [40]
    tp = doc["throughput"]
    assert tp["turns"] == 3 and set(tp["results"]) == {"segtree", "hat", "flat_dense"}
    for v in tp["results"].values():
        assert v["messages_per_second"] > 0 and v["embed_calls_per_message"] > 0
    flat_cpu = tp["results"]["flat_dense"]["cpu_seconds"]
    for name, v in tp["results"].items():
        assert v["cpu_ratio_to_embedding"] == pytest.approx(v["cpu_seconds"] / flat_cpu), name
    assert list(tp["results"])[-1] == "flat_dense"
    md = (out / "bench.md").read_text()
    assert "| segtree:top_down | 80 |" in md and "Embedded-default throughput" in md
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
