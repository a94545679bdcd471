"""OpenAI-protocol clients, the LLM summariser and strict parsing, through the real ``openai`` SDK
against the scriptable test server in ``tests/support/openai_server.py``."""

# ruff: noqa: F811  (pytest fixtures are passed as parameters named like the imported fixture)

from __future__ import annotations

import asyncio
import gc
import json
import time
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared_core.models.base import LLM, Embedder
from shared_core.models.llm_summarizer import LLMSummarizer, render_children
from shared_core.models.openai_models import OpenAIChat, OpenAIEmbedder
from shared_core.models.parsing import (
    acomplete_parsed,
    complete_parsed,
    parse_json_object,
    parse_label,
)
from shared_core.types import EmbeddingError, InvalidInputError, ModelError
from tests.support.openai_server import Reply, hash_embedding, openai_server  # noqa: F401

FAST_RETRY = {"retry-after-ms": "5"}  # keeps the SDK's backoff short


_OPEN: list[OpenAIChat | OpenAIEmbedder] = []


def chat(server, model="test-model", **kw) -> OpenAIChat:
    kw.setdefault("max_retries", 2)
    kw.setdefault("timeout", 5.0)
    _OPEN.append(OpenAIChat(model, base_url=server.base_url, **kw))
    return _OPEN[-1]


def embedder(server, model="test-embedding", **kw) -> OpenAIEmbedder:
    kw.setdefault("max_retries", 1)
    kw.setdefault("timeout", 5.0)
    _OPEN.append(OpenAIEmbedder(model, base_url=server.base_url, **kw))
    return _OPEN[-1]


@pytest.fixture(autouse=True)
async def _close_clients():
    """Close the HTTP clients a test made (the async ones belong to this test's event loop)."""
    yield
    while _OPEN:
        m = _OPEN.pop()
        m.close()
        await m.aclose()


# =========================================================================== chat
def test_chat_text_usage_and_request(openai_server):
    openai_server.script_chat("Luna is a dog")
    llm = chat(openai_server)
    assert isinstance(llm, LLM)
    c = llm.complete("What is the name of the dog ?", system="Be brief.", max_tokens=7)
    assert c.text == "Luna is a dog"
    assert c.logprobs is None
    assert c.usage.llm_calls == 1
    assert c.usage.prompt_tokens == 2 + 8  # whitespace tokens of system + user message
    assert c.usage.completion_tokens == 4
    assert c.usage.seconds > 0
    (req,) = openai_server.chat_requests()
    assert req["model"] == "test-model"
    assert req["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the name of the dog ?"},
    ]
    assert req["max_tokens"] == 7 and req["temperature"] == 0.0
    assert "logprobs" not in req
    assert llm.usage.llm_calls == 1 and llm.usage.completion_tokens == 4


def test_chat_without_system_sends_only_user_message(openai_server):
    chat(openai_server).complete("hello")
    (req,) = openai_server.chat_requests()
    assert [m["role"] for m in req["messages"]] == ["user"]
    assert "max_tokens" not in req


def test_chat_logprobs_default_and_scripted(openai_server):
    openai_server.script_chat("a b c", Reply(text="x y", logprobs=[-0.5, -2.0]), "no")
    llm = chat(openai_server)
    c = llm.complete("q", logprobs=True)
    assert c.logprobs == pytest.approx([-0.1, -0.1, -0.1])
    assert openai_server.chat_requests()[0]["logprobs"] is True
    assert llm.complete("q", logprobs=True).logprobs == [-0.5, -2.0]
    assert llm.complete("q").logprobs is None  # not asked for


def test_chat_logprobs_absent_from_server_gives_none(openai_server):
    openai_server.script_chat(Reply(text="", logprobs=[]))  # server sends no logprob entries
    c = chat(openai_server).complete("q", logprobs=True)
    assert c.text == "" and c.logprobs is None


def test_chat_null_content_becomes_empty_string(openai_server):
    openai_server.script_chat(Reply(text=None, delay=0.2))
    c = chat(openai_server).complete("q")
    assert c.text == ""
    assert c.usage.seconds >= 0.2  # wall time of the call


def test_chat_default_reply_callable(openai_server):
    openai_server.default_chat = lambda req: req["messages"][-1]["content"].upper()
    assert chat(openai_server).complete("echo me").text == "ECHO ME"


def test_reasoning_models_get_max_completion_tokens_and_no_temperature(openai_server):
    llm = chat(openai_server, "gpt-5-mini", max_retries=0)
    llm.complete("q", max_tokens=10)
    (req,) = openai_server.chat_requests()
    assert req["max_completion_tokens"] == 10
    assert "max_tokens" not in req and "temperature" not in req


def test_429_with_retry_after_is_retried(openai_server):
    llm = chat(openai_server, max_retries=2)
    llm.complete("warm up")  # the SDK's first call builds its models lazily; keep that out of the timing
    openai_server.script_chat(
        Reply(status=429, headers={"Retry-After": "0.05"}),
        Reply(status=429, headers={"Retry-After": "0.05"}),
        "done",
    )
    t0 = time.perf_counter()
    c = llm.complete("q")
    elapsed = time.perf_counter() - t0
    assert c.text == "done"
    assert len(openai_server.chat_requests()) == 1 + 3
    # waited the two Retry-After delays (2 x 0.05 s), not the SDK's default backoff (>= 1.1 s in total)
    assert 0.1 <= elapsed < 0.9
    assert c.usage.llm_calls == 1


def test_429_after_retries_exhausted_is_model_error(openai_server):
    openai_server.script_chat(*[Reply(status=429, headers=FAST_RETRY)] * 2)
    with pytest.raises(ModelError, match="rate limited") as ei:
        chat(openai_server, max_retries=1).complete("q")
    assert len(openai_server.chat_requests()) == 2
    assert ei.value.__cause__ is not None


def test_500_repeatedly_is_model_error(openai_server):
    openai_server.script_chat(*[Reply(status=500, headers=FAST_RETRY)] * 3, "never reached")
    with pytest.raises(ModelError, match="HTTP 500"):
        chat(openai_server, max_retries=2).complete("q")
    assert len(openai_server.chat_requests()) == 3
    assert openai_server.pending == 1


def test_400_is_not_retried(openai_server):
    openai_server.script_chat(Reply(status=400, text="bad parameter"), "unused")
    with pytest.raises(ModelError, match="rejected the request"):
        chat(openai_server, max_retries=3).complete("q")
    assert len(openai_server.chat_requests()) == 1


def test_timeout_is_model_error(openai_server):
    openai_server.script_chat(Reply(text="late", delay=2.0))
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match="timed out"):
        chat(openai_server, timeout=0.3, max_retries=0).complete("q")
    assert time.perf_counter() - t0 < 1.5


def test_truncated_json_is_model_error(openai_server):
    openai_server.script_chat(Reply(raw_body='{"id": "x", "choices": [{"index": 0, "mess'))
    with pytest.raises(ModelError, match="not a valid OpenAI-protocol response"):
        chat(openai_server).complete("q")
    assert len(openai_server.chat_requests()) == 1


def test_json_without_choices_is_model_error(openai_server):
    openai_server.script_chat(Reply(raw_body='{"id": "x", "object": "chat.completion"}'))
    with pytest.raises(ModelError):
        chat(openai_server).complete("q")


def test_connection_refused_is_model_error():
    import socket

    with socket.socket() as s:  # a free port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=2.0)
    with pytest.raises(ModelError, match="could not connect"):
        llm.complete("q")


def test_missing_api_key_fails_at_first_use_not_construction(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    llm = OpenAIChat()  # constructing is fine
    emb = OpenAIEmbedder()
    assert emb.dim == 1536  # known size, no request needed
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        llm.complete("q")
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        emb.embed(["x"])


def test_placeholder_key_with_base_url(openai_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert chat(openai_server).complete("q").text == "OK"


def test_bad_arguments_are_invalid_input(openai_server):
    llm = chat(openai_server)
    with pytest.raises(InvalidInputError):
        llm.complete("   ")
    with pytest.raises(InvalidInputError):
        llm.complete("q", max_tokens=0)
    with pytest.raises(InvalidInputError):
        OpenAIChat(timeout=0)
    with pytest.raises(InvalidInputError):
        OpenAIEmbedder(batch_size=0)
    with pytest.raises(InvalidInputError):
        OpenAIEmbedder(dimensions=4, dim=5)
    assert openai_server.requests == []


async def test_async_chat(openai_server):
    openai_server.script_chat(Reply(text="first", delay=0.2), "second")
    llm = chat(openai_server)
    c1, c2 = await asyncio.gather(llm.acomplete("a", logprobs=True), llm.acomplete("b"))
    assert {c1.text, c2.text} == {"first", "second"}
    assert c1.usage.llm_calls == c2.usage.llm_calls == 1
    assert len(openai_server.chat_requests()) == 2


async def test_async_chat_errors(openai_server):
    openai_server.script_chat(Reply(status=500, headers=FAST_RETRY), Reply(status=500, headers=FAST_RETRY))
    with pytest.raises(ModelError, match="HTTP 500"):
        await chat(openai_server, max_retries=1).acomplete("q")
    openai_server.script_chat(Reply(text="late", delay=2.0))
    with pytest.raises(ModelError, match="timed out"):
        await chat(openai_server, timeout=0.3, max_retries=0).acomplete("q")


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_async_client_is_per_event_loop_and_released(openai_server):
    llm = chat(openai_server)
    loops = []

    async def ask(q, close):
        loops.append(weakref.ref(asyncio.get_running_loop()))
        try:
            return (await llm.acomplete(q)).text
        finally:
            if close:
                await llm.aclose()

    assert asyncio.run(ask("a", close=False)) == "OK"  # leaves a client bound to a closed loop
    assert asyncio.run(ask("b", close=True)) == "OK"  # a fresh loop must not reuse the dead pool
    gc.collect()  # the first loop's unclosed connections are reclaimed here, under this test's filters
    assert loops[0]() is None  # the closed loop and its client are not kept alive


# =========================================================================== embeddings
def test_embedder_batches_in_order(openai_server):
    texts = [f"text number {i}" for i in range(5)]
    emb = embedder(openai_server, batch_size=2, dim=8)
    assert isinstance(emb, Embedder)
    out = emb.embed(texts)
    assert out.shape == (5, 8) and out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_allclose(out, np.array([hash_embedding(t, 8) for t in texts]), rtol=1e-6)
    reqs = openai_server.embed_requests()
    assert [r["input"] for r in reqs] == [texts[0:2], texts[2:4], texts[4:5]]
    assert all(r["model"] == "test-embedding" and r["encoding_format"] == "float" for r in reqs)
    u = emb.usage
    assert (u.embed_calls, u.embedded_texts, u.prompt_tokens) == (3, 5, 15)


def test_embedder_reorders_rows_by_index(openai_server):
    a, b = hash_embedding("a", 8), hash_embedding("b", 8)
    data = [
        {"object": "embedding", "index": 1, "embedding": b},
        {"object": "embedding", "index": 0, "embedding": a},
    ]
    openai_server.script_embed(Reply(raw_body=json.dumps({"object": "list", "data": data, "model": "m"})))
    out = embedder(openai_server, dim=8).embed(["a", "b"])
    np.testing.assert_allclose(out, np.array([a, b]), rtol=1e-6)


def test_embedder_learns_dim_from_first_call(openai_server):
    openai_server.embed_dim = 5
    emb = embedder(openai_server)
    assert emb.dim == 5  # one probe request
    assert len(openai_server.embed_requests()) == 1
    assert emb.embed(["x", "y"]).shape == (2, 5)


def test_embedder_dimensions_is_sent(openai_server):
    emb = embedder(openai_server, "text-embedding-3-large", dimensions=4)
    assert emb.dim == 4
    assert emb.embed(["x"]).shape == (1, 4)
    assert openai_server.embed_requests()[0]["dimensions"] == 4


def test_embedder_wrong_dimension_is_embedding_error(openai_server):
    # a compatible server answering 8-d vectors under an OpenAI model name of 1536 dimensions
    emb = embedder(openai_server, "text-embedding-3-small")
    with pytest.raises(EmbeddingError, match="dimension 8"):
        emb.embed(["x"])
    # a later batch of another size than the first one
    emb2 = embedder(openai_server, batch_size=1)
    openai_server.script_embed([[1.0, 0.0, 0.0]], [[1.0, 0.0]])
    with pytest.raises(EmbeddingError):
        emb2.embed(["a", "b"])


def test_embedder_nan_is_embedding_error(openai_server):
    # Python's JSON decoder accepts the NaN literal, so a sloppy server can send one.
    openai_server.script_embed(
        Reply(
            raw_body='{"object":"list","data":[{"object":"embedding","index":0,"embedding":[NaN,1.0]}],'
            '"model":"m"}'
        )
    )
    with pytest.raises(EmbeddingError, match="NaN"):
        embedder(openai_server, dim=2).embed(["x"])


def test_embedder_wrong_row_count_is_model_error(openai_server):
    openai_server.script_embed([[1.0] * 8])  # one vector for two texts
    with pytest.raises(ModelError, match="1 vectors for 2 texts"):
        embedder(openai_server, dim=8).embed(["a", "b"])


def test_embedder_provider_errors(openai_server):
    openai_server.script_embed(Reply(status=503, headers=FAST_RETRY), Reply(status=503, headers=FAST_RETRY))
    with pytest.raises(ModelError, match="HTTP 503") as ei:
        embedder(openai_server, dim=8, max_retries=1).embed(["x"])
    assert ei.value.__cause__ is not None
    assert len(openai_server.embed_requests()) == 2
    openai_server.script_embed(Reply(raw_body='{"data": [{"embedd'))
    with pytest.raises(ModelError, match="not a valid"):
        embedder(openai_server, dim=8).embed(["x"])


def test_embedder_input_checks(openai_server):
    emb = embedder(openai_server, dim=8)
    with pytest.raises(InvalidInputError):
        emb.embed("not a list")
    with pytest.raises(InvalidInputError):
        emb.embed(["ok", ""])
    with pytest.raises(InvalidInputError):
        emb.embed(["ok", 3])
    assert emb.embed([]).shape == (0, 8)
    assert openai_server.requests == []


async def test_async_embedder_batches_in_order(openai_server):
    texts = [f"t{i}" for i in range(7)]
    emb = embedder(openai_server, batch_size=3, dim=8)
    out = await emb.aembed(texts)
    assert out.shape == (7, 8)
    np.testing.assert_allclose(out, np.array([hash_embedding(t, 8) for t in texts]), rtol=1e-6)
    inputs = sorted((r["input"] for r in openai_server.embed_requests()), key=lambda x: x[0])
    assert inputs == [texts[0:3], texts[3:6], texts[6:7]]
    openai_server.script_embed(Reply(status=500, headers=FAST_RETRY), Reply(status=500, headers=FAST_RETRY))
    with pytest.raises(ModelError):
        await embedder(openai_server, dim=8, max_retries=1).aembed(["x"])


# =========================================================================== summariser
def test_summarizer_renders_children_in_order(openai_server):
    openai_server.script_chat("  Alice adopted Luna on 3 May.  ")
    s = LLMSummarizer(chat(openai_server), max_tokens=64)
    children = ["Alice: I adopted a dog.", "Bob: What is its name?", "Alice: Luna, on 3 May."]
    text, usage = s.summarize(children)
    assert text == "Alice adopted Luna on 3 May."
    assert usage.llm_calls == 1
    (req,) = openai_server.chat_requests()
    prompt = req["messages"][-1]["content"]
    block = "[1] Alice: I adopted a dog.\n[2] Bob: What is its name?\n[3] Alice: Luna, on 3 May."
    assert block in prompt and "3 consecutive segments" in prompt
    assert req["messages"][0]["role"] == "system"
    assert req["max_tokens"] == 64


def test_summarizer_custom_template_fields_and_braces(openai_server):
    s = LLMSummarizer(chat(openai_server), template="Topic {topic} {{literal}}:\n{children}", system=None)
    s.summarize(["a {b} c", "d"], topic="pets")
    (req,) = openai_server.chat_requests()
    assert req["messages"] == [{"role": "user", "content": "Topic pets {literal}:\n[1] a {b} c\n[2] d"}]
    with pytest.raises(InvalidInputError, match="topic"):
        s.summarize(["a"])
    with pytest.raises(InvalidInputError):
        s.summarize(["a"], topic="x", children="y")
    with pytest.raises(InvalidInputError, match="children"):
        LLMSummarizer(chat(openai_server), template="no placeholder")
    with pytest.raises(InvalidInputError):
        LLMSummarizer(chat(openai_server), template="{children} {")
    with pytest.raises(InvalidInputError):
        s.summarize([])


def test_summarizer_retries_once_on_empty(openai_server):
    openai_server.script_chat("   ", "Second try.")
    text, usage = LLMSummarizer(chat(openai_server)).summarize(["a", "b"])
    assert text == "Second try."
    assert usage.llm_calls == 2
    reqs = openai_server.chat_requests()
    assert len(reqs) == 2 and "previous reply was empty" in reqs[1]["messages"][-1]["content"]


def test_summarizer_empty_twice_is_model_error(openai_server):
    openai_server.script_chat("", Reply(text=None), "not reached")
    with pytest.raises(ModelError, match="empty summary"):
        LLMSummarizer(chat(openai_server)).summarize(["a"])
    assert len(openai_server.chat_requests()) == 2


async def test_async_summarizer(openai_server):
    openai_server.script_chat("", "Async summary.")
    text, usage = await LLMSummarizer(chat(openai_server)).asummarize(["x", "y"])
    assert text == "Async summary." and usage.llm_calls == 2
    assert "[1] x\n[2] y" in openai_server.chat_requests()[0]["messages"][-1]["content"]


@given(st.lists(st.text(min_size=1).filter(lambda t: t.strip()), min_size=1, max_size=8))
def test_render_children_keeps_order(texts):
    rendered = render_children(texts)
    positions = [rendered.index(f"[{i}] {t.strip()}") for i, t in enumerate(texts, start=1)]
    assert positions == sorted(positions)


# =========================================================================== parsing
LABELS = ["MERGE_1", "MERGE_2", "SPLIT"]


def test_complete_parsed_first_try(openai_server):
    openai_server.script_chat("I choose merge_2.")
    r = complete_parsed(chat(openai_server), "pick", lambda t: parse_label(t, LABELS), fallback="SPLIT")
    assert (r.value, r.ok, r.raw, r.usage.llm_calls) == ("MERGE_2", True, ["I choose merge_2."], 1)


def test_complete_parsed_retries_with_corrective_suffix(openai_server):
    openai_server.script_chat("maybe MERGE_1 or MERGE_2", "SPLIT")
    r = complete_parsed(
        chat(openai_server), "pick one", lambda t: parse_label(t, LABELS), system="sys", fallback="X"
    )
    assert (r.value, r.ok, r.usage.llm_calls) == ("SPLIT", True, 2)
    first, second = (q["messages"][-1]["content"] for q in openai_server.chat_requests())
    assert first == "pick one"
    assert second.startswith("pick one\n\n") and "could not be parsed" in second
    assert "maybe MERGE_1 or MERGE_2" in second and "MERGE_1, MERGE_2, SPLIT" in second
    assert all(q["messages"][0]["content"] == "sys" for q in openai_server.chat_requests())


def test_complete_parsed_falls_back(openai_server):
    openai_server.script_chat("dunno", "still dunno", "MERGE_1")
    r = complete_parsed(chat(openai_server), "pick", lambda t: parse_label(t, LABELS), fallback="SPLIT")
    assert (r.value, r.ok, r.raw, r.usage.llm_calls) == ("SPLIT", False, ["dunno", "still dunno"], 2)
    assert openai_server.pending == 1  # exactly one retry
    openai_server.reset()
    openai_server.script_chat("bad", "MERGE_1")
    r0 = complete_parsed(chat(openai_server), "p", lambda t: parse_label(t, LABELS), retries=0, fallback=None)
    assert (r0.value, r0.ok) == (None, False)


def test_complete_parsed_provider_error_propagates(openai_server):
    openai_server.script_chat(Reply(status=500, headers=FAST_RETRY))
    with pytest.raises(ModelError):
        complete_parsed(chat(openai_server, max_retries=0), "p", parse_json_object, fallback={})


async def test_acomplete_parsed(openai_server):
    openai_server.script_chat("no json here", '```json\n{"keep": true}\n```')
    r = await acomplete_parsed(chat(openai_server), "give json", parse_json_object, fallback={})
    assert (r.value, r.ok, r.usage.llm_calls) == ({"keep": True}, True, 2)
    openai_server.script_chat("x", "y")
    r2 = await acomplete_parsed(chat(openai_server), "give json", parse_json_object, fallback={"d": 1})
    assert (r2.value, r2.ok) == ({"d": 1}, False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SPLIT", "SPLIT"),
        ("  split. ", "SPLIT"),
        ("**MERGE_2**", "MERGE_2"),
        ("Answer: MERGE_1 (MERGE_1 again)", "MERGE_1"),
        ("MERGE_12 is not a label, but MERGE_1 is", "MERGE_1"),
    ],
)
def test_parse_label_accepts(text, expected):
    assert parse_label(text, LABELS) == expected


@pytest.mark.parametrize(
    "text",
    [
        "MERGE_1 or SPLIT",  # two different labels
        "merge_1 merge_2",
        "XSPLIT",  # label inside another word
        "SPLITTING",
        "MERGE_12",
        "MERGE_1_SPLIT",  # underscores join words
        "",
        "none of them",
    ],
)
def test_parse_label_rejects(text):
    with pytest.raises(ValueError):
        parse_label(text, LABELS)


def test_parse_label_longest_match_and_bad_labels():
    labels = ["sufficient", "insufficient", "not sufficient"]
    assert parse_label("The node is insufficient.", labels) == "insufficient"
    assert parse_label("NOT SUFFICIENT", labels) == "not sufficient"
    with pytest.raises(ValueError):
        parse_label("sufficient, or maybe not sufficient", labels)
    with pytest.raises(InvalidInputError):
        parse_label("x", [])
    with pytest.raises(InvalidInputError):
        parse_label("x", ["A", "a"])


@given(
    st.sampled_from(LABELS),
    st.text(alphabet=" .,:;!?*()\n'\"", max_size=5),
    st.text(alphabet=" .,:", max_size=5),
)
def test_parse_label_finds_label_among_punctuation(label, pre, post):
    assert parse_label(pre + label.lower() + post, LABELS) == label


def test_parse_json_object():
    assert parse_json_object('{"a": 1}') == {"a": 1}
    assert parse_json_object('  \n{"a": [1, 2]}\n') == {"a": [1, 2]}
    assert parse_json_object('Here you go:\n```json\n{"a": "b"}\n```\nDone.') == {"a": "b"}
    assert parse_json_object('```\n{"x": null}\n```') == {"x": None}
    for bad in [
        "",
        "[1, 2]",
        '"text"',
        '{"a": 1',
        'Sure! {"a": 1}',
        "```json\n[1]\n```",
        '```json\n{"a": 1}\n```\n```json\n{"b": 2}\n```',
    ]:
        with pytest.raises(ValueError):
            parse_json_object(bad)


def test_parse_json_object_rejects_non_standard_constants():
    for bad in ['{"x": NaN}', '{"x": -Infinity}']:
        with pytest.raises(ValueError, match="non-standard constant"):
            parse_json_object(bad)
