"""Model adapters between LangChain and the hiermem core protocols.

* :class:`LangChainEmbedder` turns a LangChain :class:`~langchain_core.embeddings.Embeddings` into a core
  :class:`~shared_core.models.base.Embedder`.
* :class:`LangChainLLM` turns a LangChain chat model or text LLM into a core
  :class:`~shared_core.models.base.LLM`.
* :class:`HierMemEmbeddings` goes the other way: a core embedder (e.g. the embedded
  :class:`~shared_core.models.local.LocalEmbedder`) as a LangChain ``Embeddings``.

The adapters only translate between LangChain's calls and plain callables; checking, vector validation,
dimension probing, error wrapping and usage counting are done once in :mod:`shared_core.models.adapt`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel, BaseLanguageModel, BaseLLM
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from shared_core.models import adapt
from shared_core.types import InvalidInputError

__all__ = [
    "HierMemEmbeddings",
    "LangChainEmbedder",
    "LangChainLLM",
    "as_core_embedder",
    "as_core_llm",
    "as_langchain_embeddings",
]


def _source(model: object) -> str:
    return f"the LangChain model {type(model).__name__}"


def _message(role: str, content: str) -> BaseMessage:
    return SystemMessage(content=content) if role == "system" else HumanMessage(content=content)


# =========================================================================== embeddings
class LangChainEmbedder(adapt.CallableEmbedder):
    """A LangChain ``Embeddings`` as a hiermem :class:`~shared_core.models.base.Embedder`.

    Every text (stored messages, annotations and queries alike) is embedded with
    ``embed_documents`` / ``aembed_documents``, one call per batch, because the core compares queries and
    node texts in one vector space. ``embed`` / ``aembed`` / ``dim`` behave as in
    :class:`~shared_core.models.adapt.CallableEmbedder` (``ModelError`` when the LangChain model raises,
    ``EmbeddingError`` for vectors of the wrong shape or with NaN).

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
        self.embeddings = embeddings
        super().__init__(
            embeddings.embed_documents,
            getattr(embeddings, "aembed_documents", None),
            dim=dim,
            source=_source(embeddings),
        )

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
        self.embedder = adapt.core_embedder(embedder, "HierMemEmbeddings")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts in one call.

        Args:
            texts: the texts.

        Returns:
            One ``list[float]`` of length ``dim`` per text; ``[]`` for no texts.
        """
        return adapt.embed_rows(self.embedder, texts)

    def embed_query(self, text: str) -> list[float]:
        """Embed one text.

        Args:
            text: the text.

        Returns:
            A ``list[float]`` of length ``dim``.
        """
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents` (the embedder's ``aembed``, else ``embed`` in a worker thread).

        Args:
            texts: the texts.

        Returns:
            One ``list[float]`` per text; ``[]`` for no texts.
        """
        return await adapt.aembed_rows(self.embedder, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`.

        Args:
            text: the text.

        Returns:
            A ``list[float]`` of length ``dim``.
        """
        return (await self.aembed_documents([text]))[0]


# =========================================================================== LLM
class LangChainLLM(adapt.CallableLLM):
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
    ``complete`` / ``acomplete`` (``invoke`` / ``generate`` and ``ainvoke`` / ``agenerate``) raise
    ``InvalidInputError`` for an empty prompt or a bad ``system`` / ``max_tokens``, and ``ModelError``
    when the LangChain model raises.

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
        self._fields = adapt.model_fields(model)
        super().__init__(self._call, self._acall, source=_source(model))

    def _prepare(
        self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool
    ) -> tuple[Any, dict[str, Any]]:
        kw = adapt.optional_call_kwargs(
            self.invoke_kwargs, self._fields, max_tokens=max_tokens, logprobs=logprobs
        )
        return adapt.prompt_input(prompt, system, _message if self._is_chat else None), kw

    @staticmethod
    def _from_message(msg: Any, logprobs: bool) -> adapt.Reply:
        text = str(msg.text) if hasattr(msg, "text") else str(msg.content)
        p, c = adapt.read_token_counts(getattr(msg, "usage_metadata", None), "input_tokens", "output_tokens")
        lps = None
        if logprobs:
            lp = (getattr(msg, "response_metadata", None) or {}).get("logprobs")
            lps = adapt.openai_logprobs(lp.get("content")) if isinstance(lp, dict) else None
        return adapt.Reply(text=text, prompt_tokens=p, completion_tokens=c, logprobs=lps)

    @staticmethod
    def _from_result(result: Any, logprobs: bool) -> adapt.Reply:
        gen = result.generations[0][0]
        p, c = adapt.read_token_counts((result.llm_output or {}).get("token_usage"))
        lps = None
        if logprobs:
            lp = (gen.generation_info or {}).get("logprobs")
            if isinstance(lp, dict) and lp.get("token_logprobs"):
                lps = [float(x) for x in lp["token_logprobs"] if x is not None]
        return adapt.Reply(text=gen.text, prompt_tokens=p, completion_tokens=c, logprobs=lps)

    def _call(self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool) -> adapt.Reply:
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        if self._is_chat:
            return self._from_message(self.model.invoke(inp, **kw), logprobs)
        return self._from_result(self.model.generate([inp], **kw), logprobs)  # type: ignore[attr-defined]

    async def _acall(
        self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool
    ) -> adapt.Reply:
        inp, kw = self._prepare(prompt, system, max_tokens, logprobs)
        if self._is_chat:
            return self._from_message(await self.model.ainvoke(inp, **kw), logprobs)
        return self._from_result(await self.model.agenerate([inp], **kw), logprobs)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"LangChainLLM({type(self.model).__name__})"


# =========================================================================== coercion helpers
def as_core_embedder(embedder: Any) -> Any:
    """Return a core embedder for ``embedder``.

    Args:
        embedder: a LangChain ``Embeddings`` (wrapped in :class:`LangChainEmbedder`; a
            :class:`HierMemEmbeddings` is unwrapped), a core embedder or ``None`` (the memory's default),
            both returned unchanged.

    Returns:
        The core embedder (or ``None``).

    Raises:
        InvalidInputError: ``embedder`` is a LangChain ``Embeddings`` without ``embed_documents``.

    References:
        Core ``Embedder`` protocol.
    """
    if isinstance(embedder, HierMemEmbeddings):
        return embedder.embedder
    if isinstance(embedder, Embeddings):
        return LangChainEmbedder(embedder)
    return embedder


def as_langchain_embeddings(embedder: Any) -> Embeddings | None:
    """Return a LangChain ``Embeddings`` for a core embedder (the inverse of :func:`as_core_embedder`).

    Args:
        embedder: a :class:`LangChainEmbedder` (its ``embeddings`` returned), another core embedder
            (wrapped in :class:`HierMemEmbeddings`), a LangChain ``Embeddings`` (returned) or ``None``.

    Returns:
        The ``Embeddings``, or ``None`` for ``None``.
    """
    if embedder is None or isinstance(embedder, Embeddings):
        return embedder
    if isinstance(embedder, LangChainEmbedder):
        return embedder.embeddings
    return HierMemEmbeddings(embedder)


def as_core_llm(llm: Any) -> Any:
    """Return a core LLM for ``llm``.

    Args:
        llm: a LangChain chat model or LLM (wrapped in :class:`LangChainLLM`), a core LLM or ``None``
            (the LLM-free mode), both returned unchanged.

    Returns:
        The core LLM (or ``None``).

    References:
        Core ``LLM`` protocol.
    """
    if isinstance(llm, BaseLanguageModel):
        return LangChainLLM(llm)
    return llm
