"""``hiermem bench --llm-cost``: LLM calls and tokens per message and per query, counted twice.

What the memories report is checked against an independent count made here from the request bodies the
server received (and the stand-in's answers to them); the per-message rules of a hand-worked case; the
price arithmetic; the command line end to end on a few messages. No timings.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from shared_core.bench.llm_cost import (
    LLM_COST_MEMORIES,
    measure_memory,
    price_per_1000,
    render_llm_cost_markdown,
    run_llm_cost,
    token_counter,
)
from shared_core.bench.llm_responder import ScriptedResponder, content_words, prompt_kind
from shared_core.bench.openai_server import ScriptedOpenAIServer, whitespace_tokens
from shared_core.bench.stubs import ReplayEmbedder
from shared_core.eval.data import Conversation, Query
from shared_core.types import InvalidInputError, Message

STAMP_1 = "1:56 pm on 8 May, 2023"
STAMP_2 = "2:30 pm on 20 May, 2023"


def _conversation(n: int = 9) -> Conversation:
    """Two sessions of garden and travel talk, then questions about them."""
    texts = [
        "Caroline planted tomatoes and basil in the garden this spring.",
        "The garden tomatoes need water every morning, Caroline says.",
        "Melanie asks whether the basil in the garden grows well.",
        "Caroline says the basil grows well next to the tomatoes.",
        "Melanie booked a train trip to Lisbon for June.",
        "The Lisbon trip includes a visit to the old castle.",
        "Caroline recommends a bakery near the Lisbon castle.",
        "Melanie will bring pastries back from the Lisbon bakery.",
        "They agree to meet after the Lisbon trip in July.",
    ][:n]
    msgs = [
        Message(t, speaker="Caroline" if i % 2 == 0 else "Melanie", timestamp=STAMP_1 if i < 4 else STAMP_2)
        for i, t in enumerate(texts)
    ]
    queries = [
        Query("What did Caroline plant in the garden?", "tomatoes and basil", [], 1, n, "q1"),
        Query("Where is Melanie travelling in June?", "Lisbon", [], 1, n, "q2"),
    ]
    return Conversation("tiny", msgs, queries)


@pytest.fixture(scope="module")
def server():
    with ScriptedOpenAIServer() as s:
        yield s


class WordsEmbedder:
    """Bag-of-words vectors: texts sharing content words are close (as MiniLM would make them)."""

    dim = 64

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for w in content_words(text):
            v += ReplayEmbedder({}, dim=self.dim).vector(w)
        n = float(np.linalg.norm(v))
        return v / n if n > 0 else ReplayEmbedder({}, dim=self.dim).vector(text)

    def embed(self, texts):
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    async def aembed(self, texts):
        return self.embed(texts)


def _embedder() -> WordsEmbedder:
    return WordsEmbedder()


def _recount(requests: list[dict], counter=whitespace_tokens) -> dict[str, int]:
    """Calls and tokens of chat requests, counted from their bodies and a fresh stand-in's answers."""
    answer = ScriptedResponder(embedder=_embedder())
    calls = prompt = completion = 0
    for body in requests:
        calls += 1
        prompt += sum(counter(m["content"]) for m in body["messages"])
        reply = answer(body)
        completion += counter(reply if isinstance(reply, str) else reply.text or "")
    return {"calls": calls, "prompt_tokens": prompt, "completion_tokens": completion}


@pytest.mark.parametrize("name", list(LLM_COST_MEMORIES))
def test_counted_usage_equals_what_the_server_received(name, server):
    r = measure_memory(name, [_conversation()], server, _embedder(), queries=2)
    received = _recount(server.chat_requests())
    construction, query = r["construction"]["memory"], r["query"]["memory"]
    total = {k: construction[k] + query[k] for k in received}
    assert total == received
    assert r["construction"]["match"] and r["query"]["match"]
    assert received["calls"] > 0
    assert r["messages"] == 9 and r["queries"] == 2
    # every request was a prompt the stand-in knows, and none needed a corrective retry
    assert "other" not in r["by_prompt"]
    assert not any("could not be parsed" in b["messages"][-1]["content"] for b in server.chat_requests())
    # characters: the prompt contents the server received
    chars = sum(len(m["content"]) for b in server.chat_requests() for m in b["messages"])
    got = r["construction"]["server_totals"]["prompt_chars"] + r["query"]["server_totals"]["prompt_chars"]
    assert got == chars
    per = r["construction"]["server"]
    assert per["calls"] == pytest.approx(r["construction"]["server_totals"]["calls"] / 9)


def test_tiktoken_counts_are_what_the_usage_reports():
    count, name = token_counter("auto")
    if name == "whitespace":
        pytest.skip("no tiktoken encoding bundled offline")
    with ScriptedOpenAIServer() as server:
        server.token_counter = count
        r = measure_memory("hat", [_conversation(5)], server, _embedder(), queries=1)
        requests = server.chat_requests()
    assert r["construction"]["match"] and r["query"]["match"]
    received = _recount(requests, count)
    memory = r["construction"]["memory"]
    assert {k: memory[k] + r["query"]["memory"][k] for k in received} == received
    assert received["prompt_tokens"] != _recount(requests)["prompt_tokens"]


def test_batch_llm_asks_once_per_message_after_the_first(server):
    r = measure_memory("segtree_batch", [_conversation()], server, _embedder(), queries=1)
    # one batch decision per message that has a frontier node above the leaves to choose from: the first
    # message is a lone leaf and the second goes under a new root over both, so every message from the
    # third on; no LLM call at query time (top_down ranks by relevance)
    assert r["by_prompt"]["segtree.batch"]["calls"] == 9 - 2
    assert r["query"]["memory"]["calls"] == 0
    assert set(r["by_prompt"]) == {"segtree.batch", "segtree.annotation"}


def test_pointwise_llm_stops_at_the_first_merge(server):
    # one vector for every text: the stand-in merges with the first (lowest) candidate it is asked
    # about, so the pointwise walk asks one question per message from the third on, like batch
    same = ReplayEmbedder({}, dim=16, unknown="fixed")
    r = measure_memory("segtree_pointwise", [_conversation()], server, same, queries=0)
    assert r["by_prompt"]["segtree.pointwise"]["calls"] == 9 - 2
    # every message from the second joins the one segment, whose annotation is rewritten once each
    assert r["by_prompt"]["segtree.annotation"]["calls"] == 9 - 1


def test_hat_agent_walks_root_to_leaf(server):
    # M = 4: five leaves make two parents under a root, depth 2; the stand-in's walk goes down twice
    # and answers "sufficient" at the leaf: three agent calls per question
    r = measure_memory("hat", [_conversation(5)], server, _embedder(), queries=2)
    assert [t["max_depth"] for t in r["trees"]] == [2]
    assert r["by_prompt"]["hat.agent"]["calls"] == 2 * 3
    assert r["query"]["server"]["calls"] == 3
    agent = [b for b in server.chat_requests() if prompt_kind(b["messages"][0]["content"]) == "hat.agent"]
    actions = [ScriptedResponder(embedder=_embedder())(b) for b in agent]
    assert [a.split()[0] for a in actions] == ["down", "down", "sufficient"] * 2


def test_memtree_aggregates_every_node_on_the_path_but_the_root(server):
    # one vector for every text: each message descends to the deepest leaf, whose place a new internal
    # node takes, so message i lands at depth i and aggregates the i - 1 nodes between it and the root
    # (MemTree Sec. 3.1: every parent on the path; the root holds no content)
    same = ReplayEmbedder({}, dim=16, unknown="fixed")
    r = measure_memory("memtree", [_conversation(6)], server, same, queries=1)
    assert r["construction"]["memory"]["calls"] == 0 + 1 + 2 + 3 + 4 + 5
    assert r["calls_per_message"]["max"] == 5 and r["calls_per_message"]["p50"] == 2.5
    assert [t["max_depth"] for t in r["trees"]] == [6]
    assert r["query"]["memory"]["calls"] == 0
    assert set(r["by_prompt"]) == {"memtree.aggregate"}


def test_xmemory_calls_follow_its_episodes(server):
    # session 1 (4 messages, one timestamp): a boundary question for messages 2-4 (the first has no
    # history), all "same episode"; message 5 has a new timestamp: its boundary question closes the
    # episode, which costs one record and one fact extraction. Session 2 (messages 5-9) asks 4 more
    # boundary questions; closing it at the end (flush) costs one more record and fact extraction. One
    # vector for every text: the stand-in sees every message as on topic, so only the timestamp cuts.
    same = ReplayEmbedder({}, dim=16, unknown="fixed")
    r = measure_memory("xmemory", [_conversation()], server, same, queries=0)
    calls = {k: v["calls"] for k, v in r["by_prompt"].items()}
    assert calls["xmemory.boundary"] == 3 + 1 + 4
    assert calls["xmemory.episode"] == 2
    assert calls["xmemory.facts"] == 2
    assert r["construction"]["memory"]["calls"] == sum(calls.values())


def test_price_arithmetic():
    # 1,000 messages of 1,000 prompt and 100 completion tokens at $0.15 / $0.60 per 1M tokens
    assert price_per_1000(1000, 100, 0.15, 0.60) == pytest.approx(0.15 + 0.06)
    assert price_per_1000(1000, 100, 2.0, None) == pytest.approx(2.2)
    assert price_per_1000(1000, 100, None, 1.0) is None
    assert price_per_1000(0, 0, 0.0, 0.0) == 0.0
    with pytest.raises(InvalidInputError):
        price_per_1000(1, 1, -1.0, None)
    with pytest.raises(InvalidInputError):
        price_per_1000(1, 1, 1.0, float("nan"))


def test_run_prices_and_report(tmp_path):
    doc = run_llm_cost(
        memories=["segtree"],
        queries=1,
        price_in=1.0,
        price_out=4.0,
        tokenizer="whitespace",
        conversations=[_conversation(6)],
        embedder=_embedder(),
        out=tmp_path,
    )
    assert list(doc["results"]) == ["segtree_pointwise", "segtree_batch"]
    for r in doc["results"].values():
        per = r["construction"]["server"]
        want = 1000 * (per["prompt_tokens"] * 1.0 + per["completion_tokens"] * 4.0) / 1e6
        assert r["construction"]["price_per_1000"] == pytest.approx(want)
        assert r["query"]["price_per_1000"] == 0.0
    assert json.loads((tmp_path / "llm_cost.json").read_text()) == json.loads(json.dumps(doc))
    md = (tmp_path / "llm_cost.md").read_text()
    assert md == render_llm_cost_markdown(doc)
    assert "App. C.1 Table 5" in md and "| segtree_batch |" in md
    with pytest.raises(InvalidInputError):
        run_llm_cost(memories=["flat"], conversations=[_conversation(2)], embedder=_embedder())


def test_token_counter_choices():
    count, name = token_counter("whitespace")
    assert name == "whitespace" and count("a b  c") == 3
    _, name = token_counter("auto")
    assert name in ("whitespace", "tiktoken o200k_base")
    with pytest.raises(InvalidInputError):
        token_counter("gpt2")


def test_cli_round_trip(tmp_path, monkeypatch):
    from shared_core.cli import app

    monkeypatch.setenv("HIERMEM_DATA", str(tmp_path / "no-data"))  # falls back to the bundled excerpt
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--llm-cost",
            "--memories",
            "hat",
            "--messages",
            "5",
            "--queries",
            "1",
            "--tokenizer",
            "whitespace",
            "--price-in",
            "0.5",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "llm_cost.json").read_text())
    assert doc["schema"] == "hiermem.bench.llm_cost/1" and doc["tokenizer"] == "whitespace"
    assert "RealMem excerpt" in doc["data"]["source"]
    r = doc["results"]["hat"]
    assert r["messages"] == 5 and r["queries"] == 1
    assert r["construction"]["match"] and r["query"]["match"] and r["query"]["memory"]["calls"] >= 2
    assert doc["prices"]["usd_per_1m_completion"] is None  # --price-out defaults to --price-in
    assert "| hat |" in res.output
    bad = CliRunner().invoke(app, ["bench", "--llm-cost", "--tokenizer", "gpt2", "--out", str(out)])
    assert bad.exit_code != 0
