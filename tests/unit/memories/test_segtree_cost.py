"""SegTreeMem insert cost that does not grow with a segment (issue 33), and the conversation bench's
summariser option.

Costs are counted in operations (child texts split into sentences, sentences handed to the sentence
cache), never timed. The incremental annotation is checked against the summariser run from scratch
over the same children: same annotations, node for node, on hypothesis streams.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core import SegTreeMem
from shared_core.bench import workloads as W
from shared_core.models import extractive as X
from shared_core.models.extractive import ExtractiveSummarizer
from shared_core.types import InvalidInputError


class TopicEmbedder:
    """Component ``N mod (dim - 1)`` counts the ``topicN`` tags of a text (last axis: no tag), so
    utterances of one topic keep joining one segment."""

    dim = 8

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls = 0
        self.fail_on = fail_on

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.fail_on is not None and self.calls == self.fail_on:
            raise RuntimeError("embedder down")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            tags = re.findall(r"topic(\d+)", t)
            if not tags:
                out[i, -1] = 1.0
            for g in tags:
                out[i, int(g) % (self.dim - 1)] += 1.0
        return out

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


class ScratchSummarizer(ExtractiveSummarizer):
    """The extractive summariser without the incremental path (``summarize`` overridden): every
    annotation is computed from all the children."""

    def summarize(self, texts: Sequence[str], **fields: object):  # type: ignore[override]
        return super().summarize(list(texts), **fields)


def _pair(embedder_factory=TopicEmbedder, **kw):
    a = SegTreeMem(embedder=embedder_factory(), **kw)
    b_emb = embedder_factory()
    b = SegTreeMem(
        embedder=b_emb, summarizer=ScratchSummarizer(b_emb, max_chars=kw.get("summary_chars", 600)), **kw
    )
    assert a._pooled() and not b._pooled()
    return a, b


def _texts(mem: SegTreeMem) -> dict[int, str]:
    return {i: n.text for i, n in mem._store.nodes.items()}


def _utterance(i: int, topic: int, words: int) -> str:
    body = " ".join(f"w{(i * 7 + j) % 23}" for j in range(words))
    return f"Turn {i} on topic{topic}. {body.capitalize()}!"


# --------------------------------------------------------------------------- cost
def _splits_per_insert(n: int, monkeypatch: pytest.MonkeyPatch) -> float:
    """Mean number of texts split into sentences per insert over the last 20 of ``n`` inserts, all into
    one segment (every utterance on one topic)."""
    mem = SegTreeMem(embedder=TopicEmbedder(), summary_chars=200, max_children=None)
    for i in range(n - 20):
        mem.add(_utterance(i, 1, 6))
    calls = {"n": 0}
    real = X.split_sentences

    def counting(text: str) -> list[str]:
        calls["n"] += 1
        return real(text)

    monkeypatch.setattr(X, "split_sentences", counting)
    for i in range(n - 20, n):
        mem.add(_utterance(i, 1, 6))
    monkeypatch.setattr(X, "split_sentences", real)
    assert mem.stats()["decisions"].get("merge_2", 0) >= n - 3  # one growing segment
    return calls["n"] / 20


def test_an_insert_into_a_long_segment_splits_a_bounded_number_of_texts(monkeypatch):
    short, long = _splits_per_insert(60, monkeypatch), _splits_per_insert(400, monkeypatch)
    # from scratch this is every child of the segment (about 60 and 400); incrementally, the new
    # leaf and the changed annotations on its path, whatever the segment's length
    assert long <= 6 and long <= short + 1, (short, long)


def test_an_insert_into_a_long_segment_fetches_vectors_of_new_sentences_only(monkeypatch):
    mem = SegTreeMem(embedder=TopicEmbedder(), summary_chars=200, max_children=None)
    for i in range(300):
        mem.add(_utterance(i, 2, 6))
    asked: list[int] = []
    real = ExtractiveSummarizer._vectors

    def counting(self, sentences):
        asked.append(len(sentences))
        return real(self, sentences)

    monkeypatch.setattr(ExtractiveSummarizer, "_vectors", counting)
    for i in range(300, 320):
        mem.add(_utterance(i, 2, 6))
    assert asked and max(asked) <= 8, asked  # from scratch: every sentence of the ~300 children


# --------------------------------------------------------------------------- same annotations
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), min_size=2, max_size=60),
    st.sampled_from([40, 120, 600]),
    st.sampled_from([8, None]),
    st.sampled_from([None, 64, 5]),
)
def test_incremental_annotations_equal_annotations_from_scratch(stream, chars, branching, cap):
    a, b = _pair(summary_chars=chars, branching=branching, max_children=cap)
    for i, (topic, words) in enumerate(stream):
        text = _utterance(i, topic, words) if words % 5 else f"topic{topic} again"  # repeats too
        a.add(text)
        b.add(text)
        assert _texts(a) == _texts(b)
    assert a.stats()["height"] == b.stats()["height"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 9)), min_size=4, max_size=40),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=4),
)
def test_same_annotations_through_deletions(stream, picks):
    a, b = _pair(summary_chars=120)
    for i, (topic, words) in enumerate(stream):
        a.add(_utterance(i, topic, words))
        b.add(_utterance(i, topic, words))
    for j, p in enumerate(picks):
        leaves = sorted(n.id for n in a._store.nodes.values() if n.is_leaf)
        if len(leaves) <= 1:
            break
        victim = leaves[p % len(leaves)]
        a.delete(victim)
        b.delete(victim)
        assert a._pools == {}  # nothing of the deleted text stays in a pool
        assert _texts(a) == _texts(b)
        for k in range(3):  # the rebuilt pools keep up
            t = _utterance(1000 + 10 * j + k, stream[0][0], 4)
            a.add(t)
            b.add(t)
            assert _texts(a) == _texts(b)


def test_a_failed_add_leaves_no_stale_pool():
    a, b = _pair(summary_chars=120)
    for i in range(30):
        a.add(_utterance(i, i % 2, 5))
        b.add(_utterance(i, i % 2, 5))
    a.embedder.fail_on = a.embedder.calls + 2  # fails inside the second message of the batch
    batch = [_utterance(100, 0, 5), _utterance(101, 0, 5), _utterance(102, 1, 5)]
    with pytest.raises(RuntimeError):
        a.add(batch)
    a.embedder.fail_on = None
    assert _texts(a) == _texts(b)
    for i in range(103, 120):
        a.add(_utterance(i, 0, 5))
        b.add(_utterance(i, 0, 5))
        assert _texts(a) == _texts(b)


def test_pools_are_kept_for_frontier_nodes_only_and_dropped_by_clear():
    mem = SegTreeMem(embedder=TopicEmbedder(), summary_chars=80)
    for i in range(200):
        mem.add(_utterance(i, i // 10, 4))  # a new topic every 10 turns: many segments
    assert set(mem._pools) <= set(mem.frontier())
    mem.clear()
    assert mem._pools == {}


# --------------------------------------------------------------------------- the pool itself
SENTENCES = ["Ok.", "Yes!", "The dog barked.", "Luna is a beagle.", "Why?", "", " "]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(
                st.sampled_from(["Ok.", "Yes!", "The dog barked.", "Luna is a beagle.", "Why?", "", " "]),
                max_size=5,
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([20, 40, 100, 600]),
)
def test_a_pool_summarises_as_summarize_does(children, chars):
    emb = TopicEmbedder()
    s = ExtractiveSummarizer(emb, max_chars=chars)
    pool = s.pool()
    texts: list[str] = []
    for parts, replace in children:
        text = " ".join(parts)
        if replace and texts:
            assert pool.pop() == texts.pop()
            pool.append("Something else entirely.")
            if any(t.strip() for t in [*texts, "x"]):
                pool.summary()
            pool.pop()
        pool.append(text, key=len(texts))
        texts.append(text)
        if any(t.strip() for t in texts):
            assert pool.summary()[0] == ExtractiveSummarizer(emb, max_chars=chars).summarize(texts)[0]
    assert pool.texts == texts and pool.keys == list(range(len(texts)))


def test_pool_errors():
    s = ExtractiveSummarizer(TopicEmbedder())
    with pytest.raises(InvalidInputError):
        s.pool().pop()
    pool = s.pool()
    pool.append("  ")
    with pytest.raises(InvalidInputError):
        pool.summary()


# --------------------------------------------------------------------------- bench option
def test_conversation_bench_runs_each_memory_with_its_default_summariser():
    texts, table = W.conversation_stream("random", 30)
    emb = W.ReplayEmbedder(table)
    for kind in ("segtree", "memtree", "hat", "xmemory"):
        own = W.conversation_memory(kind, emb, "default")
        assert type(own.summarizer) is type(type(own)(embedder=emb).summarizer)
        assert not isinstance(W.conversation_memory(kind, emb, "standin").summarizer, ExtractiveSummarizer)
    with pytest.raises(InvalidInputError):
        W.conversation_memory("segtree", emb, "free")
    r = W.conversation_run("segtree", "random", [40], window=5, summariser="default")
    assert r["summariser"] == "default" and {"p50_ms", "p99_ms"} <= set(r["sizes"][0]["insert"])
    doc = W.run_workloads(
        conversation=True,
        sizes=[40],
        window=5,
        memories=["segtree"],
        streams=["random"],
        summariser="standin",
        isolate=False,
    )
    assert doc["conversation"]["settings"]["summariser"] == "standin"
    assert doc["conversation"]["results"]["segtree"]["random"]["summariser"] == "standin"
    assert "stand-ins" in W.render_workloads_markdown(doc)
    with pytest.raises(InvalidInputError):
        W.run_workloads(conversation=True, sizes=[40], window=5, summariser="nope", isolate=False)


# --------------------------------------------------------------------------- max_children
def _scored_rows_per_insert(mem: SegTreeMem, first: int, n: int, monkeypatch: pytest.MonkeyPatch) -> int:
    rows: list[int] = []
    real = X._scores

    def counting(M, c):
        rows.append(len(M))
        return real(M, c)

    monkeypatch.setattr(X, "_scores", counting)
    for i in range(first, first + n):
        mem.add(_utterance(i, 1, 6))
    monkeypatch.setattr(X, "_scores", real)
    return max(rows)


def test_max_children_bounds_a_segment_and_the_sentences_scored_per_insert(monkeypatch):
    mem = SegTreeMem(
        embedder=TopicEmbedder(), summary_chars=200, max_children=16, annotation_vectors="embedded"
    )
    for i in range(400):
        mem.add(_utterance(i, 1, 6))
    nodes = mem._store.nodes.values()
    assert max(len(n.children) for n in nodes) <= 16
    assert mem.stats()["decisions"].get("split_3", 0) > 0
    leaves = [n.id for n in sorted((n for n in nodes if n.is_leaf), key=lambda n: n.span[0])]
    assert [mem._store.nodes[i].span[0] for i in leaves] == list(range(400))
    for n in nodes:  # every internal span is the contiguous union of its children's
        if n.children:
            spans = [mem._store.nodes[c].span for c in n.children]
            assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
            assert n.span == (spans[0][0], spans[-1][1])
    bounded = _scored_rows_per_insert(mem, 400, 20, monkeypatch)
    unbounded = SegTreeMem(embedder=TopicEmbedder(), summary_chars=200, max_children=None)
    for i in range(400):
        unbounded.add(_utterance(i, 1, 6))
    grows = _scored_rows_per_insert(unbounded, 400, 20, monkeypatch)
    assert bounded <= 2 * 16 * 3 < grows  # a node's children hold a few sentences each


def test_max_children_changes_nothing_below_it_and_is_saved(tmp_path):
    a = SegTreeMem(embedder=TopicEmbedder(), summary_chars=120)  # default 64; segments of 30 here
    b = SegTreeMem(embedder=TopicEmbedder(), summary_chars=120, max_children=None)
    c = SegTreeMem(embedder=TopicEmbedder(), summary_chars=120, max_children=1000)
    for i in range(80):
        for m in (a, b, c):
            m.add(_utterance(i, i // 30, 5))
    assert _texts(a) == _texts(b) == _texts(c)
    for bad in (1, 0, True, 2.5, "8"):
        with pytest.raises(InvalidInputError):
            SegTreeMem(embedder=TopicEmbedder(), max_children=bad)
    d = SegTreeMem(embedder=TopicEmbedder(), max_children=4)
    d.add([_utterance(i, 1, 3) for i in range(10)])
    d.save(tmp_path / "m")
    e = SegTreeMem.load(tmp_path / "m", embedder=TopicEmbedder())
    assert e.max_children == 4 and _texts(e) == _texts(d)
    assert SegTreeMem(embedder=TopicEmbedder()).max_children == 64
    assert SegTreeMem.stored_config({"branching": 8})["max_children"] is None  # older saves: no bound


def test_cli_conversation_summariser_option(tmp_path):
    import json

    import typer
    from typer.testing import CliRunner

    from shared_core.bench.command import bench_command

    app = typer.Typer()
    app.command("bench")(bench_command)
    app.command("noop")(lambda: None)
    args = ["bench", "--conversation", "--sizes", "40", "--window", "4", "--memories", "segtree"]
    args += ["--streams", "random", "--no-isolate"]
    res = CliRunner().invoke(app, [*args, "--summariser", "standin", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "a" / "workloads.json").read_text())
    assert doc["conversation"]["settings"]["summariser"] == "standin"
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "b" / "workloads.json").read_text())
    assert doc["conversation"]["results"]["segtree"]["random"]["summariser"] == "default"
    res = CliRunner().invoke(app, [*args, "--summariser", "free", "--out", str(tmp_path / "c")])
    assert res.exit_code != 0
