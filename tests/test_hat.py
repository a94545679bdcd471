"""HAT: layer invariant, cached aggregation, the paper's Figure 2, traversals (agent, BFS, DFS, greedy,
collapsed), LLM paths through the real ``openai`` client against the test server, atomicity, sessions,
deletion and persistence."""

# ruff: noqa: F811  (pytest fixtures are passed as parameters named like the imported fixture)

from __future__ import annotations

import copy
import functools
import hashlib
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core.hat import ACTIONS, HAT, layer_sizes, parse_action
from shared_core.models.openai_models import OpenAIChat
from shared_core.prompts import hat as P
from shared_core.types import (
    Completion,
    InvalidInputError,
    LLMRequiredError,
    Message,
    UnknownPolicyError,
    Usage,
)
from tests.openai_server import openai_server  # noqa: F401

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- test doubles
class HashEmbedder:
    """Deterministic 16-d vectors from a hash of the text (no model)."""

    dim = 16

    def embed(self, texts):
        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode("utf-8")).digest()[:8], "little")
            rows.append(np.random.default_rng(seed).standard_normal(self.dim))
        return np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim)

    async def aembed(self, texts):
        return self.embed(texts)


class ConcatSummarizer:
    """The aggregate function of the paper's Figure 2: concatenation (joined by a space). Counts calls."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls = 0
        self.seen: list[list[str]] = []
        self.fail_at = fail_at

    def summarize(self, texts, **fields):
        if self.fail_at is not None and self.calls + 1 == self.fail_at:
            self.fail_at = None
            raise RuntimeError("summariser down")
        self.calls += 1
        self.seen.append(list(texts))
        return " ".join(texts), Usage()

    async def asummarize(self, texts, **fields):
        return self.summarize(texts, **fields)


class FirstChildSummarizer(ConcatSummarizer):
    """Aggregate = the first child's text: parents' texts often stay the same after an insert."""

    def summarize(self, texts, **fields):
        super().summarize(texts, **fields)
        return texts[0], Usage()


class ScriptedLLM:
    """An LLM answering from a script, then from ``default`` (a string or ``prompt -> str``)."""

    def __init__(self, answers=(), default="insufficient") -> None:
        self.answers = deque(answers)
        self.default = default
        self.prompts: list[str] = []

    def complete(self, prompt, *, system=None, max_tokens=None, logprobs=False):
        self.prompts.append(prompt)
        if self.answers:
            text = self.answers.popleft()
        else:
            text = self.default(prompt) if callable(self.default) else self.default
        return Completion(text, Usage(llm_calls=1))

    async def acomplete(self, prompt, **kw):
        return self.complete(prompt, **kw)


def make(n: int = 0, M: int = 2, summarizer=None, llm=None, words=None, **kw) -> HAT:
    mem = HAT(HashEmbedder(), llm, M=M, summarizer=summarizer or ConcatSummarizer(), **kw)
    if n:
        mem.add(words[:n] if words else [f"m{i}" for i in range(n)])
    return mem


def texts_by_layer(mem: HAT) -> list[list[str]]:
    return [[mem._store.nodes[i].text for i in layer] for layer in mem.layers()]


def child_sets(mem: HAT) -> dict[int, tuple]:
    """Ordered (child ids, child texts) of every internal node."""
    st_ = mem._store
    return {
        nid: (tuple(n.children), tuple(st_.nodes[c].text for c in n.children))
        for nid, n in st_.nodes.items()
        if n.children
    }


def n_layers(n: int, M: int) -> int:
    h = 0
    while M**h < n:
        h += 1
    return h + 1


# --------------------------------------------------------------------------- structure
def test_layer_sizes_by_hand():
    assert layer_sizes(0, 2) == []
    assert layer_sizes(1, 4) == [1]
    assert layer_sizes(5, 2) == [5, 3, 2, 1]
    assert layer_sizes(16, 4) == [16, 4, 1]
    assert layer_sizes(17, 4) == [17, 5, 2, 1]


@FAST
@given(
    M=st.sampled_from([2, 4]),
    chunks=st.lists(st.integers(1, 7), min_size=1, max_size=12).filter(lambda c: sum(c) <= 40),
)
def test_shape_follows_floor_rule(M, chunks):
    mem = make(M=M)
    words = iter(f"w{i}" for i in range(100))
    n = 0
    for c in chunks:
        mem.add([next(words) for _ in range(c)])
        n += c
        layers = mem.layers()
        assert len(layers) == n_layers(n, M)  # ceil(log_M n) + 1 layers (1 for a single leaf)
        assert len(layers[0]) == 1 and len(layers[-1]) == n
        for k in range(1, len(layers)):
            assert len(layers[k - 1]) == -(-len(layers[k]) // M)
            for i, nid in enumerate(layers[k]):  # node i of layer k has parent floor(i/M) in layer k-1
                assert mem._store.nodes[nid].parent == layers[k - 1][i // M]
        depths = mem._store.depths()
        assert {depths[i] for i in layers[-1]} == {len(layers) - 1}  # all leaves at one depth
        assert all(mem._store.nodes[i].is_leaf for i in layers[-1])
        assert [mem._store.nodes[i].text for i in layers[-1]] == [f"w{i}" for i in range(n)]
        mem.check_invariants()
        assert mem.stats()["layer_sizes"] == [len(layer) for layer in layers]


def test_figure2_concatenation_m2_by_hand():
    """Paper Figure 2: aggregate = concatenation, memory length 2; every node's text worked by hand."""
    mem = make(M=2)
    expected = [
        [["u1"]],
        [["u1 a1"], ["u1", "a1"]],
        [["u1 a1 u2"], ["u1 a1", "u2"], ["u1", "a1", "u2"]],
        [["u1 a1 u2 a2"], ["u1 a1", "u2 a2"], ["u1", "a1", "u2", "a2"]],
        [
            ["u1 a1 u2 a2 u3"],
            ["u1 a1 u2 a2", "u3"],
            ["u1 a1", "u2 a2", "u3"],
            ["u1", "a1", "u2", "a2", "u3"],
        ],
    ]
    for word, want in zip(["u1", "a1", "u2", "a2", "u3"], expected):
        mem.add(word)
        assert texts_by_layer(mem) == want
    # Calls: root at n=2; root at n=3; the new parent and the root at n=4; the new root at n=5.
    assert mem.summarizer.calls == 5
    assert mem.stats()["single_child_copies"] == 3  # "u2" at n=3, then the two copies of "u3"


@FAST
@given(
    M=st.sampled_from([2, 3, 4]),
    chunks=st.lists(st.integers(1, 5), min_size=1, max_size=10).filter(lambda c: sum(c) <= 30),
    first_child=st.booleans(),
    cache_size=st.sampled_from([0, 10_000]),  # 0: only each node's own last aggregation is remembered
)
def test_aggregation_once_per_changed_ancestor(M, chunks, first_child, cache_size):
    summ = FirstChildSummarizer() if first_child else ConcatSummarizer()
    mem = make(M=M, summarizer=summ, cache_size=cache_size)
    words = iter(f"t{i}" for i in range(100))
    for c in chunks:
        before = child_sets(mem)
        calls, agg = summ.calls, mem.stats()["aggregation_calls"]
        mem.add([next(words) for _ in range(c)])
        after = child_sets(mem)
        changed = [nid for nid, cs in after.items() if len(cs[0]) >= 2 and before.get(nid) != cs]
        assert summ.calls - calls == len(changed)
        assert mem.stats()["aggregation_calls"] - agg == len(changed)
        # every call was for one of the changed child sets, each once
        assert sorted(map(tuple, summ.seen[calls:])) == sorted(after[nid][1] for nid in changed)


def test_unchanged_child_set_is_not_aggregated_again():
    summ = FirstChildSummarizer()
    mem = make(5, M=2, summarizer=summ, words=["a", "b", "c", "d", "e"], cache_size=0)
    assert texts_by_layer(mem)[:2] == [["a"], ["a", "e"]]
    calls, hits = summ.calls, mem.stats()["cache_hits"]
    mem.add("f")
    # ancestors of "f": parent (e, f) changed -> 1 call, returns "e" (unchanged); its one-child parent
    # copies "e"; the root's children (texts "a", "e") are unchanged -> no call.
    assert summ.calls - calls == 1
    assert mem.stats()["cache_hits"] - hits == 1
    assert texts_by_layer(mem)[1] == ["a", "e"]


# --------------------------------------------------------------------------- atomicity and cache
def test_failing_summariser_leaves_memory_unchanged_and_retry_reuses_cache():
    words = ["u1", "a1", "u2", "a2", "u3", "a3", "u4"]
    ref = make(4, M=2, words=words)
    ref.add(words[4:])
    need = ref.summarizer.calls - 3  # calls of the second add in a clean run

    summ = ConcatSummarizer()
    mem = make(4, M=2, summarizer=summ, words=words)
    before = copy.deepcopy(mem.to_dict())
    stats_before = mem.stats()
    summ.fail_at = summ.calls + 2  # the second aggregation of the next add fails
    with pytest.raises(RuntimeError, match="summariser down"):
        mem.add(words[4:])
    assert mem.to_dict() == before
    assert mem.stats()["aggregation_calls"] == stats_before["aggregation_calls"]
    assert len(mem) == 4
    mem.check_invariants()

    calls = summ.calls
    mem.add(words[4:])
    assert summ.calls - calls == need - 1  # the aggregate made before the failure comes from the cache
    assert mem.to_dict()["tree"] == ref.to_dict()["tree"]
    assert mem.stats()["cache_hits"] == ref.stats()["cache_hits"] + 1


def test_failing_session_input_leaves_memory_unchanged():
    mem = make(M=2, unit="session")
    mem.add([Message("hi", metadata={"session": 1}), Message("yo", metadata={"session": 1})])
    before = copy.deepcopy(mem.to_dict())
    with pytest.raises(InvalidInputError, match="session"):
        mem.add([Message("next", metadata={"session": 2}), Message("no session here")])
    assert mem.to_dict() == before


# --------------------------------------------------------------------------- sessions
def test_session_leaves_grow_and_report_all_ids():
    mem = make(M=2, unit="session")
    msgs = [
        Message("I adopted a dog.", id="D1:1", metadata={"session": "s1"}),
        Message("Her name is Luna.", id="D1:2", metadata={"session": "s1"}),
        Message("I moved to Lisbon.", id="D2:1", metadata={"session": "s2"}),
        Message("Luna likes the beach.", id="D2:2", metadata={"session": "s2"}),
        Message("Back to work today.", id="D3:1", timestamp="2023-05-08"),
    ]
    r1 = mem.add(msgs[:2])
    assert r1.leaf_ids[0] == r1.leaf_ids[1]
    mem.add(msgs[2])
    mem.add(msgs[3])
    mem.add(msgs[4])
    assert texts_by_layer(mem)[-1] == [
        "I adopted a dog.\nHer name is Luna.",
        "I moved to Lisbon.\nLuna likes the beach.",
        "Back to work today.",
    ]
    assert len(mem) == 3
    mem.check_invariants()
    leaves = mem.layers()[-1]
    assert mem.hit(leaves[1]).source_ids == ["D2:1", "D2:2"]
    assert mem.hit(mem._store.root).source_ids == ["D1:1", "D1:2", "D2:1", "D2:2", "D3:1"]
    assert mem._store.nodes[leaves[0]].data["n_messages"] == 2
    # the root was re-aggregated from the grown leaves
    assert (
        texts_by_layer(mem)[1][0]
        == "I adopted a dog.\nHer name is Luna. I moved to Lisbon.\nLuna likes the beach."
    )


# --------------------------------------------------------------------------- deletion and persistence
def test_delete_relayers_and_reaggregates_only_changed_groups(tmp_path):
    summ = ConcatSummarizer()
    words = [f"x{i}" for i in range(9)]
    mem = make(9, M=2, summarizer=summ, words=words)
    before = child_sets(mem)
    calls = summ.calls
    mem.delete(mem.layers()[-1][5])  # "x5"
    mem.check_invariants()
    assert texts_by_layer(mem)[-1] == ["x0", "x1", "x2", "x3", "x4", "x6", "x7", "x8"]
    assert texts_by_layer(mem)[0] == ["x0 x1 x2 x3 x4 x6 x7 x8"]
    after = child_sets(mem)
    changed = [nid for nid, cs in after.items() if len(cs[0]) >= 2 and before.get(nid) != cs]
    assert summ.calls - calls == len(changed) < len(after)

    mem.add("x9")
    mem.check_invariants()
    path = mem.save(tmp_path / "hat")
    again = HAT.load(path, embedder=HashEmbedder())
    assert again.to_dict()["tree"] == mem.to_dict()["tree"]
    assert again.stats()["aggregation_calls"] == mem.stats()["aggregation_calls"]
    again.summarizer = ConcatSummarizer()
    again.add("x10")
    again.check_invariants()
    assert texts_by_layer(again)[0] == ["x0 x1 x2 x3 x4 x6 x7 x8 x9 x10"]


# --------------------------------------------------------------------------- parsing
def test_parse_action_strict():
    assert parse_action("down 2", n_children=3) == ("down", 2)
    assert parse_action("Action: DOWN to child 3.", n_children=3) == ("down", 3)
    assert parse_action("sufficient") == ("sufficient", None)
    assert parse_action("Insufficient.") == ("insufficient", None)
    for bad in ("down", "down 4", "down 0", "up or down 1", "banana", "", "down 1 or down 2"):
        with pytest.raises(ValueError):
            parse_action(bad, n_children=3)
    with pytest.raises(ValueError, match="not possible"):
        parse_action("up", valid=("down", "sufficient", "insufficient"), n_children=2)


def test_constructor_and_policy_errors():
    with pytest.raises(InvalidInputError):
        HAT(HashEmbedder(), M=1)
    with pytest.raises(InvalidInputError):
        HAT(HashEmbedder(), max_steps=0)
    with pytest.raises(UnknownPolicyError):
        HAT(HashEmbedder(), unit="paragraph")
    mem = make(3)
    assert mem.default_policy == "greedy" and HAT.default_policy == "greedy"
    for policy in ("agent", "bfs", "dfs"):
        with pytest.raises(LLMRequiredError):
            mem.retrieve("q", policy=policy)
        with pytest.raises(LLMRequiredError):
            mem.traverse("q", policy)
    with pytest.raises(UnknownPolicyError):
        mem.retrieve("q", policy="top_down")
    assert make(3, llm=ScriptedLLM()).default_policy == "agent"


# --------------------------------------------------------------------------- agent
@functools.lru_cache(maxsize=1)
def _agent_tree() -> HAT:
    return make(13, M=2, llm=ScriptedLLM())


ANSWERS = st.one_of(
    st.sampled_from(
        ["up", "down 1", "down 2", "down 7", "down", "left", "right", "reset", "sufficient", "insufficient"]
        + ["", "banana", "up and down 1", "DOWN: 1", "go left", "not sufficient"]
    ),
    st.text(max_size=15),
)


@FAST
@given(
    answers=st.lists(ANSWERS, max_size=30),
    default=st.sampled_from(["up", "down 1", "down 2", "left", "right", "reset", "??"]),
    max_steps=st.integers(1, 8),
)
def test_agent_terminates_within_budget_on_any_answers(answers, default, max_steps):
    mem = _agent_tree()
    llm = ScriptedLLM(answers, default)
    mem.llm = llm
    layers = mem.layers()
    where = {nid: (k, i) for k, layer in enumerate(layers) for i, nid in enumerate(layer)}
    nodes = mem._store.nodes
    trace = mem.traverse("what happened?", max_steps=max_steps)
    assert 1 <= trace.steps <= max_steps
    assert len(llm.prompts) <= 2 * max_steps
    assert trace.usage.llm_calls == len(llm.prompts)
    assert trace.outcome in ("sufficient", "insufficient", "budget")
    assert (trace.outcome == "budget") == (trace.steps == max_steps and trace.actions[-1] not in ACTIONS[5:])
    assert (trace.node_id is not None) == (trace.outcome == "sufficient")
    if trace.node_id is not None:
        assert trace.node_id == trace.path[-1]
    assert trace.path[0] == layers[0][0]
    moves = [a for a in trace.actions if a not in ("sufficient", "insufficient")]
    assert len(trace.path) == len(moves) + 1
    for a, src, dst in zip(moves, trace.path, trace.path[1:]):
        (k, i), (k2, i2) = where[src], where[dst]
        if a == "up":
            assert nodes[src].parent == dst
        elif a.startswith("down"):
            assert nodes[src].children[int(a.split()[1]) - 1] == dst
        elif a == "left":
            assert (k2, i2) == (k, i - 1)
        elif a == "right":
            assert (k2, i2) == (k, i + 1)
        else:
            assert a == "reset" and dst == layers[0][0]


def test_agent_prompt_shows_node_children_and_neighbours():
    mem = make(
        5, M=2, words=["u1", "a1", "u2", "a2", "u3"], llm=ScriptedLLM(["down 1", "right", "sufficient"])
    )
    hits = mem.retrieve("what did a2 say?")
    assert [h.text for h in hits] == ["u3"]
    assert hits[0].metadata["actions"] == ["down 1", "right", "sufficient"]
    layers = mem.layers()
    assert hits[0].metadata["path"] == [layers[0][0], layers[1][0], layers[1][1]]
    first, second, _ = mem.llm.prompts
    assert "what did a2 say?" in first and "<<<\nu1 a1 u2 a2 u3\n>>>" in first
    assert "[1] <<< u1 a1 u2 a2 >>>" in first and "[2] <<< u3 >>>" in first
    assert "Possible here: down N (N = 1..2), sufficient, insufficient." in first
    assert "Right neighbour in the same layer (newer):\n<<< u3 >>>" in second
    assert "up, down N (N = 1..2), right, reset" in second


# --------------------------------------------------------------------------- through the openai client
def _chat(server) -> OpenAIChat:
    return OpenAIChat("test-model", base_url=server.base_url, max_retries=0, timeout=5.0)


def test_agent_through_openai_client(openai_server):
    llm = _chat(openai_server)
    try:
        mem = make(5, M=2, words=["u1", "a1", "u2", "a2", "u3"], llm=llm)
        layers = mem.layers()

        openai_server.script_chat("down 1", "down 2", "sufficient")
        hits = mem.retrieve("What did a2 say?", policy="agent")
        assert [h.text for h in hits] == ["u2 a2"]
        assert hits[0].metadata["path"] == [layers[0][0], layers[1][0], layers[2][1]]
        assert hits[0].metadata["outcome"] == "sufficient" and hits[0].score == 1.0
        reqs = openai_server.chat_requests()
        assert len(reqs) == 3
        assert reqs[0]["messages"][0] == {"role": "system", "content": P.AGENT_SYSTEM}
        assert "What did a2 say?" in reqs[0]["messages"][1]["content"]

        openai_server.reset()  # unparseable twice -> insufficient, nothing returned
        openai_server.script_chat("I would rather chat", "still no action")
        trace = mem.traverse("What did a2 say?")
        assert (trace.outcome, trace.steps, trace.parse_failures) == ("insufficient", 1, 1)
        assert mem.retrieve("What did a2 say?", policy="agent") == []
        retry = openai_server.chat_requests()[1]["messages"][1]["content"]
        assert "Your previous answer could not be parsed" in retry and "I would rather chat" in retry

        openai_server.reset()  # "up" is not possible at the root: corrected on the retry
        openai_server.script_chat("up", "down 2", "sufficient")
        trace = mem.traverse("q", max_steps=3)
        assert trace.outcome == "sufficient" and trace.node_id == layers[1][1]
        assert "not possible" in openai_server.chat_requests()[1]["messages"][1]["content"]

        openai_server.reset()  # a walk that never concludes stops at the budget
        openai_server.default_chat = lambda req: "down 1" if "Possible here: down" in str(req) else "up"
        trace = mem.traverse("q", max_steps=4)
        assert (trace.outcome, trace.steps, trace.node_id) == ("budget", 4, None)
        assert trace.actions == ["down 1", "up", "down 1", "up"]
        assert len(openai_server.chat_requests()) == 4
        assert mem.stats()["query_usage"]["llm_calls"] >= 12
    finally:
        llm.close()


def test_llm_aggregation_prompt_through_openai_client(openai_server):
    llm = _chat(openai_server)
    try:
        mem = HAT(HashEmbedder(), llm, M=2)
        openai_server.script_chat("Ana has a dog called Luna.")
        mem.add(["I adopted a dog.", "Her name is Luna."])
        assert texts_by_layer(mem)[0] == ["Ana has a dog called Luna."]
        (req,) = openai_server.chat_requests()
        assert req["messages"][0]["content"] == P.AGGREGATE_SYSTEM
        body = req["messages"][1]["content"]
        assert "[1] I adopted a dog.\n[2] Her name is Luna." in body and "persona" in body
        assert mem.usage.llm_calls == 1
    finally:
        llm.close()


# --------------------------------------------------------------------------- bfs / dfs
def _yes_for(target: str):
    return lambda prompt: "YES" if f"<<<\n{target}\n>>>" in prompt else "NO"


@pytest.mark.parametrize(
    "policy, expected",
    [
        (
            "bfs",  # layer by layer, left to right; the copies of "u3" are asked once
            ["u1 a1 u2 a2 u3", "u1 a1 u2 a2", "u3", "u1 a1", "u2 a2", "u1", "a1", "u2", "a2"],
        ),
        ("dfs", ["u1 a1 u2 a2 u3", "u1 a1 u2 a2", "u1 a1", "u1", "a1", "u2 a2", "u2", "a2"]),
    ],
)
def test_bfs_dfs_visit_order(policy, expected):
    mem = make(5, M=2, words=["u1", "a1", "u2", "a2", "u3"], llm=ScriptedLLM(default=_yes_for("a2")))
    trace = mem.traverse("what did a2 say?", policy, max_steps=20)
    assert [mem._store.nodes[i].text for i in trace.path] == expected
    assert trace.outcome == "sufficient" and trace.actions == ["no"] * (len(expected) - 1) + ["yes"]
    assert mem._store.nodes[trace.node_id].is_leaf
    hits = mem.retrieve("what did a2 say?", policy=policy, max_steps=20)
    assert [h.text for h in hits] == ["a2"] and hits[0].metadata["path"] == trace.path

    short = mem.traverse("q", policy, max_steps=3)
    assert (short.outcome, short.steps, len(short.path)) == ("budget", 3, 3)
    mem.llm = ScriptedLLM(default="NO")
    assert mem.traverse("q", policy, max_steps=50).outcome == "insufficient"


# --------------------------------------------------------------------------- LLM-free policies
class BagEmbedder:
    """Word counts over a fixed vocabulary (cosine = bag-of-words overlap), for worked examples."""

    VOCAB = ("dog", "cat", "x1", "x2", "x3", "x4", "y1", "y2")
    dim = len(VOCAB)

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, t in enumerate(texts):
            for w in t.split():
                out[r, self.VOCAB.index(w)] += 1
        return out

    async def aembed(self, texts):
        return self.embed(texts)


def test_greedy_peaks_and_patience_by_hand():
    # query "dog cat": A "dog cat" 1.0, B 0.0, C "dog y1" 0.5, D "cat y2" 0.5; parents P0 = A+B 0.577,
    # P1 = C+D 0.707; root (dog 2, cat 2, six others) 4/sqrt(2)/sqrt(14) = 0.756: the root beats both
    # children, the leaf A beats everything.
    mem = HAT(BagEmbedder(), M=2, summarizer=ConcatSummarizer())
    mem.add(["dog cat", "x1 x2 x3 x4", "dog y1", "cat y2"])
    (root,), (p0, p1), (a, b, c, d) = mem.layers()
    sim = {h.node_id: h.score for h in mem.retrieve("dog cat", policy="collapsed", k=7)}
    assert sim[root] == pytest.approx(4 / np.sqrt(2) / np.sqrt(14), abs=1e-6)
    assert sim[p1] == pytest.approx(np.sqrt(0.5), abs=1e-6) and sim[a] == pytest.approx(1.0, abs=1e-6)

    literal = mem.retrieve("dog cat", policy="greedy", beam=2, patience=0)
    assert [h.node_id for h in literal] == [root] and literal[0].metadata["path"] == [root]
    hits = mem.retrieve("dog cat", policy="greedy", beam=2)
    assert [h.node_id for h in hits] == [a, root]
    assert hits[0].metadata["path"] == [root, p0, a] and hits[0].metadata["actions"] == ["down 1", "down 1"]
    # beam 1 follows P1 (0.707 > 0.577), whose children are less similar: only the root is a peak
    assert [h.node_id for h in mem.retrieve("dog cat", policy="greedy", beam=1)] == [root]
    with pytest.raises(InvalidInputError):
        mem.retrieve("dog cat", policy="greedy", patience=-1)


CONVERSATION = [
    "I just got back from a hiking trip in the Alps with my sister.",
    "That sounds amazing, how was the weather up there?",
    "I adopted a puppy last week, a beagle named Luna.",
    "My new job at the bakery starts on Monday morning.",
    "I have been learning to play the violin for two years.",
    "We painted the kitchen walls a bright yellow colour.",
    "My favourite football team lost the final again.",
    "I am reading a novel about a detective in Tokyo.",
]


@pytest.fixture(scope="module")
def local_hat():
    from shared_core.models.local import LocalEmbedder

    mem = HAT(LocalEmbedder(), M=2)  # extractive aggregation
    mem.add(CONVERSATION)
    return mem


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_finds_the_right_leaf_with_local_embedder(local_hat, beam):
    hits = local_hat.retrieve("What is the name of my dog?", policy="greedy", beam=beam, k=3)
    top = hits[0]
    assert top.is_leaf and "Luna" in top.text
    path = top.metadata["path"]
    assert path[0] == local_hat.layers()[0][0] and path[-1] == top.node_id
    assert len(top.metadata["actions"]) == len(path) - 1
    for parent, child in zip(path, path[1:]):
        assert local_hat._store.nodes[child].parent == parent


def test_collapsed_with_local_embedder(local_hat):
    hits = local_hat.retrieve("Which instrument do I play?", policy="collapsed", k=3)
    assert "violin" in hits[0].text and hits[0].is_leaf
    assert len(hits) == 3 and hits[0].score >= hits[1].score >= hits[2].score
    default = local_hat.retrieve("Which instrument do I play?")  # default policy without an LLM: greedy
    assert default[0].metadata["policy"] == "greedy" and "violin" in default[0].text


def test_empty_memory():
    mem = make(llm=ScriptedLLM())
    assert mem.retrieve("anything") == [] and mem.layers() == []
    assert mem.traverse("anything").outcome == "empty" and mem.llm.prompts == []
    mem.check_invariants()
