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

The adapters only translate between LlamaIndex's calls and plain callables; checking, vector validation,
dimension probing, error wrapping and usage counting are done once in :mod:`shared_core.models.adapt`.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms import LLM as LlamaLLM

from shared_core.models import adapt
from shared_core.types import InvalidInputError

__all__ = [
    "HierMemEmbedding",
    "LlamaIndexEmbedder",
    "LlamaIndexLLM",
    "as_core_embedder",
    "as_core_llm",
    "resolve_embedder",
    "resolve_llm",
]


def _source(model: object) -> str:
    return f"the LlamaIndex model {type(model).__name__}"


def _message(role: str, content: str) -> ChatMessage:
    return ChatMessage(role=MessageRole(role), content=content)


# =========================================================================== embeddings
class LlamaIndexEmbedder(adapt.CallableEmbedder):
    """A LlamaIndex ``BaseEmbedding`` as a hiermem :class:`~shared_core.models.base.Embedder`.

    Every text (stored messages, annotations and queries alike) is embedded with
    ``get_text_embedding_batch`` / ``aget_text_embedding_batch`` (one call per batch; the model splits it
    by its own ``embed_batch_size``), because the core compares queries and node texts in one vector
    space; query instructions of asymmetric models are therefore not applied. ``embed`` / ``aembed`` /
    ``dim`` behave as in :class:`~shared_core.models.adapt.CallableEmbedder` (``ModelError`` when the
    LlamaIndex model raises, ``EmbeddingError`` for vectors of the wrong shape or with NaN).

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
        self.embed_model = embed_model
        super().__init__(
            embed_model.get_text_embedding_batch,
            embed_model.aget_text_embedding_batch,
            dim=dim,
            source=_source(embed_model),
        )

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
        embedder = adapt.core_embedder(embedder, "HierMemEmbedding")
        kwargs.setdefault("model_name", str(getattr(embedder, "name", type(embedder).__name__)))
        super().__init__(embed_batch_size=embed_batch_size, **kwargs)
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's serialisation name of this class.

        Returns:
            ``"HierMemEmbedding"``.
        """
        return "HierMemEmbedding"

    @property
    def embedder(self) -> Any:
        """The wrapped core embedder."""
        return self._embedder

    def _get_query_embedding(self, query: str) -> list[float]:
        return adapt.embed_rows(self._embedder, [query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await adapt.aembed_rows(self._embedder, [query]))[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return adapt.embed_rows(self._embedder, [text])[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await adapt.aembed_rows(self._embedder, [text]))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return adapt.embed_rows(self._embedder, texts)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await adapt.aembed_rows(self._embedder, texts)


# =========================================================================== LLM
class LlamaIndexLLM(adapt.CallableLLM):
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
    the response's ``logprobs``, when asked for and present. ``complete`` / ``acomplete`` raise
    ``InvalidInputError`` for an empty prompt or a bad ``system`` / ``max_tokens``, and ``ModelError``
    when the LlamaIndex model raises.

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
        self._fields = adapt.model_fields(llm)
        super().__init__(self._call, self._acall, source=_source(llm))

    @property
    def _is_chat(self) -> bool:
        try:
            return bool(self.llm.metadata.is_chat_model)
        except Exception:  # pragma: no cover - metadata of third-party models
            return False

    def _prepare(
        self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool
    ) -> tuple[Any, dict[str, Any]]:
        kw = adapt.optional_call_kwargs(
            self.call_kwargs, self._fields, max_tokens=max_tokens, logprobs=logprobs
        )
        return adapt.prompt_input(prompt, system, _message if self._is_chat else None), kw

    @staticmethod
    def _counts(resp: Any) -> tuple[int, int]:
        extra = getattr(resp, "additional_kwargs", None) or {}
        if "prompt_tokens" in extra or "completion_tokens" in extra:
            return adapt.read_token_counts(extra)
        return adapt.read_token_counts(adapt.get_field(getattr(resp, "raw", None), "usage"))

    @staticmethod
    def _logprobs(resp: Any) -> list[float] | None:
        raw = getattr(resp, "raw", None)
        try:
            choices = adapt.get_field(raw, "choices") or [None]
            found = adapt.openai_logprobs(adapt.get_field(adapt.get_field(choices[0], "logprobs"), "content"))
            if found is not None:
                return found
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            pass
        lps = getattr(resp, "logprobs", None)
        if lps:
            return [float(alts[0].logprob) for alts in lps if alts]
        return None

    def _reply(self, resp: Any, logprobs: bool) -> adapt.Reply:
        text = resp.message.content if self._is_chat else resp.text
        p, c = self._counts(resp)
        return adapt.Reply(
            text=str(text or ""),
            prompt_tokens=p,
            completion_tokens=c,
            logprobs=self._logprobs(resp) if logprobs else None,
        )

    def _call(self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool) -> adapt.Reply:
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        resp = self.llm.chat(inp, **kw) if self._is_chat else self.llm.complete(inp, **kw)
        return self._reply(resp, logprobs)

    async def _acall(
        self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool
    ) -> adapt.Reply:
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        resp = await (self.llm.achat(inp, **kw) if self._is_chat else self.llm.acomplete(inp, **kw))
        return self._reply(resp, logprobs)

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
