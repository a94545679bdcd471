"""``hiermem bench --conversation`` / ``--ingest``: document shape, ratios, counts, option errors, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from shared_core.bench import workloads as W
from shared_core.bench.command import bench_command
from shared_core.search.lexical import tokenize
from shared_core.types import InvalidInputError

KINDS = ["segtree", "memtree", "hat", "xmemory"]
TIMINGS = ("turn", "add", "query")
VOCAB = set(W.synthetic_vocabulary())


@pytest.fixture(scope="module")
def conversation_doc():
    return W.run_workloads(conversation=True, sizes=[60, 120], window=5, isolate=False)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("bench")(bench_command)
    app.command("noop")(lambda: None)
    return app


def test_streams_carry_words_and_unit_vectors():
    vocab = W.synthetic_vocabulary()
    assert len(vocab) == len(set(vocab)) == 2000 and vocab == W.synthetic_vocabulary()
    for stream in W.STREAMS:
        texts, table = W.conversation_stream(stream, 50, seed=2)
        assert texts == W.conversation_stream(stream, 50, seed=2)[0]
        name = f"{W.SPEAKER}: " if stream == "speaker" else ""
        assert all(
            t.startswith(f"{name}message {i} ") and len(t.split()) == 10 + bool(name)
            for i, t in enumerate(texts)
        )
        assert all(w in vocab for t in texts for w in t.split()[2 + bool(name) :])
        X = np.stack([table[t] for t in texts])
        np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-5)
    with pytest.raises(InvalidInputError):
        W.conversation_stream("zigzag", 5)


@pytest.mark.parametrize("stream", W.STREAMS)
def test_speaker_stream_shares_a_word_with_every_query(stream):
    """The speaker stream: every message and every query hold the speaker's name (a BM25 term of every
    text); the other streams share "message" across every message, but no query holds it."""
    texts, table = W.conversation_stream(stream, 300, seed=3)
    rng = np.random.default_rng(4)
    queries = [W.conversation_query(rng, table, texts, 300, str(i)) for i in range(40)]
    assert all(q in table for q in queries) and len(set(queries)) == 40
    tok_texts, tok_queries = tokenize(texts), tokenize(queries)
    shared = set.intersection(*map(set, tok_texts))
    held = shared & set.intersection(*map(set, tok_queries))
    assert held == ({tokenize([W.SPEAKER])[0][0]} if stream == "speaker" else set())
    assert tokenize(["message"])[0][0] in shared
    rank = {w: i for i, w in enumerate(W.synthetic_vocabulary())}
    for q in queries:  # speaker: the name and 3 words; else 4 words of a stored message and 2 of another
        words = q.split()[2:]
        if stream != "speaker":
            assert len(words) == 6 and all(w in VOCAB for w in words)
            continue
        assert words[0] == W.SPEAKER and len(words) == 4
        rarest = {tuple(sorted(set(t.split()[3:]), key=lambda w: (-rank[w], w))[:3]) for t in texts}
        assert tuple(words[1:]) in rarest


def test_memories_keep_their_default_relevance_and_policy():
    texts, table = W.conversation_stream("random", 30)
    emb = W.ReplayEmbedder(table)
    for kind in KINDS:
        mem = W.conversation_memory(kind, emb)
        assert mem.relevance_kind == "hybrid" and mem.default_policy == type(mem)(embedder=emb).default_policy
    s = W.WordySpanSummarizer(emb)
    key, _ = s.summarize([texts[0], texts[1], texts[2]])
    assert key.split()[2:] == texts[0].split()[2:] + texts[2].split()[2:] and key in table


def test_conversation_document(conversation_doc):
    doc = conversation_doc
    assert doc["schema"] == W.WORKLOADS_SCHEMA and "ingest" not in doc
    assert doc["machine"]["start"]["logical_cpus"] >= 1 and doc["seconds"] > 0
    conv = doc["conversation"]
    st = conv["settings"]
    assert (
        st["sizes"] == [60, 120]
        and st["window"] == 5
        and st["k"] == 10
        and st["streams"] == ["topical", "random", "speaker"]
    )
    assert conv["not_run"] == [] and list(conv["results"]) == KINDS
    for kind in KINDS:
        assert list(conv["results"][kind]) == ["topical", "random", "speaker"]
        for stream, r in conv["results"][kind].items():
            assert r["memory"] == kind and r["stream"] == stream and r["relevance"] == "hybrid"
            assert r["peak_rss_bytes"] > 0
            assert [s["leaves"] for s in r["sizes"]] == [60, 120]
            for s in r["sizes"]:
                assert s["turns"] == 5 and s["adds_grown_by_one"] == 5
                assert s["leaves_after"] == s["leaves"] + 5 and s["nodes"] >= s["leaves_after"]
                assert 0 < s["mean_hits"] <= 10
                ins = s["insert"]
                assert set(ins) == {"p50_ms", "p99_ms", "mean_ms"} and 0 <= ins["p50_ms"] <= ins["p99_ms"]
                for side in ("memory", "flat"):
                    for t in TIMINGS:
                        v = s[side][t]
                        assert set(v) == {"p50_ms", "p99_ms", "mean_ms"} and 0 <= v["p50_ms"] <= v["p99_ms"]
                for t in TIMINGS:
                    flat = s["flat"][t]["p50_ms"]
                    want = s["memory"][t]["p50_ms"] / flat if flat > 0 else None
                    assert s["ratio_p50"][t] == pytest.approx(want), (kind, stream, t)
                    flat = s["flat"][t]["p99_ms"]
                    want = s["memory"][t]["p99_ms"] / flat if flat > 0 else None
                    assert s["ratio_p99"][t] == pytest.approx(want), (kind, stream, t)


def test_conversation_markdown_and_files(conversation_doc, tmp_path):
    files = W.write_workloads(conversation_doc, tmp_path)
    assert files == {"json": "workloads.json", "markdown": "workloads.md"}
    again = json.loads((tmp_path / "workloads.json").read_text())
    assert again["conversation"]["results"]["hat"]["random"]["sizes"][1]["leaves"] == 120
    md = (tmp_path / "workloads.md").read_text()
    assert "## A conversation at scale" in md and "| xmemory | random | 120 |" in md
    assert "| segtree | speaker | 120 |" in md
    assert len(W.conversation_rows(conversation_doc)) == 4 * 3 * 2


def test_ingest_document():
    doc = W.run_workloads(
        ingest=True, memories=["hat", "segtree"], turns=5, modes=["default", "embedded"], isolate=False
    )
    ing = doc["ingest"]
    assert "conversation" not in doc and ing["settings"]["torch_threads"] == 1
    ds = ing["datasets"]["realmem excerpt"]
    assert list(ing["datasets"]) == ["realmem excerpt"] and ds["turns"] == 5 and ds["mean_chars"] > 0
    assert list(ds["results"]) == ["hat", "segtree"]
    assert list(ds["results"]["hat"]) == ["composed", "embedded"]
    assert ds["results"]["hat"]["composed"]["default"] is True
    assert {m: v["default"] for m, v in ds["results"]["segtree"].items()} == {
        "composed": True,  # the default, then the other mode
        "embedded": False,
    }
    for by_mode in ds["results"].values():
        for v in by_mode.values():
            assert (
                v["leaves"] == 5 and v["embedded_texts_per_message"] >= 1 and v["embed_calls_per_message"] > 0
            )
            assert v["ratio"] == pytest.approx(v["cpu_ms_per_message"] / v["embed_cpu_ms_per_message"])
    assert "| realmem excerpt | segtree | composed * |" in W.render_workloads_markdown(doc)


@pytest.mark.parametrize(
    "kw",
    [
        {"conversation": True, "sizes": [5]},
        {"conversation": True, "sizes": [0, 100]},
        {"conversation": True, "sizes": [40, 60], "window": 50},
        {"conversation": True, "sizes": [40], "window": 0},
        {"conversation": True, "sizes": [40], "memories": ["btree"]},
        {"conversation": True, "sizes": [40], "streams": ["sideways"]},
        {"conversation": True, "sizes": [40], "memories": ["hat"], "size_caps": {"memtree": 10}},
        {"ingest": True, "turns": 0},
        {"ingest": True, "memories": ["btree"]},
        {"ingest": True, "modes": ["mixed"]},
        {},
    ],
)
def test_bad_options_raise_before_running(kw):
    with pytest.raises(InvalidInputError):
        W.run_workloads(isolate=False, **kw)


def test_cli_conversation(tmp_path):
    out = tmp_path / "w"
    args = ["bench", "--conversation", "--sizes", "40,80", "--window", "4", "--memories", "hat,segtree"]
    res = CliRunner().invoke(_app(), [*args, "--streams", "random", "--no-isolate", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "workloads.json").read_text())
    assert doc["conversation"]["settings"]["window"] == 4 and list(doc["conversation"]["results"]) == [
        "hat",
        "segtree",
    ]
    assert (out / "workloads.md").exists() and not (out / "bench.json").exists()
    assert "p50 / flat" in res.output and "p99 / flat" in res.output


@pytest.mark.parametrize(
    "args",
    [
        ["--conversation", "--memories", "btree"],
        ["--conversation", "--sizes", "0"],
        ["--conversation", "--sizes", "x"],
        ["--conversation", "--window", "0"],
        ["--ingest", "--turns", "0"],
        ["--ingest", "--ingest-modes", "mixed"],
    ],
)
def test_cli_bad_options_exit(args, tmp_path):
    res = CliRunner().invoke(_app(), ["bench", *args, "--no-isolate", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    assert not (tmp_path / "x" / "workloads.json").exists()
