"""``hiermem eval`` over worker processes, with the on-disk embedding cache and progress: the report is the
same for any number of workers and with or without the cache, a re-run embeds nothing, each distinct text is
embedded once per question, the workers' thread pools are pinned, and nothing is shown unless asked."""

from __future__ import annotations

import io
import json
import re
from collections import Counter

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from shared_core import Message
from shared_core.eval.data import Conversation
from shared_core.eval.embed_cache import CachingEmbedder, text_key
from shared_core.eval.embed_store import PROBE_TEXT
from shared_core.eval.parallel import longest_first
from shared_core.eval.progress_bars import question_progress, terminal_progress
from shared_core.eval.runner import run_eval
from shared_core.types import InvalidInputError
from tests.support.eval import (
    BowEmbedder,
    LockedEmbedder,
    OneThreadEmbedder,
    SpyEmbedder,
    tiny_longmemeval,
    write_longmemeval,
)

METHODS = "segtree,hat,xmemory,baselines"
_TIMING = re.compile(r"(seconds|latency|_ms|embed_cache)")


def _stable(x):
    """A results document without what depends on the clock or on the cache (timings, cache counts)."""
    if isinstance(x, dict):
        return {k: _stable(v) for k, v in x.items() if not _TIMING.search(str(k))}
    if isinstance(x, list):
        return [_stable(v) for v in x]
    return x


def _report(doc):
    return json.dumps(_stable({k: doc[k] for k in ("methods", "comparison", "data")}), sort_keys=True)


def _lme(tmp_path, n=4):
    items = tiny_longmemeval()
    extra = json.loads(json.dumps(items[0]))  # a fourth question: a second user question of another id
    extra["question_id"], extra["question"] = "q_user_2", "Who dug up the tomato bed?"
    return write_longmemeval(tmp_path / "lme.json", [*items, extra][:n])


def test_two_workers_give_the_report_of_one(tmp_path):
    path = _lme(tmp_path)
    one = run_eval(longmemeval=[path], methods=METHODS, k=5, embedder=BowEmbedder(), workers=1)
    two = run_eval(longmemeval=[path], methods=METHODS, k=5, embedder=BowEmbedder(), workers=2)
    assert list(two["data"]["lme"]["conversations"]) == ["q_user", "q_multi", "q_user_abs", "q_user_2"]
    assert _report(one) == _report(two)
    assert one["methods"]["segtree:collapsed"]["overall"]["n_queries"] == 3  # abstention apart


def test_workers_are_handed_the_longest_conversations_first_ties_in_input_order():
    def conv(cid, n):
        return ("lme", Conversation(cid, [Message(f"m{i}") for i in range(n)], []))

    items = [conv("a", 3), conv("b", 9), conv("c", 3), conv("d", 0), conv("e", 9)]
    assert longest_first(items) == [1, 4, 0, 2, 3]
    assert longest_first([]) == []


def test_worker_processes_pin_their_thread_pools_to_one_thread(tmp_path):
    path = _lme(tmp_path, 2)
    doc = run_eval(longmemeval=[path], methods="hat,flat_dense", k=5, embedder=OneThreadEmbedder(), workers=2)
    assert sorted(doc["data"]["lme"]["conversations"]) == ["q_multi", "q_user"]


def test_an_embedder_that_cannot_reach_a_worker_is_a_clear_error(tmp_path):
    path = _lme(tmp_path, 2)
    with pytest.raises(InvalidInputError, match=r"LockedEmbedder cannot be pickled.*--workers 1"):
        run_eval(longmemeval=[path], methods="flat_dense", embedder=LockedEmbedder(), workers=2)
    with pytest.raises(InvalidInputError, match="workers must be a positive integer"):
        run_eval(longmemeval=[path], methods="flat_dense", embedder=BowEmbedder(), workers=0)


def test_each_text_is_embedded_once_per_question_and_never_again_from_the_disk_cache(tmp_path):
    path = _lme(tmp_path)
    cache = tmp_path / "cache"
    first: dict[str, dict] = {}
    for qid in ("q_user", "q_multi", "q_user_abs", "q_user_2"):
        spy = SpyEmbedder()
        doc = run_eval(
            longmemeval=[path], methods=METHODS, k=5, embedder=spy, conversations=[qid], cache_dir=cache
        )
        texts = [t for t in spy.texts if t != PROBE_TEXT]
        twice = [t for t, n in Counter(texts).items() if n > 1]
        assert twice == [], f"{qid}: embedded more than once: {twice[:3]}"
        counts = doc["data"]["lme"]["conversations"][qid]["embed_cache"]
        assert counts["misses"] == len(texts) > 0 and counts["from_disk"] == 0
        first[qid] = doc
    spy = SpyEmbedder()
    again = run_eval(longmemeval=[path], methods=METHODS, k=5, embedder=spy, cache_dir=cache, workers=2)
    assert spy.texts == []  # the workers embed with copies of it: their counts below say they embed nothing
    for qid, c in again["data"]["lme"]["conversations"].items():
        assert c["embed_cache"]["misses"] == 0 and c["embed_cache"]["from_disk"] > 0, qid
        assert (
            c["embed_cache"]["from_disk"]
            == first[qid]["data"]["lme"]["conversations"][qid]["embed_cache"]["misses"]
        )
    none = run_eval(longmemeval=[path], methods=METHODS, k=5, embedder=BowEmbedder())
    uncached = run_eval(longmemeval=[path], methods=METHODS, k=5, embedder=BowEmbedder(), embed_cache=False)
    assert _report(again) == _report(none) == _report(uncached)
    assert len(list((cache).rglob("*.npz"))) == 4


def test_a_damaged_cache_file_is_recomputed_and_rewritten(tmp_path):
    path = _lme(tmp_path, 1)
    cache = tmp_path / "cache"
    run_eval(longmemeval=[path], methods="hat", k=5, embedder=SpyEmbedder(), cache_dir=cache)
    (f,) = cache.rglob("*.npz")
    f.write_bytes(b"not a zip file")
    spy = SpyEmbedder()
    doc = run_eval(longmemeval=[path], methods="hat", k=5, embedder=spy, cache_dir=cache)
    assert doc["data"]["lme"]["conversations"]["q_user"]["embed_cache"]["from_disk"] == 0
    assert len(spy.texts) > 1
    with np.load(f) as z:
        assert z["vectors"].shape[1] == BowEmbedder.dim


def test_export_and_load_round_trip_vectors_and_span_vectors():
    class Spans(BowEmbedder):
        def embed_spans(self, texts, spans):
            return self.embed(texts), [self.embed([t[a:b] for a, b in sp]) for t, sp in zip(texts, spans)]

    a = CachingEmbedder(Spans())
    texts = ["One sentence. Two sentences here.", "A third text.", ""]
    vecs, parts = a.embed_spans(texts, [[(0, 13), (14, 33)], [(0, 13)], []])
    b = CachingEmbedder(Spans())
    assert b.load(a.export()) == 3
    vecs2, parts2 = b.embed_spans(texts, [[(0, 13), (14, 33)], [(0, 13)], []])
    assert b.misses == 0 and np.array_equal(vecs, vecs2)
    assert all(np.array_equal(p, q) for p, q in zip(parts, parts2))
    assert text_key("a") != text_key("a", [(0, 1)]) != text_key("a", [(0, 0)])
    with pytest.raises(ValueError):
        b.load({**a.export(), "vectors": np.zeros((1, 5), np.float32)})


def test_progress_is_silent_by_default_and_counts_questions_when_asked(tmp_path, capsys):
    path = _lme(tmp_path, 3)
    run_eval(longmemeval=[path], methods="bm25", embedder=BowEmbedder())
    assert capsys.readouterr() == ("", "")
    seen: list[tuple[int, int]] = []
    run_eval(
        longmemeval=[path], methods="bm25", embedder=BowEmbedder(), progress=lambda d, t: seen.append((d, t))
    )
    assert seen[-1] == (3, 3) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    run_eval(longmemeval=[path], methods="bm25", embedder=BowEmbedder(), progress=True)  # stderr: no terminal
    assert capsys.readouterr() == ("", "")


def test_the_bar_is_drawn_only_on_a_terminal():
    for terminal in (True, False):
        buf = io.StringIO()
        with terminal_progress(
            4, "hiermem eval", "questions", Console(file=buf, force_terminal=terminal)
        ) as adv:
            adv(4)
        text = buf.getvalue()
        assert ("4/4" in text and "questions/" in text and "left" in text) is terminal, text
    with question_progress(False, 3, "x") as adv:
        adv(3)  # nothing to see, nothing raised


def test_import_shows_a_bar_over_messages_on_a_terminal(tmp_path, monkeypatch):
    from shared_core.cli import app

    lines = [{"namespace": ["u", str(i % 2)], "text": f"message {i}", "id": f"m{i}"} for i in range(6)]
    src = tmp_path / "x.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["import", str(src), str(tmp_path / "plain"), "--memory", "hat"])
    assert r.exit_code == 0, r.output
    assert "u/0: 3 messages" in r.output and "6/6" not in r.output
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "160")
    r = CliRunner().invoke(app, ["import", str(src), str(tmp_path / "bar"), "--memory", "hat"])
    assert r.exit_code == 0, r.output
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", r.output)
    assert "hiermem import" in text and "6/6" in text and "messages/" in text, text
    assert "imported 6 messages into 2 namespace(s)" in text
