"""Model adapters between LangChain and the hiermem core protocols.

* :class:`LangChainEmbedder` turns a LangChain :class:`~langchain_core.embeddings.Embeddings` into a core
  :class:`~shared_core.models.base.Embedder`.
* :class:`LangChainLLM` turns a LangChain chat model or text LLM into a core
  :class:`~shared_core.models.base.LLM`.
* :class:`HierMemEmbeddings` goes the other way: a core embedder (e.g. the embedded
  :class:`~shared_core.models.local.LocalEmbedder`) as a LangChain ``Embeddings``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel, BaseLanguageModel, BaseLLM
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from shared_core.models.base import validate_embeddings
from shared_core.types import Completion, HierMemError, InvalidInputError, ModelError, Usage

__all__ = ["HierMemEmbeddings", "LangChainEmbedder", "LangChainLLM", "as_core_embedder", "as_core_llm"]

# Text embedded to learn the dimension of an embeddings model when it is asked before any call.
_DIM_PROBE = "dimension probe"


def _wrap_error(exc: BaseException, what: str, model: object) -> HierMemError:
    if isinstance(exc, HierMemError):
        return exc
    return ModelError(
        f"{what} with the LangChain model {type(model).__name__} failed: {type(exc).__name__}: {exc}. "
        "Check the model's configuration (credentials, endpoint, model name)."
    )


# =========================================================================== embeddings
class LangChainEmbedder:
    """A LangChain ``Embeddings`` as a hiermem :class:`~shared_core.models.base.Embedder`.

    Every text (stored messages, annotations and queries alike) is embedded with
    ``embed_documents`` / ``aembed_documents``, one call per batch, because the core compares queries and
    node texts in one vector space.

    Args:
        embeddings: any LangChain ``Embeddings`` (e.g. ``OpenAIEmbeddings``, ``HuggingFaceEmbeddings``).
        dim: the vector dimension, if known; default ``None``: learned from the first call (or, when
            :attr:`dim` is read before any call, by embedding one short probe text).

    Raises:
        InvalidInputError: ``embeddings`` has no ``embed_documents`` method, or ``dim < 1``.

    References:
        Core ``Embedder`` protocol (``shared_core/models/base.py``); LangChain ``Embeddings`` interface.
    """

    def __init__(self, embeddings: Embeddings, dim: int | None = None) -> None:
        if not hasattr(embeddings, "embed_documents"):
            raise InvalidInputError(
                f"LangChainEmbedder needs a LangChain Embeddings (with embed_documents), got "
                f"{type(embeddings).__name__}; pass a core embedder directly to the memory instead."
            )
        if dim is not None and (isinstance(dim, bool) or int(dim) < 1):
            raise InvalidInputError(f"dim must be a positive integer or None, got {dim!r}.")
        self.embeddings = embeddings
        self._dim = int(dim) if dim is not None else None
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        """Vector dimension (learned from the first call when not given)."""
        if self._dim is None:
            self.embed([_DIM_PROBE])
        assert self._dim is not None
        return self._dim

    def _check(self, texts: Sequence[str]) -> list[str]:
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidInputError(f"LangChainEmbedder.embed takes strings, got {type(t).__name__}.")
        return texts

    def _finish(self, raw: Any, n: int) -> np.ndarray:
        arr = validate_embeddings(raw, n, self._dim)
        with self._lock:
            if self._dim is None:
                self._dim = int(arr.shape[1])
        return arr

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` with one ``embed_documents`` call.

        Returns:
            ``float32`` array of shape ``(len(texts), dim)``; ``(0, dim)`` for an empty list (no call).

        Raises:
            InvalidInputError: an element is not a string.
            EmbeddingError: the model returned the wrong number of rows, another dimension, or NaN.
            ModelError: the LangChain model raised.
        """
        texts = self._check(texts)
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        try:
            raw = self.embeddings.embed_documents(texts)
        except Exception as e:
            raise _wrap_error(e, "Embedding", self.embeddings) from e
        return self._finish(raw, len(texts))

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed` with ``aembed_documents``. Returns / Raises: as :meth:`embed`."""
        texts = self._check(texts)
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        try:
            raw = await self.embeddings.aembed_documents(texts)
        except Exception as e:
            raise _wrap_error(e, "Embedding", self.embeddings) from e
        return self._finish(raw, len(texts))

    def __repr__(self) -> str:
        return f"LangChainEmbedder({type(self.embeddings).__name__}, dim={self._dim})"


class HierMemEmbeddings(Embeddings):
    """A hiermem embedder (e.g. the local MiniLM) as a LangChain ``Embeddings``.

    Handy to use the embedded offline model anywhere LangChain expects embeddings (vector stores,
    LangGraph stores, tests).

    Args:
        embedder: a core embedder (``embed(texts) -> float32 (n, dim)``); default ``None`` = a new
            :class:`~shared_core.models.local.LocalEmbedder` (all-MiniLM-L6-v2, 384-d).

    Raises:
        InvalidInputError: ``embedder`` has no ``embed`` method.

    References:
        LangChain ``Embeddings`` interface; core ``Embedder`` protocol.
    """

    def __init__(self, embedder: Any = None) -> None:
        if embedder is None:
            from shared_core.models.local import LocalEmbedder

            embedder = LocalEmbedder()
        if not hasattr(embedder, "embed"):
            raise InvalidInputError(
                f"HierMemEmbeddings needs a core embedder with embed(texts), got {type(embedder).__name__}."
            )
        self.embedder = embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts in one call. Returns one ``list[float]`` of length ``dim`` per text."""
        if not texts:
            return []
        return np.asarray(self.embedder.embed(list(texts)), dtype=np.float32).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one text. Returns a ``list[float]`` of length ``dim``."""
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents` (the embedder's ``aembed`` when it has one)."""
        if not texts:
            return []
        if hasattr(self.embedder, "aembed"):
            vecs = await self.embedder.aembed(list(texts))
        else:  # pragma: no cover - every core embedder has aembed
            import asyncio

            vecs = await asyncio.to_thread(self.embedder.embed, list(texts))
        return np.asarray(vecs, dtype=np.float32).tolist()

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`."""
        return (await self.aembed_documents([text]))[0]


# =========================================================================== LLM
def _model_fields(model: object) -> set[str]:
    fields = getattr(type(model), "model_fields", None) or {}
    return set(fields)


class LangChainLLM:
    """A LangChain chat model (``BaseChatModel``) or text LLM (``BaseLLM``) as a hiermem
    :class:`~shared_core.models.base.LLM`.

    A chat model receives ``[SystemMessage(system), HumanMessage(prompt)]``; a text LLM receives
    ``system + "\\n\\n" + prompt``. ``max_tokens`` is passed to the call when the model has a
    ``max_tokens`` field (OpenAI, Anthropic, ...), and ``logprobs=True`` when the model has a ``logprobs``
    field (OpenAI); otherwise they are not sent (no cap, no log-probabilities).

    Usage: prompt / completion tokens from the answer's ``usage_metadata`` (chat) or
    ``llm_output["token_usage"]`` (text LLMs) when present, else 0; ``llm_calls`` = 1 per call; ``seconds``
    = wall time. Log-probabilities: natural-log floats from ``response_metadata["logprobs"]["content"]``
    (OpenAI format) or ``generation_info["logprobs"]["token_logprobs"]``, when asked for and present.

    Args:
        model: a LangChain ``BaseChatModel`` or ``BaseLLM``.
        **invoke_kwargs: extra keyword arguments for every call (e.g. ``stop=[...]``).

    Attributes:
        usage: cumulative :class:`~shared_core.types.Usage` over all calls (a copy).

    Raises:
        InvalidInputError: ``model`` is not a LangChain language model.

    References:
        Core ``LLM`` protocol (``shared_core/models/base.py``); LangChain ``AIMessage.usage_metadata``.
    """

    def __init__(self, model: BaseChatModel | BaseLLM, **invoke_kwargs: Any) -> None:
        if not isinstance(model, BaseLanguageModel):
            raise InvalidInputError(
                f"LangChainLLM needs a LangChain chat model or LLM, got {type(model).__name__}; "
                "pass a core LLM (with complete()) to the memory directly instead."
            )
        self.model = model
        self.invoke_kwargs = dict(invoke_kwargs)
        self._is_chat = isinstance(model, BaseChatModel)
        self._fields = _model_fields(model)
        self._usage = Usage()
        self._lock = threading.Lock()

    @property
    def usage(self) -> Usage:
        """Cumulative usage since creation (a copy)."""
        with self._lock:
            return self._usage.copy()

    def _prepare(
        self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool
    ) -> tuple[Any, dict[str, Any]]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("prompt must be a non-empty string.")
        if system is not None and not isinstance(system, str):
            raise InvalidInputError(f"system must be a string or None, got {type(system).__name__}.")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            raise InvalidInputError(f"max_tokens must be a positive int or None, got {max_tokens!r}.")
        if max_tokens is not None and max_tokens < 1:
            raise InvalidInputError(f"max_tokens must be a positive int or None, got {max_tokens!r}.")
        kw = dict(self.invoke_kwargs)
        if max_tokens is not None and "max_tokens" in self._fields:
            kw["max_tokens"] = max_tokens
        if logprobs and "logprobs" in self._fields:
            kw["logprobs"] = True
        if self._is_chat:
            msgs: list[BaseMessage] = [SystemMessage(content=system)] if system else []
            msgs.append(HumanMessage(content=prompt))
            return msgs, kw
        return (f"{system}\n\n{prompt}" if system else prompt), kw

    def _from_message(self, msg: Any, seconds: float, logprobs: bool) -> Completion:
        text = str(msg.text) if hasattr(msg, "text") else str(msg.content)
        um = getattr(msg, "usage_metadata", None) or {}
        usage = Usage(
            llm_calls=1,
            prompt_tokens=int(um.get("input_tokens", 0) or 0),
            completion_tokens=int(um.get("output_tokens", 0) or 0),
            seconds=seconds,
        )
        lps = None
        if logprobs:
            lp = (getattr(msg, "response_metadata", None) or {}).get("logprobs")
            if isinstance(lp, dict) and lp.get("content"):
                lps = [float(t["logprob"]) for t in lp["content"]]
        return self._record(Completion(text=text, usage=usage, logprobs=lps))

    def _from_result(self, result: Any, seconds: float, logprobs: bool) -> Completion:
        gen = result.generations[0][0]
        tu = (result.llm_output or {}).get("token_usage") or {}
        usage = Usage(
            llm_calls=1,
            prompt_tokens=int(tu.get("prompt_tokens", 0) or 0),
            completion_tokens=int(tu.get("completion_tokens", 0) or 0),
            seconds=seconds,
        )
        lps = None
        if logprobs:
            lp = (gen.generation_info or {}).get("logprobs")
            if isinstance(lp, dict) and lp.get("token_logprobs"):
                lps = [float(x) for x in lp["token_logprobs"] if x is not None]
        return self._record(Completion(text=gen.text, usage=usage, logprobs=lps))

    def _record(self, c: Completion) -> Completion:
        with self._lock:
            self._usage += c.usage
        return c

    def complete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Complete ``prompt`` with one model call.

        Args:
            prompt: the user prompt (non-empty string).
            system: an optional system instruction.
            max_tokens: cap on completion tokens (sent when the model has a ``max_tokens`` field).
            logprobs: ask for per-token log-probabilities (sent when the model has a ``logprobs`` field).

        Returns:
            :class:`~shared_core.types.Completion` with ``text``, ``usage`` and ``logprobs`` (or ``None``).

        Raises:
            InvalidInputError: empty prompt, bad ``system`` or ``max_tokens``.
            ModelError: the LangChain model raised.
        """
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        t0 = time.perf_counter()
        try:
            if self._is_chat:
                msg = self.model.invoke(inp, **kw)
            else:
                res = self.model.generate([inp], **kw)  # type: ignore[attr-defined]
        except Exception as e:
            raise _wrap_error(e, "Completion", self.model) from e
        dt = time.perf_counter() - t0
        return (
            self._from_message(msg, dt, logprobs) if self._is_chat else self._from_result(res, dt, logprobs)
        )

    async def acomplete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Async :meth:`complete` (``ainvoke`` / ``agenerate``). Args, Returns, Raises: as ``complete``."""
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        t0 = time.perf_counter()
        try:
            if self._is_chat:
                msg = await self.model.ainvoke(inp, **kw)
            else:
                res = await self.model.agenerate([inp], **kw)  # type: ignore[attr-defined]
        except Exception as e:
            raise _wrap_error(e, "Completion", self.model) from e
        dt = time.perf_counter() - t0
        return (
            self._from_message(msg, dt, logprobs) if self._is_chat else self._from_result(res, dt, logprobs)
        )

    def __repr__(self) -> str:
        return f"LangChainLLM({type(self.model).__name__})"


# =========================================================================== coercion helpers
def as_core_embedder(embedder: Any) -> Any:
    """Return a core embedder for ``embedder``.

    Args:
        embedder: a LangChain ``Embeddings`` (wrapped in :class:`LangChainEmbedder`; a
            :class:`HierMemEmbeddings` is unwrapped), a core embedder or ``None`` (the memory's default),
            both returned unchanged.

    References:
        Core ``Embedder`` protocol.
    """
    if isinstance(embedder, HierMemEmbeddings):
        return embedder.embedder
    if isinstance(embedder, Embeddings):
        return LangChainEmbedder(embedder)
    return embedder


def as_core_llm(llm: Any) -> Any:
    """Return a core LLM for ``llm``.

    Args:
        llm: a LangChain chat model or LLM (wrapped in :class:`LangChainLLM`), a core LLM or ``None``
            (the LLM-free mode), both returned unchanged.

    References:
        Core ``LLM`` protocol.
    """
    if isinstance(llm, BaseLanguageModel):
        return LangChainLLM(llm)
    return llm
