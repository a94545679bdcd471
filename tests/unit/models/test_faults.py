"""Model-provider faults through the real ``openai`` client against the OpenAI-protocol test server.

Rate limits and server errors are retried by the SDK (``max_retries``, honouring ``Retry-After``);
what still fails is a typed error (:class:`ModelError` / :class:`EmbeddingError`), and a failed ``add``
leaves the memory exactly as before (``to_dict()`` compared). A fault injected at every model call of
an add, one position at a time, never leaves a trace, and the add retried afterwards builds the same
tree as a run that saw no fault.
"""

from __future__ import annotations

import copy
import hashlib
import re
import time
from typing import Any

import pytest

from shared_core import HAT, MemTree, SegTreeMem
from shared_core.models.openai_models import OpenAIChat, OpenAIEmbedder
from shared_core.prompts import segtree as SP
from shared_core.types import EmbeddingError, HierMemError, ModelError
from tests.support.memory import HashEmbedder, check_tree, make_memory, memory_class, message_text, stripped
from tests.support.openai_server import Reply  # the openai_server fixture comes from tests/conftest.py

LLM_MEMORIES = ["segtree-batch", "segtree-pointwise", "memtree", "hat", "xmemory"]
FAULTS = {"injected": 0}  # counted across the module, printed at the end


def answer(req: dict[str, Any]) -> str:
    """A well-behaved model: the label a decision prompt asks for, else a deterministic summary."""
    user = req["messages"][-1]["content"]
    if "one of MERGE_1" in user:
        return "MERGE_1"
    if "MERGE or CONTINUE" in user:
        return "MERGE"
    words = re.findall(r"[a-z]+", user.lower())
    topics = [w for w in words if w in {"dogs", "travel", "cooking", "music", "work", "garden"}]
    digest = hashlib.sha256(user.encode()).hexdigest()[:8]
    return f"Summary {digest} about {' and '.join(dict.fromkeys(topics)) or 'the conversation'}."


def chat(server: Any, **kw: Any) -> OpenAIChat:
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 5.0)
    return OpenAIChat("test-model", base_url=server.base_url, **kw)


def build(name: str, llm: Any, embedder: Any = None) -> Any:
    emb = embedder if embedder is not None else HashEmbedder()
    if name == "segtree-batch":
        return SegTreeMem(emb, llm, compat="batch_llm", relevance="dense")
    if name == "segtree-pointwise":
        return SegTreeMem(emb, llm, compat="pointwise_llm", relevance="dense")
    if name == "memtree":
        return MemTree(emb, llm, base_threshold=-1.0)  # always descends: every add aggregates
    if name == "hat":
        return HAT(emb, llm, M=2)
    return memory_class("xmemory")(emb, llm)


def primed(name: str, server: Any, n: int = 4, **kw: Any) -> Any:
    server.default_chat = answer
    mem = build(name, chat(server, **kw))
    for i in range(n):
        mem.add(message_text(i))
    return mem


# --------------------------------------------------------------------------- retried faults
@pytest.mark.parametrize("name", LLM_MEMORIES)
def test_rate_limit_and_server_error_are_retried(name, openai_server):
    mem = primed(name, openai_server, max_retries=2)
    before = len(openai_server.chat_requests())
    openai_server.script_chat(
        Reply(status=429, headers={"Retry-After": "0"}),  # the SDK's own backoff (~0.5 s)
        Reply(status=500, headers={"Retry-After": "0.01"}),
    )
    FAULTS["injected"] += 2
    mem.add(message_text(10))
    assert openai_server.pending == 0, "both faults were served"
    assert len(openai_server.chat_requests()) >= before + 3
    assert len(mem) == 5
    check_tree(mem)


def test_max_retries_is_configurable(openai_server):
    mem = primed("hat", openai_server, max_retries=0)
    snap = mem.to_dict()
    openai_server.script_chat(Reply(status=429, headers={"Retry-After": "0.01"}))
    FAULTS["injected"] += 1
    n = len(openai_server.chat_requests())
    with pytest.raises(ModelError, match="rate limited"):
        mem.add(message_text(10))
    assert len(openai_server.chat_requests()) == n + 1  # no retry
    assert mem.to_dict() == snap
    mem.llm = chat(openai_server, max_retries=3)
    mem.summarizer.llm = mem.llm
    openai_server.script_chat(*[Reply(status=503, headers={"Retry-After": "0.01"})] * 3)
    FAULTS["injected"] += 3
    mem.add(message_text(10))  # three failures absorbed by three retries
    assert len(mem) == 5
    mem.llm = chat(openai_server, max_retries=1, timeout=0.3)
    mem.summarizer.llm = mem.llm
    openai_server.script_chat(Reply(text="too late", delay=1.0))  # times out once, then answered
    FAULTS["injected"] += 1
    n = len(openai_server.chat_requests())
    mem.add(message_text(11))
    assert len(openai_server.chat_requests()) >= n + 2 and len(mem) == 6
    check_tree(mem)


# --------------------------------------------------------------------------- typed errors, no trace
@pytest.mark.parametrize("name", LLM_MEMORIES)
@pytest.mark.parametrize(
    "fault",
    ["server_error", "timeout", "truncated_json", "empty", "bad_request"],
)
def test_failed_add_is_typed_and_leaves_no_trace(name, fault, openai_server):
    mem = primed(name, openai_server, timeout=0.3)
    snap = copy.deepcopy(mem.to_dict())
    if fault == "server_error":
        reply: Any = Reply(status=500, headers={"Retry-After": "0.01"})
    elif fault == "timeout":
        reply = Reply(text="late", delay=1.0)
    elif fault == "truncated_json":
        reply = Reply(raw_body='{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "mess')
    elif fault == "empty":
        reply = Reply(text="")
    else:
        reply = Reply(status=400, text="bad request")
    openai_server.default_chat = lambda req: reply
    t0 = time.perf_counter()
    try:
        mem.add(message_text(10))
    except HierMemError as e:
        assert isinstance(e, ModelError), f"{type(e).__name__}: {e}"
        assert mem.to_dict() == snap, "a failed add changed the memory"
        raised = True
    else:
        # only a decision with a safe fallback may absorb the fault (e.g. an empty label): the summary
        # calls that follow must then have failed, so this only happens for memories without them
        raised = False
        assert name == "xmemory", f"{name}: add succeeded although every model call failed"
        check_tree(mem)
    FAULTS["injected"] += len(openai_server.chat_requests())
    assert time.perf_counter() - t0 < 20
    if raised:
        openai_server.default_chat = answer  # the provider recovers: the same add now works
        mem.add(message_text(10))
        check_tree(mem)


@pytest.mark.parametrize("name", LLM_MEMORIES)
def test_fault_at_every_llm_call_position(name, openai_server):
    """Fail the k-th LLM call of one add, for k = 0, 1, ... until the add needs fewer calls: every
    failure raises ModelError and leaves the memory unchanged; the final tree equals a clean run's."""
    clean = primed(name, openai_server)
    clean.add(message_text(10))
    want = clean.to_dict()["tree"]
    mem = primed(name, openai_server)
    snap = copy.deepcopy(mem.to_dict())
    for k in range(60):
        calls = [0]

        def script(req: dict[str, Any], k: int = k, calls: list[int] = calls) -> Any:
            calls[0] += 1
            return answer(req) if calls[0] <= k else Reply(status=500, text="injected")

        openai_server.default_chat = script
        try:
            mem.add(message_text(10))
        except ModelError:
            FAULTS["injected"] += 1
            assert mem.to_dict() == snap, f"fault at call {k} left a trace"
            continue
        break
    else:
        pytest.fail("the add never succeeded")
    assert k >= 1, "the add made no LLM call"
    if name != "xmemory":
        assert mem.to_dict()["tree"] == want
    check_tree(mem)


# --------------------------------------------------------------------------- format violations
@pytest.mark.parametrize("name", ["segtree-batch", "segtree-pointwise"])
def test_answer_ignoring_the_format_falls_back_safely(name, openai_server):
    mem = primed(name, openai_server)
    n = len(openai_server.chat_requests())

    def ignore_format(req: dict[str, Any]) -> str:
        user = req["messages"][-1]["content"]
        if "MERGE" in user:
            return "I would rather talk about the weather."
        return answer(req)

    openai_server.default_chat = ignore_format
    mem.add(message_text(10))
    FAULTS["injected"] += 2
    reqs = openai_server.chat_requests()[n:]
    decisions = [r for r in reqs if r["messages"][0]["content"] in (SP.BATCH_SYSTEM, SP.POINTWISE_SYSTEM)]
    assert len(decisions) >= 2
    assert "could not be parsed" in decisions[1]["messages"][-1]["content"]  # one corrective retry
    assert mem.stats()["decisions"]["parse_fallbacks"] >= 1
    assert len(mem) == 5
    check_tree(mem)


def test_hat_agent_ignoring_the_format_stops_as_insufficient(openai_server):
    mem = primed("hat", openai_server)
    openai_server.default_chat = "Let me think about the weather instead."
    n = len(openai_server.chat_requests())
    assert mem.retrieve("dogs", policy="agent", fill=False) == []
    trace = mem.traverse("dogs", "agent")
    FAULTS["injected"] += 4
    assert trace.outcome == "insufficient" and trace.parse_failures == 1
    assert len(openai_server.chat_requests()) == n + 4  # two calls per traversal: ask, ask again


# --------------------------------------------------------------------------- embedder faults
def embedder(server: Any, **kw: Any) -> OpenAIEmbedder:
    kw.setdefault("max_retries", 0)
    return OpenAIEmbedder("test-embedding", base_url=server.base_url, dim=8, **kw)


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat", "xmemory"])
@pytest.mark.parametrize("fault", ["server_error", "wrong_dimension", "truncated_json", "retried"])
def test_embedder_faults(kind, fault, openai_server):
    mem = make_memory(kind, embedder=embedder(openai_server, max_retries=1 if fault == "retried" else 0))
    mem.add([message_text(i) for i in range(4)])
    snap = copy.deepcopy(mem.to_dict())
    if fault == "server_error":
        openai_server.script_embed(*[Reply(status=500, headers={"Retry-After": "0.01"})] * 10)
        err: Any = ModelError
    elif fault == "wrong_dimension":
        openai_server.embed_dim = 5  # every vector now has 5 components instead of 8
        err = EmbeddingError
    elif fault == "truncated_json":
        openai_server.script_embed(*[Reply(raw_body='{"object":"list","data":[{"object":"embe')] * 10)
        err = ModelError
    else:
        openai_server.script_embed(Reply(status=500, headers={"Retry-After": "0.01"}))
        err = None
    if err is None:
        mem.add(message_text(10))
        assert len(mem) == 5
        check_tree(mem)
        FAULTS["injected"] += 1
        return
    with pytest.raises(err):
        mem.add(message_text(10))
    FAULTS["injected"] += 1
    assert mem.to_dict() == snap
    openai_server.reset()  # the provider recovers
    mem.add(message_text(10))
    check_tree(mem)


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat", "xmemory"])
def test_embedder_fault_at_every_call_position(kind, openai_server):
    clean = make_memory(kind, embedder=embedder(openai_server))
    clean.add([message_text(i) for i in range(5)])
    clean.add(message_text(10))
    want = stripped(clean.to_dict())["tree"]
    mem = make_memory(kind, embedder=embedder(openai_server))
    mem.add([message_text(i) for i in range(5)])
    snap = copy.deepcopy(mem.to_dict())
    for k in range(60):
        openai_server.reset()
        openai_server.script_embed(*[Reply()] * k, *[Reply(status=500)] * 20)
        try:
            mem.add(message_text(10))
        except ModelError:
            FAULTS["injected"] += 1
            assert mem.to_dict() == snap, f"embedder fault at call {k} left a trace"
            continue
        break
    assert k >= 1
    assert stripped(mem.to_dict())["tree"] == want
    openai_server.reset()
    check_tree(mem)


def test_zz_fault_count():
    print(f"\nfaults injected in test_faults: {FAULTS['injected']}")
    assert FAULTS["injected"] > 0
