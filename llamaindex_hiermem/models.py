"""Model adapters between LlamaIndex and the hiermem core protocols, and model resolution.

* :class:`LlamaIndexEmbedder` turns a LlamaIndex :class:`~llama_index.core.base.embeddings.base.BaseEmbedding`
  into a core :class:`~shared_core.models.base.Embedder`.
* :class:`LlamaIndexLLM` turns a LlamaIndex :class:`~llama_index.core.llms.LLM` into a core
  :class:`~shared_core.models.base.LLM`.
* :class:`HierMemEmbedding` goes the other way: a core embedder (e.g. the embedded
  :class:`~shared_core.models.local.LocalEmbedder`) as a LlamaIndex ``BaseEmbedding``.
* :func:`resolve_embedder` / :func:`resolve_llm` pick the models of a memory built by this package: an
  explicit argument wins; else ``Settings.embed_model`` / ``Settings.llm`` when the user has set them;
  else the embedded defaults (the local embedder, no LLM). They never trigger LlamaIndex's implicit
  OpenAI default.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms import LLM as LlamaLLM

from shared_core.models.base import validate_embeddings
from shared_core.types import Completion, HierMemError, InvalidInputError, ModelError, Usage

__all__ = [
    "HierMemEmbedding",
    "LlamaIndexEmbedder",
    "LlamaIndexLLM",
    "as_core_embedder",
    "as_core_llm",
    "resolve_embedder",
    "resolve_llm",
]

# Text embedded to learn the dimension of an embedding model when it is asked before any call.
_DIM_PROBE = "dimension probe"


def _wrap_error(exc: BaseException, what: str, model: object) -> HierMemError:
    if isinstance(exc, HierMemError):
        return exc
    return ModelError(
        f"{what} with the LlamaIndex model {type(model).__name__} failed: {type(exc).__name__}: {exc}. "
        "Check the model's configuration (credentials, endpoint, model name)."
    )


# =========================================================================== embeddings
class LlamaIndexEmbedder:
    """A LlamaIndex ``BaseEmbedding`` as a hiermem :class:`~shared_core.models.base.Embedder`.

    Every text (stored messages, annotations and queries alike) is embedded with
    ``get_text_embedding_batch`` / ``aget_text_embedding_batch`` (one call per batch; the model splits it
    by its own ``embed_batch_size``), because the core compares queries and node texts in one vector
    space; query instructions of asymmetric models are therefore not applied.

    Args:
        embed_model: any LlamaIndex embedding model (e.g. ``OpenAIEmbedding``, ``HuggingFaceEmbedding``).
        dim: the vector dimension, if known; default ``None``: learned from the first call (or, when
            :attr:`dim` is read before any call, by embedding one short probe text).

    Raises:
        InvalidInputError: ``embed_model`` is not a LlamaIndex ``BaseEmbedding``, or ``dim < 1``.

    References:
        Core ``Embedder`` protocol (``shared_core/models/base.py``); LlamaIndex ``BaseEmbedding``.
    """

    def __init__(self, embed_model: BaseEmbedding, dim: int | None = None) -> None:
        if not isinstance(embed_model, BaseEmbedding):
            raise InvalidInputError(
                f"LlamaIndexEmbedder needs a LlamaIndex BaseEmbedding, got {type(embed_model).__name__}; "
                "pass a core embedder (with embed(texts)) to the memory directly instead."
            )
        if dim is not None and (isinstance(dim, bool) or int(dim) < 1):
            raise InvalidInputError(f"dim must be a positive integer or None, got {dim!r}.")
        self.embed_model = embed_model
        self._dim = int(dim) if dim is not None else None
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        """Vector dimension (learned from the first call when not given)."""
        if self._dim is None:
            self.embed([_DIM_PROBE])
        assert self._dim is not None
        return self._dim

    @staticmethod
    def _check(texts: Sequence[str]) -> list[str]:
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidInputError(f"LlamaIndexEmbedder.embed takes strings, got {type(t).__name__}.")
        return texts

    def _finish(self, raw: Any, n: int) -> np.ndarray:
        arr = validate_embeddings(raw, n, self._dim)
        with self._lock:
            if self._dim is None:
                self._dim = int(arr.shape[1])
        return arr

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` with one ``get_text_embedding_batch`` call.

        Returns:
            ``float32`` array of shape ``(len(texts), dim)``; ``(0, dim)`` for an empty list (no call once
            the dimension is known).

        Raises:
            InvalidInputError: an element is not a string.
            EmbeddingError: the model returned the wrong number of rows, another dimension, or NaN.
            ModelError: the LlamaIndex model raised.
        """
        texts = self._check(texts)
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        try:
            raw = self.embed_model.get_text_embedding_batch(texts)
        except Exception as e:
            raise _wrap_error(e, "Embedding", self.embed_model) from e
        return self._finish(raw, len(texts))

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed` with ``aget_text_embedding_batch``. Returns / Raises: as :meth:`embed`."""
        texts = self._check(texts)
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        try:
            raw = await self.embed_model.aget_text_embedding_batch(texts)
        except Exception as e:
            raise _wrap_error(e, "Embedding", self.embed_model) from e
        return self._finish(raw, len(texts))

    def __repr__(self) -> str:
        return f"LlamaIndexEmbedder({type(self.embed_model).__name__}, dim={self._dim})"


class HierMemEmbedding(BaseEmbedding):
    """A hiermem embedder (e.g. :class:`~shared_core.models.local.LocalEmbedder`) as a LlamaIndex
    ``BaseEmbedding``.

    Handy to use the embedded offline model anywhere LlamaIndex expects an embedding model
    (``Settings.embed_model = HierMemEmbedding()``, vector indices, memory blocks, tests). A memory built by
    this package from a ``HierMemEmbedding`` uses the wrapped embedder directly (no round trip).

    Args:
        embedder: a core embedder (``embed(texts) -> float32 (n, dim)``); default ``None`` = a new
            :class:`~shared_core.models.local.LocalEmbedder` (all-MiniLM-L6-v2, 384-d, offline).
        embed_batch_size: texts per call when LlamaIndex batches, default 64.
        **kwargs: other ``BaseEmbedding`` fields (e.g. ``callback_manager``).

    Raises:
        InvalidInputError: ``embedder`` has no ``embed`` method.

    References:
        LlamaIndex ``BaseEmbedding`` interface; core ``Embedder`` protocol.
    """

    _embedder: Any = PrivateAttr()

    def __init__(self, embedder: Any = None, embed_batch_size: int = 64, **kwargs: Any) -> None:
        if embedder is None:
            from shared_core.models.local import LocalEmbedder

            embedder = LocalEmbedder()
        if not callable(getattr(embedder, "embed", None)):
            raise InvalidInputError(
                f"HierMemEmbedding needs a core embedder with embed(texts), got {type(embedder).__name__}."
            )
        kwargs.setdefault("model_name", str(getattr(embedder, "name", type(embedder).__name__)))
        super().__init__(embed_batch_size=embed_batch_size, **kwargs)
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "HierMemEmbedding"

    @property
    def embedder(self) -> Any:
        """The wrapped core embedder."""
        return self._embedder

    def _rows(self, vecs: Any) -> list[list[float]]:
        return np.asarray(vecs, dtype=np.float32).tolist()

    async def _aembed(self, texts: list[str]) -> list[list[float]]:
        if hasattr(self._embedder, "aembed"):
            return self._rows(await self._embedder.aembed(texts))
        return self._rows(await asyncio.to_thread(self._embedder.embed, texts))  # pragma: no cover

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._rows(self._embedder.embed([query]))[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._aembed([query]))[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._rows(self._embedder.embed([text]))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aembed([text]))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._rows(self._embedder.embed(list(texts))) if texts else []

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await self._aembed(list(texts)) if texts else []


# =========================================================================== LLM
class LlamaIndexLLM:
    """A LlamaIndex ``LLM`` as a hiermem :class:`~shared_core.models.base.LLM`.

    A chat model (``llm.metadata.is_chat_model``) receives ``[system, user]`` chat messages through
    ``chat`` / ``achat``; a completion model receives ``system + "\\n\\n" + prompt`` through ``complete`` /
    ``acomplete``. ``max_tokens`` is sent with the call when the model has a ``max_tokens`` field (OpenAI,
    Anthropic, ...; a value fixed on the model itself takes precedence there), and ``logprobs=True`` when
    it has a ``logprobs`` field (OpenAI); otherwise they are not sent.

    Usage: prompt / completion tokens from the response's ``additional_kwargs`` (LlamaIndex's OpenAI
    models put the provider's counts there) or the raw response's ``usage``, else 0; ``llm_calls`` = 1 per
    call; ``seconds`` = wall time. Log-probabilities (natural log, one per answer token): read from the raw
    OpenAI-format response (``choices[0].logprobs.content``), else the first alternative of each entry of
    the response's ``logprobs``, when asked for and present.

    Args:
        llm: a LlamaIndex LLM (e.g. ``llama_index.llms.openai.OpenAI``).
        **call_kwargs: extra keyword arguments for every call.

    Attributes:
        usage: cumulative :class:`~shared_core.types.Usage` over all calls (a copy).

    Raises:
        InvalidInputError: ``llm`` is not a LlamaIndex LLM.

    References:
        Core ``LLM`` protocol (``shared_core/models/base.py``); LlamaIndex ``LLM.chat`` / ``LLM.complete``.
    """

    def __init__(self, llm: LlamaLLM, **call_kwargs: Any) -> None:
        if not isinstance(llm, LlamaLLM):
            raise InvalidInputError(
                f"LlamaIndexLLM needs a LlamaIndex LLM, got {type(llm).__name__}; "
                "pass a core LLM (with complete()) to the memory directly instead."
            )
        self.llm = llm
        self.call_kwargs = dict(call_kwargs)
        self._fields = set(getattr(type(llm), "model_fields", None) or {})
        self._usage = Usage()
        self._lock = threading.Lock()

    @property
    def usage(self) -> Usage:
        """Cumulative usage since creation (a copy)."""
        with self._lock:
            return self._usage.copy()

    @property
    def _is_chat(self) -> bool:
        try:
            return bool(self.llm.metadata.is_chat_model)
        except Exception:  # pragma: no cover - metadata of third-party models
            return False

    def _prepare(
        self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool
    ) -> tuple[Any, dict[str, Any]]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("prompt must be a non-empty string.")
        if system is not None and not isinstance(system, str):
            raise InvalidInputError(f"system must be a string or None, got {type(system).__name__}.")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise InvalidInputError(f"max_tokens must be a positive int or None, got {max_tokens!r}.")
        kw = dict(self.call_kwargs)
        if max_tokens is not None and "max_tokens" in self._fields:
            kw["max_tokens"] = max_tokens
        if logprobs and "logprobs" in self._fields:
            kw["logprobs"] = True
        if self._is_chat:
            msgs = [ChatMessage(role=MessageRole.SYSTEM, content=system)] if system else []
            msgs.append(ChatMessage(role=MessageRole.USER, content=prompt))
            return msgs, kw
        return (f"{system}\n\n{prompt}" if system else prompt), kw

    @staticmethod
    def _counts(resp: Any) -> tuple[int, int]:
        extra = getattr(resp, "additional_kwargs", None) or {}
        if "prompt_tokens" in extra or "completion_tokens" in extra:
            return int(extra.get("prompt_tokens") or 0), int(extra.get("completion_tokens") or 0)
        raw = getattr(resp, "raw", None)
        u = raw.get("usage") if isinstance(raw, dict) else getattr(raw, "usage", None)
        if isinstance(u, dict):
            return int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
        return int(getattr(u, "prompt_tokens", 0) or 0), int(getattr(u, "completion_tokens", 0) or 0)

    @staticmethod
    def _logprobs(resp: Any) -> list[float] | None:
        raw = getattr(resp, "raw", None)
        try:
            if isinstance(raw, dict):
                content = ((raw.get("choices") or [{}])[0].get("logprobs") or {}).get("content")
                if content:
                    return [float(t["logprob"]) for t in content]
            elif raw is not None:
                content = getattr(getattr(raw.choices[0], "logprobs", None), "content", None)
                if content:
                    return [float(t.logprob) for t in content]
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            pass
        lps = getattr(resp, "logprobs", None)
        if lps:
            return [float(alts[0].logprob) for alts in lps if alts]
        return None

    def _finish(self, resp: Any, seconds: float, logprobs: bool) -> Completion:
        if self._is_chat:
            text = resp.message.content or ""
        else:
            text = resp.text or ""
        p, c = self._counts(resp)
        usage = Usage(llm_calls=1, prompt_tokens=p, completion_tokens=c, seconds=seconds)
        comp = Completion(text=str(text), usage=usage, logprobs=self._logprobs(resp) if logprobs else None)
        with self._lock:
            self._usage += usage
        return comp

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
            ModelError: the LlamaIndex model raised.
        """
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        t0 = time.perf_counter()
        try:
            resp = self.llm.chat(inp, **kw) if self._is_chat else self.llm.complete(inp, **kw)
        except Exception as e:
            raise _wrap_error(e, "Completion", self.llm) from e
        return self._finish(resp, time.perf_counter() - t0, logprobs)

    async def acomplete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Async :meth:`complete` (``achat`` / ``acomplete``). Args/Returns/Raises: as :meth:`complete`."""
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        t0 = time.perf_counter()
        try:
            if self._is_chat:
                resp = await self.llm.achat(inp, **kw)
            else:
                resp = await self.llm.acomplete(inp, **kw)
        except Exception as e:
            raise _wrap_error(e, "Completion", self.llm) from e
        return self._finish(resp, time.perf_counter() - t0, logprobs)

    def __repr__(self) -> str:
        return f"LlamaIndexLLM({type(self.llm).__name__})"


# =========================================================================== coercion and resolution
def as_core_embedder(embed_model: Any) -> Any:
    """Return a core embedder for ``embed_model``.

    A :class:`HierMemEmbedding` is unwrapped; any other LlamaIndex ``BaseEmbedding`` is wrapped in
    :class:`LlamaIndexEmbedder`; a core embedder (or ``None``) is returned unchanged.

    Raises:
        InvalidInputError: neither a LlamaIndex embedding model nor an object with ``embed(texts)``.
    """
    if embed_model is None:
        return None
    if isinstance(embed_model, HierMemEmbedding):
        return embed_model.embedder
    if isinstance(embed_model, BaseEmbedding):
        return LlamaIndexEmbedder(embed_model)
    if callable(getattr(embed_model, "embed", None)):
        return embed_model
    raise InvalidInputError(
        "embed_model must be a LlamaIndex BaseEmbedding or a core embedder, "
        f"got {type(embed_model).__name__}."
    )


def as_core_llm(llm: Any) -> Any:
    """Return a core LLM for ``llm``.

    A LlamaIndex ``LLM`` is wrapped in :class:`LlamaIndexLLM`; a core LLM (or ``None``) is returned unchanged.

    Raises:
        InvalidInputError: neither a LlamaIndex LLM nor an object with ``complete(prompt)``.
    """
    if llm is None:
        return None
    if isinstance(llm, LlamaLLM):
        return LlamaIndexLLM(llm)
    if callable(getattr(llm, "complete", None)):
        return llm
    raise InvalidInputError(f"llm must be a LlamaIndex LLM or a core LLM, got {type(llm).__name__}.")


def _settings_model(attr: str) -> Any:
    """What the user set in ``Settings`` (its private slot, so reading never builds the OpenAI default).

    LlamaIndex's "disabled" placeholders (exactly ``MockLLM`` / ``MockEmbedding``, which
    ``Settings.llm = None`` / ``Settings.embed_model = None`` install) count as not set: they carry
    nothing a memory could use (a ``MockEmbedding`` gives every text the same vector).
    """
    from llama_index.core import Settings
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM

    value = getattr(Settings, attr, None)
    if type(value) in (MockLLM, MockEmbedding):
        return None
    return value


def resolve_embedder(embed_model: Any = None) -> Any:
    """The core embedder for a memory built by this package.

    Args:
        embed_model: a LlamaIndex ``BaseEmbedding``, a core embedder, or ``None``.

    Returns:
        ``embed_model`` as a core embedder when given; else ``Settings.embed_model`` when the user set
        it (not a ``MockEmbedding``); else a new :class:`~shared_core.models.local.LocalEmbedder`
        (all-MiniLM-L6-v2, 384-d, offline). Never LlamaIndex's implicit OpenAI default.

    Raises:
        InvalidInputError: ``embed_model`` is of an unsupported type.
    """
    chosen = embed_model if embed_model is not None else _settings_model("_embed_model")
    if chosen is None:
        from shared_core.models.local import LocalEmbedder

        return LocalEmbedder()
    return as_core_embedder(chosen)


def resolve_llm(llm: Any = None) -> Any:
    """The core LLM for a memory built by this package.

    Args:
        llm: a LlamaIndex ``LLM``, a core LLM, or ``None``.

    Returns:
        ``llm`` as a core LLM when given; else ``Settings.llm`` when the user set it (not a ``MockLLM``);
        else ``None`` (the LLM-free mode). Never LlamaIndex's implicit OpenAI default.

    Raises:
        InvalidInputError: ``llm`` is of an unsupported type.
    """
    return as_core_llm(llm if llm is not None else _settings_model("_llm"))
