"""HAT: layer invariant, cached aggregation, the paper's Figure 2, traversals (agent, BFS, DFS without a
step budget) and the LLM-free policies (top_down, greedy leaves and peaks, collapsed), exactly k hits with
message leaves first, the first version's retrieval kept under options and for its saves, LLM paths
through the real ``openai`` client against the test server, atomicity, sessions, deletion and
persistence."""

# ruff: noqa: F811  (pytest fixtures are passed as parameters named like the imported fixture)

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core.memories.hat import ACTIONS, HAT, layer_sizes, parse_action
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
from tests.support.openai_server import openai_server  # noqa: F401

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


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("not sufficient", ("insufficient", None)),
        ("Not sufficient.", ("insufficient", None)),
        ("It is not yet sufficient", ("insufficient", None)),
        ("The context isn't sufficient", ("insufficient", None)),
        ("NOT SUFFICIENT", ("insufficient", None)),
        ("sufficient, not insufficient", ("sufficient", None)),
        ("don't go up, go down 2", ("down", 2)),
        ("not down 1; down 3", ("down", 3)),
        ("No, insufficient", ("insufficient", None)),  # punctuation ends the negation
        ("sufficient", ("sufficient", None)),
    ],
)
def test_parse_action_reads_negations(answer, expected):
    assert parse_action(answer, n_children=3) == expected


@pytest.mark.parametrize(
    "answer", ["not insufficient", "not down 2", "never reset", "sufficient? No, not sufficient"]
)
def test_parse_action_refuses_negated_or_contradictory_answers(answer):
    with pytest.raises(ValueError):
        parse_action(answer, n_children=3)


def test_constructor_and_policy_errors():
    with pytest.raises(InvalidInputError):
        HAT(HashEmbedder(), M=1)
    with pytest.raises(InvalidInputError):
        HAT(HashEmbedder(), max_steps=0)
    with pytest.raises(InvalidInputError):
        HAT(HashEmbedder(), search_steps=0)
    for bad in (dict(alpha=1.0), dict(alpha="x"), dict(horizon=-1), dict(beam=0), dict(fill="yes")):
        with pytest.raises(InvalidInputError):
            HAT(HashEmbedder(), **bad)
    with pytest.raises(UnknownPolicyError):
        HAT(HashEmbedder(), unit="paragraph")
    mem = make(3)
    assert mem.default_policy == "collapsed" and HAT.default_policy == "collapsed"
    assert HAT.tree_policy == "top_down"
    assert HAT(HashEmbedder(), policy="top_down").default_policy == "top_down"
    assert mem.relevance_kind == "hybrid" and mem.admissible == "leaves" and mem.fill is True
    for policy in ("agent", "bfs", "dfs"):
        with pytest.raises(LLMRequiredError):
            mem.retrieve("q", policy=policy)
        with pytest.raises(LLMRequiredError):
            mem.traverse("q", policy)
    with pytest.raises(UnknownPolicyError, match="top_down"):
        mem.retrieve("q", policy="bottom_up")
    assert make(3, llm=ScriptedLLM()).default_policy == "agent"
    assert make(3, llm=ScriptedLLM(), llm_policy="bfs").default_policy == "bfs"
    assert make(3, policy="greedy").default_policy == "greedy"


@pytest.mark.parametrize(
    "option, value, names",
    [
        ("relevance", "cosine", "'dense', 'bm25', 'hybrid'"),
        ("admissible", "summaries", "'all', 'leaves'"),
        ("greedy_hits", "tops", "'leaves', 'peaks'"),
        ("policy", "agent", "'top_down', 'greedy', 'collapsed'"),  # the default without an LLM needs none
        ("llm_policy", "random", "'agent'"),
    ],
)
def test_unknown_option_values_name_the_choices(option, value, names):
    with pytest.raises(UnknownPolicyError, match=names):
        HAT(HashEmbedder(), **{option: value})
    if option not in ("policy", "llm_policy"):
        mem = make(5)
        with pytest.raises(UnknownPolicyError, match=names):
            mem.retrieve("m1", **{option: value})


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
    hits = mem.retrieve("what did a2 say?", fill=False)  # the paper's agent: the one node it stopped at
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
        hits = mem.retrieve("What did a2 say?", policy="agent", fill=False)
        assert [h.text for h in hits] == ["u2 a2"]
        assert hits[0].metadata["path"] == [layers[0][0], layers[1][0], layers[2][1]]
        assert hits[0].metadata["outcome"] == "sufficient" and hits[0].components["rank"] == 1.0
        reqs = openai_server.chat_requests()
        assert len(reqs) == 3
        assert reqs[0]["messages"][0] == {"role": "system", "content": P.AGENT_SYSTEM}
        assert "What did a2 say?" in reqs[0]["messages"][1]["content"]

        openai_server.reset()  # unparseable twice -> insufficient, nothing returned
        openai_server.script_chat("I would rather chat", "still no action")
        trace = mem.traverse("What did a2 say?")
        assert (trace.outcome, trace.steps, trace.parse_failures) == ("insufficient", 1, 1)
        assert mem.retrieve("What did a2 say?", policy="agent", fill=False) == []
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
    hits = mem.retrieve("what did a2 say?", policy=policy, max_steps=20, fill=False)
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


PAPER = dict(relevance="dense", admissible="all", greedy_hits="peaks", fill=False)  # the first version


def test_greedy_peaks_and_patience_by_hand():
    # query "dog cat": A "dog cat" 1.0, B 0.0, C "dog y1" 0.5, D "cat y2" 0.5; parents P0 = A+B 0.577,
    # P1 = C+D 0.707; root (dog 2, cat 2, six others) 4/sqrt(2)/sqrt(14) = 0.756: the root beats both
    # children, the leaf A beats everything.
    mem = HAT(BagEmbedder(), M=2, summarizer=ConcatSummarizer(), **PAPER)
    mem.add(["dog cat", "x1 x2 x3 x4", "dog y1", "cat y2"])
    (root,), (p0, p1), (a, b, c, d) = mem.layers()
    sim = {h.node_id: h.components["rank"] for h in mem.retrieve("dog cat", policy="collapsed", k=7)}
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


def test_the_calls_k_is_the_peaks_beam():
    """Without a ``beam`` the peaks beam is the call's ``k`` (the memory's ``k`` is 10 here)."""
    mem = HAT(BagEmbedder(), M=2, summarizer=ConcatSummarizer(), **PAPER)
    mem.add(["dog cat", "x1 x2 x3 x4", "dog y1", "cat y2"])
    (root,), _, (a, *_) = mem.layers()
    assert mem.k == 10 and mem.beam is None
    assert [h.node_id for h in mem.retrieve("dog cat", policy="greedy", k=1)] == [root]  # beam 1
    assert [h.node_id for h in mem.retrieve("dog cat", policy="greedy", k=2)] == [a, root]  # beam 2
    fixed = HAT(BagEmbedder(), M=2, summarizer=ConcatSummarizer(), beam=2, **PAPER)
    fixed.add(["dog cat", "x1 x2 x3 x4", "dog y1", "cat y2"])
    assert [h.text for h in fixed.retrieve("dog cat", policy="greedy", k=1)] == ["dog cat"]


def test_top_down_and_collapsed_by_hand():
    # dense relevance, query "dog cat": leaves A "dog x1" 0.5, B "x2 x3 x4" 0, C "dog y1" 0.5, D "cat y2"
    # 0.5; P0 = "dog x1 x2 x3 x4" 1/sqrt(10), P1 = "dog y1 cat y2" 2/sqrt(8), root 3/sqrt(22).
    # top_down with alpha 0.5, H 1: s = (s0 + 0.5 W s0) / 1.5 with s0 = r / sum(r), W giving every
    # child its parent's whole score: C and D (under P1) overtake A (under P0).
    mem = HAT(BagEmbedder(), M=2, summarizer=ConcatSummarizer(), relevance="dense", alpha=0.5, horizon=1)
    mem.add(["dog x1", "x2 x3 x4", "dog y1", "cat y2"])
    (root,), (p0, p1), (a, b, c, d) = mem.layers()
    r = {a: 0.5, b: 0.0, c: 0.5, d: 0.5, p0: 1 / np.sqrt(10), p1: 2 / np.sqrt(8), root: 3 / np.sqrt(22)}
    total = sum(r.values())
    parent = {a: p0, b: p0, c: p1, d: p1}
    want = {n: (r[n] + 0.5 * r[parent[n]]) / total / 1.5 for n in (a, b, c, d)}

    hits = mem.retrieve("dog cat", k=4, policy="top_down")  # message leaves
    assert [h.node_id for h in hits] == [c, d, a, b]
    for h in hits:
        assert h.components["rank"] == pytest.approx(want[h.node_id], rel=1e-5)
        assert h.is_leaf and h.metadata["policy"] == "top_down"
        assert h.metadata["path"] == [root, parent[h.node_id]]
    flat = mem.retrieve("dog cat", k=3, policy="collapsed")  # own relevance only: ties by node id
    assert [h.node_id for h in flat] == [a, c, d]
    assert mem.retrieve("dog cat", k=3) == flat  # the default policy
    assert [h.components["rank"] for h in flat] == pytest.approx([0.5, 0.5, 0.5], abs=1e-6)
    every = mem.retrieve("dog cat", k=2, policy="collapsed", admissible="all")
    assert [h.node_id for h in every] == [p1, root] and every[0].metadata["path"] == [root]


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
    assert len(hits) == 3 and all(h.is_leaf for h in hits)
    top = hits[0]
    assert "Luna" in top.text and top.metadata["policy"] == "greedy"
    path = top.metadata["path"]  # the summaries above the leaf, root first
    assert path[0] == local_hat.layers()[0][0] and path[-1] == local_hat._store.nodes[top.node_id].parent
    for parent, child in zip(path, [*path[1:], top.node_id]):
        assert local_hat._store.nodes[child].parent == parent


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_peaks_find_the_right_leaf_with_local_embedder(local_hat, beam):
    hits = local_hat.retrieve(
        "What is the name of my dog?", policy="greedy", beam=beam, k=3, relevance="dense", greedy_hits="peaks"
    )
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
    assert (
        len(hits) == 3
        and hits[0].components["rank"] >= hits[1].components["rank"] >= hits[2].components["rank"]
    )
    default = local_hat.retrieve("Which instrument do I play?")  # default policy without an LLM: collapsed
    assert default[0].metadata["policy"] == "collapsed" and default[:3] == hits
    # k = 10 over 8 messages: every message first, then the best two summaries, with their paths
    for got in (default, local_hat.retrieve("Which instrument do I play?", policy="top_down")):
        assert "violin" in got[0].text
        assert len(got) == 10 and [h.is_leaf for h in got] == [True] * 8 + [False] * 2
        for h in got:
            check_path(local_hat, h)


def test_empty_memory():
    mem = make(llm=ScriptedLLM())
    assert mem.retrieve("anything") == [] and mem.layers() == []
    assert mem.traverse("anything").outcome == "empty" and mem.llm.prompts == []
    mem.check_invariants()


# --------------------------------------------------------------------------- evidence leaves, exactly k
def check_path(mem: HAT, hit) -> None:
    """``hit.metadata["path"]``: the summaries above the node, root first, each the parent of the next."""
    path = hit.metadata["path"]
    nodes = mem._store.nodes
    assert path == [a for a in reversed(mem._store.ancestors(hit.node_id))]
    for parent, child in zip(path, [*path[1:], hit.node_id]):
        assert nodes[child].parent == parent


PLANTED = "Ana adopted a beagle called Luna at the shelter in Lisbon."


@functools.lru_cache(maxsize=1)
def _big_tree() -> HAT:
    """200 messages on six recurring topics (word-hash embedder, default extractive summaries, M = 4)
    with one fact planted at position 137: four layers below the root."""
    from tests.support.memory import HashEmbedder as WordEmbedder
    from tests.support.memory import message_text

    texts = [message_text(i) for i in range(200)]
    texts[137] = PLANTED
    mem = HAT(WordEmbedder(), M=4)
    mem.add(texts)
    return mem


def test_evidence_leaf_deep_in_a_200_leaf_tree_is_returned():
    mem = _big_tree()
    assert mem.stats()["layer_sizes"] == [1, 4, 13, 50, 200]
    leaf = mem._store.leaf_at[137]
    root_text = mem._store.nodes[mem._store.root].text
    assert "Luna" not in root_text  # the summaries above do not quote it: routing by them alone misses it
    q = "Which beagle did Ana adopt in Lisbon?"
    for policy in ("top_down", "greedy", "collapsed"):
        hits = mem.retrieve(q, k=10, policy=policy)
        assert len(hits) == 10 and all(h.is_leaf for h in hits), policy
        assert hits[0].node_id == leaf and hits[0].text == PLANTED, policy
        assert len(hits[0].metadata["path"]) == 4
        for h in hits:
            check_path(mem, h)
    assert mem.retrieve(q, k=1)[0].node_id == leaf  # the default (top_down) at any k


def test_the_calls_k_sizes_the_greedy_beam():
    mem = _big_tree()
    q = "Which beagle did Ana adopt in Lisbon?"
    for k in (1, 3, 10, 60):
        # fill=False, admissible="all": every node the beam visited; the beam holds 4k nodes per layer
        got = mem._retrieve(q, "greedy", k, fill=False, admissible="all")
        assert len(got) == 1 + sum(min(4 * k, n) for n in (4, 13, 50, 200)), k
        leaves = mem._retrieve(q, "greedy", k, fill=False)
        assert len(leaves) == min(4 * k, 200) and all(mem._store.nodes[n].is_leaf for n, _, _ in leaves)
    assert len(mem._retrieve(q, "greedy", 1, fill=False, beam=7)) == 7  # an explicit beam wins


POLICIES = ("top_down", "greedy", "collapsed")


@FAST
@given(
    texts=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f a", "g b"]), min_size=1, max_size=24),
    M=st.sampled_from([2, 3, 4]),
    k=st.integers(1, 12),
    admissible=st.sampled_from(["leaves", "all"]),
    greedy_hits=st.sampled_from(["leaves", "peaks"]),
    relevance=st.sampled_from(["dense", "bm25", "hybrid"]),
)
def test_every_llm_free_policy_returns_exactly_k(texts, M, k, admissible, greedy_hits, relevance):
    mem = make(
        M=M, admissible=admissible, greedy_hits=greedy_hits, relevance=relevance, words=texts, n=len(texts)
    )
    distinct = {n.text for n in mem._store.nodes.values() if n.text}
    for policy in POLICIES:
        hits = mem.retrieve("a b", k=k, policy=policy)
        assert len(hits) == min(k, len(distinct)), policy
        assert len({h.text for h in hits}) == len(hits)
        if (
            admissible == "leaves"
            and policy != "greedy"
            or greedy_hits == "leaves"
            and admissible == "leaves"
        ):
            n_leaf_texts = len({mem._store.nodes[i].text for i in mem._store.leaf_at.values()})
            assert [h.is_leaf for h in hits] == [True] * min(k, n_leaf_texts) + [False] * (
                len(hits) - min(k, n_leaf_texts)
            ), policy
        for h in hits:
            if policy != "greedy" or greedy_hits == "leaves" or h.metadata.get("fill"):
                check_path(mem, h)


@pytest.mark.parametrize("policy", ["agent", "bfs", "dfs"])
@pytest.mark.parametrize("answer", ["sufficient", "YES", "insufficient", "NO"])
def test_llm_policies_return_exactly_k_and_the_papers_single_node_without_fill(policy, answer):
    mem = make(13, M=2, llm=ScriptedLLM(default=answer))
    distinct = {n.text for n in mem._store.nodes.values() if n.text}
    trace = mem.traverse("m7", policy)
    found = trace.node_id is not None
    assert found == (answer in (("sufficient",) if policy == "agent" else ("YES",)))
    for k in (1, 5, 10):
        hits = mem.retrieve("m7", k=k, policy=policy)
        assert len(hits) == min(k, len(distinct))
        if found:  # the node the LLM judged sufficient comes first: the root
            assert hits[0].node_id == mem._store.root and hits[0].metadata["outcome"] == "sufficient"
        assert all(h.metadata["fill"] for h in hits[int(found) :])
        assert all(h.metadata["policy"] == policy for h in hits)
        paper = mem.retrieve("m7", k=k, policy=policy, fill=False)
        assert [h.node_id for h in paper] == ([mem._store.root] if found else [])


def test_bfs_and_dfs_have_no_step_budget_by_default():
    # 13 leaves with M = 2: 27 nodes, 25 distinct texts (two one-child copies of "m12"); only "m11"
    # suffices: BFS asks the 13 distinct summaries, then m0..m11; DFS asks 24 nodes (pre-order).
    for policy, asked in (("bfs", 25), ("dfs", 24)):
        mem = make(13, M=2, llm=ScriptedLLM(default=_yes_for("m11")))
        assert mem.search_steps is None and mem.max_steps == 10
        trace = mem.traverse("where is m11?", policy)
        assert trace.outcome == "sufficient" and mem._store.nodes[trace.node_id].text == "m11"
        assert trace.steps == asked > mem.max_steps
        assert mem.retrieve("where is m11?", policy=policy)[0].text == "m11"
        capped = make(13, M=2, llm=ScriptedLLM(default=_yes_for("m11")), search_steps=10)
        assert capped.traverse("where is m11?", policy).outcome == "budget"
        assert mem.traverse("where is m11?", policy, max_steps=10).outcome == "budget"
    walk = ScriptedLLM(default=lambda prompt: "down 1" if "Possible here: down" in prompt else "up")
    agent = make(13, M=2, llm=walk)  # the agent keeps its budget of 10 decisions
    trace = agent.traverse("q")
    assert (trace.outcome, trace.steps) == ("budget", 10)


# --------------------------------------------------------------------------- the first version, exactly
# Hits of the first version of this module (greedy peaks by cosine with the memory's beam, collapsed
# cosine over every node) on a fixed tree: 40 messages of tests.support.memory.message_text, its word-hash
# embedder, concatenation, M = 3, k = 10 (beam 10); asked with k = 5. (node id, score, greedy path)
FIRST_VERSION = {
    ("detail number 5 on music", "greedy", ()): [
        (40, 0.850713, [44, 43, 42, 41, 40]),
        (23, 0.849926, [44, 16, 15, 24, 23]),
        (51, 0.825728, [44, 43, 42, 52, 51]),
        (13, 0.813619, [44, 16, 15, 14, 13]),
        (4, 0.812664, [44, 16, 6, 5, 4]),
    ],
    ("detail number 5 on music", "greedy", (("patience", 0),)): [(40, 0.850713, [44, 43, 42, 41, 40])],
    ("detail number 5 on music", "greedy", (("beam", 2),)): [
        (40, 0.850713, [44, 43, 42, 41, 40]),
        (13, 0.813619, [44, 16, 15, 14, 13]),
    ],
    ("detail number 5 on music", "collapsed", ()): [
        (40, 0.850713, None),
        (23, 0.849926, None),
        (41, 0.844749, None),
        (51, 0.825728, None),
        (13, 0.813619, None),
    ],
    ("travel and cooking", "greedy", (("patience", 0),)): [
        (11, 0.536852, [44, 16, 6, 10, 11]),
        (38, 0.51393, [44, 16, 29, 37, 38]),
        (1, 0.507233, [44, 16, 6, 2, 1]),
    ],
    ("travel and cooking", "greedy", (("beam", 2),)): [
        (38, 0.51393, [44, 16, 29, 37, 38]),
        (58, 0.482295, [44, 43, 57, 56, 58]),
    ],
    ("garden work", "greedy", ()): [
        (25, 0.600894, [44, 16, 15, 24, 25]),
        (53, 0.538135, [44, 43, 42, 52, 53]),
        (45, 0.412811, [44, 43, 42, 41, 45]),
        (34, 0.411204, [44, 16, 29, 33, 34]),
        (7, 0.402836, [44, 16, 6, 5, 7]),
    ],
    ("garden work", "greedy", (("patience", 0),)): [(53, 0.538135, [44, 43, 42, 52, 53])],
    ("garden work", "collapsed", ()): [
        (25, 0.600894, None),
        (53, 0.538135, None),
        (24, 0.448823, None),
        (45, 0.412811, None),
        (34, 0.411204, None),
    ],
}
#: the configuration the first version saved
FIRST_VERSION_CONFIG = {
    "M": 3,
    "unit": "turn",
    "max_steps": 10,
    "beam": 10,
    "k": 10,
    "summary_chars": 600,
    "cache_size": 10000,
}


def _word_tree(**kw) -> HAT:
    from tests.support.memory import HashEmbedder as WordEmbedder
    from tests.support.memory import message_text

    mem = HAT(WordEmbedder(), M=3, summarizer=ConcatSummarizer(), **kw)
    mem.add([message_text(i) for i in range(40)])
    return mem


def assert_first_version(mem: HAT) -> None:
    for (query, policy, params), want in FIRST_VERSION.items():
        hits = mem.retrieve(query, k=5, policy=policy, **dict(params))
        assert [h.node_id for h in hits] == [w[0] for w in want], (query, policy, params)
        assert [h.components["rank"] for h in hits] == pytest.approx([w[1] for w in want], abs=2e-6)
        if policy == "greedy":
            assert [h.metadata["path"] for h in hits] == [w[2] for w in want]


def test_the_first_versions_retrieval_is_kept_under_options():
    assert_first_version(_word_tree(beam=10, **PAPER))
    new = _word_tree()  # the defaults differ: leaves by hybrid relevance
    hits = new.retrieve("garden work", k=5, policy="greedy")
    assert len(hits) == 5 and all(h.is_leaf for h in hits)


def test_a_save_of_the_first_version_loads_with_its_behaviour(tmp_path):
    path = _word_tree().save(tmp_path / "old")
    (doc,) = path.glob("*/memory.json")
    data = json.loads(doc.read_text(encoding="utf-8"))
    data["config"] = dict(FIRST_VERSION_CONFIG)
    doc.write_text(json.dumps(data), encoding="utf-8")
    from tests.support.memory import HashEmbedder as WordEmbedder

    old = HAT.load(path, embedder=WordEmbedder())
    assert old.default_policy == "greedy" and old.search_steps == 10 and old.beam == 10
    assert (old.relevance_kind, old.admissible, old.greedy_hits, old.fill) == ("dense", "all", "peaks", False)
    old.summarizer = ConcatSummarizer()
    assert_first_version(old)
    with_llm = HAT.load(path, embedder=WordEmbedder(), llm=ScriptedLLM(default="NO"))
    assert with_llm.default_policy == "agent"
    trace = with_llm.traverse("q", "bfs")  # BFS and DFS shared the agent's budget then
    assert (trace.outcome, trace.steps) == ("budget", 10)
    assert with_llm.retrieve("q", policy="bfs") == []

    data["config"]["max_steps"] = 3
    doc.write_text(json.dumps(data), encoding="utf-8")
    assert HAT.load(path, embedder=WordEmbedder()).search_steps == 3
    new = HAT.load(_word_tree().save(tmp_path / "new"), embedder=WordEmbedder())
    assert new._config() == HAT(WordEmbedder(), M=3)._config()  # a new save keeps its own settings
    assert new.search_steps is None and new.default_policy == "collapsed"
    data["config"] = {**new._config(), "policy": "top_down"}  # a save made while top_down was the default
    doc.write_text(json.dumps(data), encoding="utf-8")
    assert HAT.load(path, embedder=WordEmbedder()).default_policy == "top_down"
