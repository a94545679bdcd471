"""Unit tests of ``shared_core.models.adapt``: plain callables as core models, and the adapter helpers.

Embeddings come from a deterministic stub (one pseudo-random vector per word, seeded by a hash of the
word); LLMs are fakes that record their arguments. No model, network or API key.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from shared_core.memories.segtree import SegTreeMem
from shared_core.models.adapt import (
    DIM_PROBE,
    CallableEmbedder,
    CallableLLM,
    Reply,
    aembed_rows,
    check_completion_args,
    check_dim,
    core_embedder,
    embed_rows,
    get_field,
    join_system,
    model_fields,
    openai_logprobs,
    optional_call_kwargs,
    prompt_input,
    read_token_counts,
    wrap_model_error,
)
from shared_core.models.base import LLM, Embedder
from shared_core.types import EmbeddingError, HierMemError, InvalidInputError, ModelError, Usage

DIM = 16


def stub_vectors(texts: list[str], dim: int = DIM) -> list[list[float]]:
    """Deterministic embeddings: the sum of one seeded pseudo-random vector per lower-cased word."""
    rows = []
    for text in texts:
        v = np.zeros(dim, dtype=np.float64)
        for word in re.findall(r"\w+", text.lower()) or [text]:
            seed = int.from_bytes(hashlib.blake2b(word.encode("utf-8")).digest()[:8], "little")
            v += np.random.default_rng(seed).standard_normal(dim)
        rows.append(v.tolist())
    return rows


class RecordingBatch:
    """An ``embed_batch`` callable that records its calls (and the thread they ran in)."""

    def __init__(self, result: Any = None) -> None:
        self.calls: list[list[str]] = []
        self.threads: list[int] = []
        self.result = result

    def __call__(self, texts: list[str]) -> Any:
        self.calls.append(list(texts))
        self.threads.append(threading.get_ident())
        if isinstance(self.result, BaseException):
            raise self.result
        if callable(self.result):
            return self.result(texts)
        return stub_vectors(texts) if self.result is None else self.result


class FakeCompletion:
    """A completion function that records its arguments and answers from a script."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str | None, int | None, bool]] = []
        self.threads: list[int] = []

    def __call__(self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool) -> Any:
        self.calls.append((prompt, system, max_tokens, logprobs))
        self.threads.append(threading.get_ident())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


# =========================================================================== embedder
def test_callable_embedder_embeds_validates_and_learns_dim():
    batch = RecordingBatch()
    emb = CallableEmbedder(batch)
    out = emb.embed(["a dog", "a cat", "a dog"])
    assert out.dtype == np.float32 and out.shape == (3, DIM) and out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(out, np.asarray(stub_vectors(["a dog", "a cat", "a dog"]), dtype=np.float32))
    assert batch.calls == [["a dog", "a cat", "a dog"]]  # one call per batch
    assert emb.dim == DIM and len(batch.calls) == 1  # learned, no probe
    assert emb.embed([]).shape == (0, DIM) and len(batch.calls) == 1  # no call for nothing
    assert emb.embed(("a tuple",)).shape == (1, DIM)
    assert isinstance(emb, Embedder)


def test_callable_embedder_probes_dim_once_when_asked_first():
    batch = RecordingBatch()
    emb = CallableEmbedder(batch)
    assert emb.embed([]).shape == (0, 0)  # unknown yet, and no call
    assert emb.dim == DIM and emb.dim == DIM
    assert batch.calls == [[DIM_PROBE]]
    known = CallableEmbedder(RecordingBatch(), dim=DIM)
    assert known.dim == DIM and known._embed_batch.calls == []  # given: no probe


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (lambda texts: stub_vectors(texts)[:-1], "shape"),  # one row missing
        (lambda texts: [[1.0, 2.0]] + [[1.0]] * (len(texts) - 1), "numeric array"),  # ragged
        (lambda texts: [[float("nan")] * DIM for _ in texts], "NaN"),
        (lambda texts: "not vectors", "numeric array"),
        (lambda texts: [0.5] * DIM, "shape"),  # one flat vector
    ],
)
def test_callable_embedder_rejects_bad_vectors(result, match):
    emb = CallableEmbedder(RecordingBatch(result))
    with pytest.raises(EmbeddingError, match=match):
        emb.embed(["one", "two"])


def test_callable_embedder_checks_the_dimension():
    emb = CallableEmbedder(RecordingBatch(), dim=8)
    with pytest.raises(EmbeddingError, match=f"dimension {DIM}"):
        emb.embed(["x"])
    learned = CallableEmbedder(RecordingBatch())
    learned.embed(["x"])
    learned._embed_batch.result = lambda texts: stub_vectors(texts, dim=4)
    with pytest.raises(EmbeddingError, match="dimension 4"):
        learned.embed(["y"])  # another dimension than the first call's
    assert learned.dim == DIM


def test_callable_embedder_wraps_model_errors():
    boom = RuntimeError("provider down")
    emb = CallableEmbedder(RecordingBatch(boom), source="the test model Stub")
    with pytest.raises(
        ModelError, match="Embedding with the test model Stub failed: RuntimeError: provider down"
    ) as e:
        emb.embed(["x"])
    assert e.value.__cause__ is boom
    with pytest.raises(ModelError, match="RuntimeError: provider down"):
        asyncio.run(emb.aembed(["x"]))
    # a hiermem error raised inside passes through unchanged
    typed = EmbeddingError("already typed")
    with pytest.raises(EmbeddingError, match="already typed") as e2:
        CallableEmbedder(RecordingBatch(typed)).embed(["x"])
    assert e2.value is typed
    # the default source names the function
    with pytest.raises(ModelError, match="RecordingBatch"):
        CallableEmbedder(RecordingBatch(boom)).embed(["x"])


def test_callable_embedder_rejects_bad_arguments():
    emb = CallableEmbedder(RecordingBatch())
    with pytest.raises(InvalidInputError, match="CallableEmbedder.embed takes strings"):
        emb.embed(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        asyncio.run(emb.aembed([None]))  # type: ignore[list-item]
    for bad in (0, -3, True, "many", 2.5j):
        with pytest.raises(InvalidInputError, match="dim"):
            CallableEmbedder(RecordingBatch(), dim=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="embed_batch"):
        CallableEmbedder("not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="aembed_batch"):
        CallableEmbedder(RecordingBatch(), aembed_batch=42)  # type: ignore[arg-type]


def test_callable_embedder_async_uses_the_async_form():
    sync_batch = RecordingBatch()
    seen: list[list[str]] = []

    async def aembed_batch(texts: list[str]) -> list[list[float]]:
        seen.append(list(texts))
        await asyncio.sleep(0)
        return stub_vectors(texts)

    emb = CallableEmbedder(sync_batch, aembed_batch)
    out = asyncio.run(emb.aembed(["a dog", "a cat"]))
    assert seen == [["a dog", "a cat"]] and sync_batch.calls == []
    np.testing.assert_allclose(out, emb.embed(["a dog", "a cat"]))
    assert emb.dim == DIM


def test_callable_embedder_async_falls_back_to_a_worker_thread():
    batch = RecordingBatch()
    emb = CallableEmbedder(batch)

    async def run() -> tuple[np.ndarray, int]:
        return await emb.aembed(["a dog"]), threading.get_ident()

    out, loop_thread = asyncio.run(run())
    assert out.shape == (1, DIM) and batch.calls == [["a dog"]]
    assert batch.threads[0] != loop_thread  # the event loop was not blocked by the sync call
    assert asyncio.run(emb.aembed([])).shape == (0, DIM) and len(batch.calls) == 1


def test_callable_embedder_is_thread_safe_when_learning_dim():
    emb = CallableEmbedder(RecordingBatch())
    results: list[tuple[int, ...]] = []

    def work(i: int) -> None:
        results.append(emb.embed([f"text {i}", "more"]).shape)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(2, DIM)] * 8 and emb.dim == DIM


# =========================================================================== LLM
def test_callable_llm_returns_completions_and_counts_usage():
    fake = FakeCompletion("first", Reply("second", prompt_tokens=11, completion_tokens=3))
    llm = CallableLLM(fake)
    assert isinstance(llm, LLM)
    c1 = llm.complete("the prompt", system="be brief", max_tokens=7)
    assert c1.text == "first" and c1.logprobs is None
    assert (c1.usage.llm_calls, c1.usage.prompt_tokens, c1.usage.completion_tokens) == (1, 0, 0)
    assert c1.usage.seconds >= 0.0
    assert fake.calls[0] == ("the prompt", "be brief", 7, False)
    c2 = llm.complete("again")
    assert (c2.text, c2.usage.prompt_tokens, c2.usage.completion_tokens) == ("second", 11, 3)
    assert fake.calls[1] == ("again", None, None, False)
    total = llm.usage
    assert (total.llm_calls, total.prompt_tokens, total.completion_tokens) == (2, 11, 3)
    assert total.seconds == pytest.approx(c1.usage.seconds + c2.usage.seconds)
    total.llm_calls = 99  # a copy
    assert llm.usage.llm_calls == 2
    llm.reset_usage()
    assert llm.usage == Usage()


def test_callable_llm_logprobs_only_when_asked():
    fake = FakeCompletion(Reply("MERGE_1", logprobs=[-0.5, -0.25]))
    llm = CallableLLM(fake)
    assert llm.complete("pick", logprobs=True).logprobs == [-0.5, -0.25]
    assert fake.calls[-1][3] is True
    assert llm.complete("pick").logprobs is None  # given, but not asked for
    assert CallableLLM(FakeCompletion("plain")).complete("pick", logprobs=True).logprobs is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt": ""},
        {"prompt": "   \n"},
        {"prompt": None},
        {"prompt": "ok", "system": 3},
        {"prompt": "ok", "max_tokens": 0},
        {"prompt": "ok", "max_tokens": True},
        {"prompt": "ok", "max_tokens": 2.5},
    ],
)
def test_callable_llm_checks_arguments_before_calling(kwargs):
    fake = FakeCompletion("never")
    llm = CallableLLM(fake)
    prompt = kwargs.pop("prompt")
    with pytest.raises(InvalidInputError):
        llm.complete(prompt, **kwargs)
    with pytest.raises(InvalidInputError):
        asyncio.run(llm.acomplete(prompt, **kwargs))
    assert fake.calls == [] and llm.usage == Usage()


def test_callable_llm_wraps_model_errors():
    boom = ConnectionError("503 from provider")
    llm = CallableLLM(FakeCompletion(boom), source="the test model Fake")
    with pytest.raises(ModelError, match="Completion with the test model Fake failed: ConnectionError") as e:
        llm.complete("hi")
    assert e.value.__cause__ is boom
    with pytest.raises(ModelError, match="503 from provider"):
        asyncio.run(llm.acomplete("hi"))
    assert llm.usage == Usage()  # failed calls are not counted
    typed = InvalidInputError("rejected by the adapter")
    with pytest.raises(InvalidInputError) as e2:
        CallableLLM(FakeCompletion(typed)).complete("hi")
    assert e2.value is typed
    with pytest.raises(ModelError, match="returned a dict"):
        CallableLLM(FakeCompletion({"text": "x"})).complete("hi")
    with pytest.raises(InvalidInputError, match="complete must be callable"):
        CallableLLM("gpt")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="acomplete"):
        CallableLLM(FakeCompletion("x"), acomplete="gpt")  # type: ignore[arg-type]


def test_callable_llm_async_uses_the_async_form():
    sync = FakeCompletion("sync answer")
    seen: list[tuple[str, str | None, int | None, bool]] = []

    async def acomplete(prompt: str, system: str | None, max_tokens: int | None, logprobs: bool) -> Reply:
        seen.append((prompt, system, max_tokens, logprobs))
        await asyncio.sleep(0)
        return Reply("async answer", prompt_tokens=2, completion_tokens=2, logprobs=[-1.0, -2.0])

    llm = CallableLLM(sync, acomplete)
    c = asyncio.run(llm.acomplete("hello", system="sys", max_tokens=5, logprobs=True))
    assert c.text == "async answer" and c.logprobs == [-1.0, -2.0] and c.usage.prompt_tokens == 2
    assert seen == [("hello", "sys", 5, True)] and sync.calls == []
    assert llm.usage.llm_calls == 1


def test_callable_llm_async_falls_back_to_a_worker_thread():
    fake = FakeCompletion("threaded")
    llm = CallableLLM(fake)

    async def run() -> tuple[str, int]:
        return (await llm.acomplete("hello")).text, threading.get_ident()

    text, loop_thread = asyncio.run(run())
    assert text == "threaded" and fake.threads[0] != loop_thread
    assert llm.usage.llm_calls == 1


def test_core_memory_runs_on_callables():
    """A SegTreeMem built from a CallableEmbedder and a CallableLLM (batch_llm compatibility calls)."""
    prompts: list[str] = []

    def complete(prompt: str, system: str | None, max_tokens: int | None, logprobs: bool) -> Reply:
        prompts.append(prompt)
        text = "SPLIT" if "MERGE_1" in prompt else "Facts about work and a dog."
        return Reply(text, prompt_tokens=len(prompt.split()), completion_tokens=len(text.split()))

    facts = ["Maria works as a nurse in Oslo.", "Her dog is called Luna.", "Luna likes the beach."]
    llm = CallableLLM(complete)
    mem = SegTreeMem(embedder=CallableEmbedder(stub_vectors), llm=llm, compat="batch_llm", relevance="dense")
    report = mem.add(facts)
    assert report.usage.llm_calls == len(prompts) == llm.usage.llm_calls > 0
    assert report.usage.prompt_tokens == llm.usage.prompt_tokens > 0
    assert mem.retrieve(facts[1], k=1)[0].text == facts[1]


# =========================================================================== helpers
def test_wrap_model_error_keeps_typed_errors_and_names_the_model():
    typed = EmbeddingError("bad rows")
    assert wrap_model_error(typed, "Embedding", "m") is typed
    err = wrap_model_error(KeyError("choices"), "Completion", "the LlamaIndex model OpenAI")
    assert isinstance(err, ModelError) and isinstance(err, HierMemError)
    assert str(err).startswith("Completion with the LlamaIndex model OpenAI failed: KeyError: 'choices'.")


def test_check_helpers():
    assert check_dim(None) is None and check_dim(3) == 3 and check_dim(np.int64(5)) == 5
    with pytest.raises(InvalidInputError):
        check_dim(False)
    check_completion_args("ok", None, None)
    check_completion_args("ok", "", 1)
    with pytest.raises(InvalidInputError, match="system"):
        check_completion_args("ok", b"sys", None)


def test_call_kwargs_and_prompt_input():
    class Model:
        model_fields = {"model_name": None, "max_tokens": None}

    fields = model_fields(Model())
    assert fields == {"model_name", "max_tokens"} and model_fields(object()) == frozenset()
    base = {"stop": ["\n"]}
    assert optional_call_kwargs(base, fields, max_tokens=7, logprobs=True) == {
        "stop": ["\n"],
        "max_tokens": 7,
    }
    assert base == {"stop": ["\n"]}  # not changed
    assert optional_call_kwargs({}, {"logprobs"}, max_tokens=7, logprobs=True) == {"logprobs": True}
    assert optional_call_kwargs({}, {"logprobs", "max_tokens"}, max_tokens=None, logprobs=False) == {}

    assert join_system("q", "rules") == "rules\n\nq" and join_system("q", None) == join_system("q", "") == "q"
    assert prompt_input("q", "rules") == "rules\n\nq"
    assert prompt_input("q", "rules", lambda role, text: (role, text)) == [("system", "rules"), ("user", "q")]
    assert prompt_input("q", None, lambda role, text: (role, text)) == [("user", "q")]


def test_token_counts_and_logprobs_readers():
    assert get_field({"a": 1}, "a") == 1 and get_field(SimpleNamespace(a=2), "a") == 2
    assert get_field(None, "a", 5) == 5 and get_field({}, "a") is None
    assert read_token_counts({"prompt_tokens": 4, "completion_tokens": 2}) == (4, 2)
    assert read_token_counts(SimpleNamespace(prompt_tokens=3, completion_tokens=None)) == (3, 0)
    assert read_token_counts({"input_tokens": 31, "output_tokens": 2}, "input_tokens", "output_tokens") == (
        31,
        2,
    )
    assert read_token_counts(None) == (0, 0)
    assert read_token_counts({"prompt_tokens": "n/a", "completion_tokens": [1]}) == (0, 0)

    assert openai_logprobs([{"token": "a", "logprob": -0.5}, {"logprob": -1}]) == [-0.5, -1.0]
    assert openai_logprobs([SimpleNamespace(logprob=-0.25)]) == [-0.25]
    assert openai_logprobs([]) is None and openai_logprobs(None) is None
    with pytest.raises(KeyError):
        openai_logprobs([{"token": "a"}])


class SyncOnlyEmbedder:
    """A core embedder without ``aembed``."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    dim = DIM

    def embed(self, texts: list[str]) -> np.ndarray:
        self.threads.append(threading.get_ident())
        return np.asarray(stub_vectors(list(texts)), dtype=np.float32)


def test_core_embedder_rows_for_frameworks():
    core = SyncOnlyEmbedder()
    rows = embed_rows(core, ("a dog", "a cat"))
    assert isinstance(rows, list) and isinstance(rows[0], list) and isinstance(rows[0][0], float)
    np.testing.assert_allclose(rows, np.asarray(stub_vectors(["a dog", "a cat"]), dtype=np.float32))
    assert embed_rows(core, []) == [] and len(core.threads) == 1

    async def run() -> tuple[list[list[float]], int]:
        return await aembed_rows(core, ["a dog"]), threading.get_ident()

    arows, loop_thread = asyncio.run(run())
    assert arows == rows[:1] and core.threads[-1] != loop_thread  # no aembed: worker thread
    assert asyncio.run(aembed_rows(core, [])) == []
    wrapped = CallableEmbedder(stub_vectors)
    assert asyncio.run(aembed_rows(wrapped, ["a cat"])) == rows[1:]  # uses its aembed

    assert core_embedder(core, "Owner") is core
    with pytest.raises(InvalidInputError, match="Owner needs a core embedder"):
        core_embedder(object(), "Owner")
