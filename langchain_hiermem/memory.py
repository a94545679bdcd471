"""Legacy LangChain ``BaseMemory`` classes (``ConversationChain(memory=...)``) over hiermem memories.

LangChain marks ``BaseMemory`` and ``ConversationChain`` deprecated in favour of
``langchain.agents.create_agent`` with a store; these classes are kept for users of that API. The
recommended path is :class:`~langchain_hiermem.store.HierMemStore` (or
:class:`~langchain_hiermem.retrievers.HierMemRetriever`).

This module needs ``langchain-classic`` (the ``legacy`` extra: ``pip install "hiermem[legacy]"``);
importing it without that package raises :class:`~langchain_hiermem.errors.MissingExtraError`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from datetime import datetime, timezone
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import ConfigDict, Field, field_validator

from shared_core.memories.base import HierarchicalMemory, count_tokens
from shared_core.types import Hit, InvalidInputError, Message

from .errors import AlgorithmUnavailableError, MissingExtraError
from .models import as_core_embedder, as_core_llm
from .retrievers import HierMemRetriever

try:
    from langchain_classic.base_memory import BaseMemory
    from langchain_classic.memory.utils import get_prompt_input_key
except ModuleNotFoundError as e:
    if e.name != "langchain_classic":
        raise
    raise MissingExtraError(
        "The legacy LangChain memories (HierMemMemory, SegTreeMemory, MemTreeMemory, HATMemory, "
        "XMemoryMemory) need the package langchain-classic, which is not installed: "
        'pip install "hiermem[legacy]". The retriever and the LangGraph store '
        "(HierMemRetriever, HierMemStore) do not need it.",
        extra="legacy",
        name="langchain_classic",
    ) from e

__all__ = [
    "AlgorithmUnavailableError",
    "HATMemory",
    "HierMemMemory",
    "MemTreeMemory",
    "SegTreeMemory",
    "XMemoryMemory",
]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class HierMemMemory(BaseMemory):
    """A hiermem memory as a (legacy) LangChain ``BaseMemory``.

    Each ``save_context`` stores the human input and the AI output as two core messages (roles
    ``user`` / ``assistant``, speakers ``human_prefix`` / ``ai_prefix``, a UTC ISO timestamp);
    ``load_memory_variables`` retrieves the nodes relevant to the current input and renders them under
    ``memory_key``, in chronological order of their spans: one line per node, ``"Human: ..."`` /
    ``"AI: ..."`` for stored turns and ``"Summary of messages a-b: ..."`` for internal nodes (1-based,
    inclusive), or with ``return_messages=True`` as ``HumanMessage`` / ``AIMessage`` /
    ``SystemMessage`` objects.

    Use the per-algorithm subclasses (:class:`SegTreeMemory`, :class:`MemTreeMemory`,
    :class:`HATMemory`, :class:`XMemoryMemory`), which build their core memory from keyword arguments;
    this base class takes a ready core memory.

    Args:
        memory: the core :class:`~shared_core.memories.base.HierarchicalMemory` (required here; the subclasses
            build one when it is not given).
        memory_key: prompt variable the history is returned under, default ``"history"``.
        input_key: key of the chain input used as the query and stored as the human turn; default
            ``None`` = the only input key that is not a memory variable (or ``"stop"``).
        output_key: key of the chain output stored as the AI turn; default ``None`` = the only output key,
            else ``"output"``.
        human_prefix: speaker name of the human turns and their line prefix, default ``"Human"``.
        ai_prefix: speaker name of the AI turns and their line prefix, default ``"AI"``.
        k: at most this many retrieved nodes, default ``None`` = the memory's default (10 for SegTreeMem).
        policy: retrieval policy, default ``None`` = the memory's default.
        max_tokens: token budget of the rendered history text (as ``shared_core.memories.base.count_tokens``
            counts the newline-joined lines); the best-scoring nodes that fit are kept. Default ``None``
            (no budget). With ``return_messages=True`` the same lines are counted.
        return_messages: return a list of messages instead of a string, default ``False``.
        search_kwargs: the policy's parameters for every retrieval, e.g. ``{"alpha": 0.1}``, default ``{}``.

    Raises:
        InvalidInputError: no ``memory`` given to this base class, both ``memory`` and algorithm
            arguments given to a subclass, or an argument that is neither a field nor an argument of
            the algorithm.
        AlgorithmUnavailableError: the subclass's core algorithm cannot be imported.

    References:
        LangChain ``BaseMemory`` (deprecated API); core ``HierarchicalMemory.add`` / ``retrieve``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    #: (module, class name) of the core algorithm; ``None`` on the base class.
    algorithm: ClassVar[tuple[str, str] | None] = None

    memory: HierarchicalMemory = Field(exclude=True)
    memory_key: str = "history"
    input_key: str | None = None
    output_key: str | None = None
    human_prefix: str = "Human"
    ai_prefix: str = "AI"
    k: int | None = None
    policy: str | None = None
    max_tokens: int | None = None
    return_messages: bool = False
    search_kwargs: dict[str, Any] = Field(default_factory=dict)

    def __init__(
        self,
        memory: HierarchicalMemory | None = None,
        *,
        embedder: Any = None,
        llm: Any = None,
        **kwargs: Any,
    ) -> None:
        fields = set(type(self).model_fields)
        own = {n: v for n, v in kwargs.items() if n in fields}
        algo_kwargs = {n: v for n, v in kwargs.items() if n not in fields}
        if memory is None:
            memory = self._build_memory(embedder, llm, algo_kwargs)
        else:
            extra = sorted(algo_kwargs) + [
                n for n, v in (("embedder", embedder), ("llm", llm)) if v is not None
            ]
            if extra:
                raise InvalidInputError(
                    f"{type(self).__name__} got memory= and also {', '.join(extra)}; configure the core "
                    "memory itself, or leave out memory= to have it built from these arguments."
                )
            self._check_memory(memory)
        super().__init__(memory=memory, **own)

    # ------------------------------------------------------------------ construction
    @classmethod
    def _algorithm_class(cls) -> type[HierarchicalMemory]:
        if cls.algorithm is None:
            raise InvalidInputError(
                "HierMemMemory needs memory=<a hiermem memory>, e.g. HierMemMemory(memory=SegTreeMem()); "
                "or use SegTreeMemory / MemTreeMemory / HATMemory / XMemoryMemory, which build one."
            )
        module, name = cls.algorithm
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise AlgorithmUnavailableError(
                f"{cls.__name__} needs {module}.{name}, which this installation of hiermem does not provide "
                f"({type(e).__name__}: {e}). Upgrade hiermem, or pass memory=<another hiermem memory> "
                "to HierMemMemory."
            ) from e

    @classmethod
    def _build_memory(cls, embedder: Any, llm: Any, kwargs: dict[str, Any]) -> HierarchicalMemory:
        algo = cls._algorithm_class()
        params = inspect.signature(algo.__init__).parameters
        unknown = sorted(n for n in kwargs if n not in params)
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            allowed = sorted(n for n in params if n not in ("self", "embedder", "llm"))
            raise InvalidInputError(
                f"{cls.__name__} got unknown argument(s) {', '.join(unknown)}: use its fields "
                f"({', '.join(sorted(cls.model_fields))}) or arguments of {algo.__name__} "
                f"({', '.join(allowed)})."
            )
        return algo(embedder=as_core_embedder(embedder), llm=as_core_llm(llm), **kwargs)

    @classmethod
    def _check_memory(cls, memory: Any) -> None:
        if not isinstance(memory, HierarchicalMemory):
            raise InvalidInputError(
                f"memory must be a hiermem memory (e.g. SegTreeMem()), got {type(memory).__name__}."
            )
        if cls.algorithm is None:
            return
        try:
            algo = cls._algorithm_class()
        except AlgorithmUnavailableError:
            return
        if not isinstance(memory, algo):
            raise InvalidInputError(
                f"{cls.__name__} wraps a {algo.__name__}, got a {type(memory).__name__}; use "
                f"HierMemMemory(memory=...) for any memory kind."
            )

    @field_validator("k", "max_tokens")
    @classmethod
    def _positive(cls, v: int | None) -> int | None:
        if v is not None and (isinstance(v, bool) or v < 1):
            raise ValueError(f"must be a positive integer or None, got {v!r}")
        return v

    # ------------------------------------------------------------------ BaseMemory API
    @property
    def memory_variables(self) -> list[str]:
        """The prompt variables this memory provides: ``[memory_key]``."""
        return [self.memory_key]

    def _input_text(self, inputs: dict[str, Any]) -> str:
        key = self.input_key or get_prompt_input_key(inputs, self.memory_variables)
        value = inputs[key]
        return value if isinstance(value, str) else str(value)

    def _output_text(self, outputs: dict[str, Any]) -> str:
        if self.output_key is not None:
            key = self.output_key
        elif len(outputs) == 1:
            key = next(iter(outputs))
        elif "output" in outputs:
            key = "output"
        else:
            raise InvalidInputError(
                f"Got several output keys {sorted(outputs)}; set output_key to the one to remember."
            )
        value = outputs[key]
        return value if isinstance(value, str) else str(value)

    def _turn(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> list[Message]:
        ts = _now()
        msgs = []
        human, ai = self._input_text(inputs), self._output_text(outputs)
        if human.strip():
            msgs.append(Message(human, role="user", speaker=self.human_prefix, timestamp=ts))
        if ai.strip():
            msgs.append(Message(ai, role="assistant", speaker=self.ai_prefix, timestamp=ts))
        return msgs

    def save_context(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Store the human input and the AI output (empty texts are skipped) in one atomic add.

        Raises:
            InvalidInputError: the input or output key cannot be determined.
        """
        msgs = self._turn(inputs, outputs)
        if msgs:
            self.memory.add(msgs)

    async def asave_context(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Async :meth:`save_context` (the memory's ``aadd``; the event loop is not blocked)."""
        msgs = self._turn(inputs, outputs)
        if msgs:
            await self.memory.aadd(msgs)

    def _retrieve_kwargs(self) -> dict[str, Any]:
        return {"k": self.k, "policy": self.policy, **self.search_kwargs}

    def _empty(self) -> dict[str, Any]:
        return {self.memory_key: [] if self.return_messages else ""}

    def load_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Retrieve the history relevant to the current input.

        Args:
            inputs: the chain inputs; the query is ``inputs[input_key]``.

        Returns:
            ``{memory_key: str}`` (lines joined by newlines, chronological), or
            ``{memory_key: list[BaseMessage]}`` with ``return_messages=True``; empty when nothing is stored
            or the input is blank.
        """
        query = self._input_text(inputs)
        if not query.strip() or len(self.memory) == 0:
            return self._empty()
        hits = self.memory.retrieve(query, **self._retrieve_kwargs())
        return {self.memory_key: self.render(hits)}

    async def aload_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Async :meth:`load_memory_variables` (the memory's ``aretrieve``)."""
        query = self._input_text(inputs)
        if not query.strip() or len(self.memory) == 0:
            return self._empty()
        hits = await self.memory.aretrieve(query, **self._retrieve_kwargs())
        return {self.memory_key: self.render(hits)}

    def clear(self) -> None:
        """Forget every stored turn (the configuration and models are kept)."""
        self.memory.clear()

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        await asyncio.to_thread(self.memory.clear)

    # ------------------------------------------------------------------ rendering
    @staticmethod
    def _content(hit: Hit) -> str:
        """A leaf's message text without the ``"<speaker>: "`` prefix the core stores it under."""
        speaker = hit.metadata.get("speaker")
        prefix = f"{speaker}: " if speaker else ""
        return hit.text[len(prefix) :] if prefix and hit.text.startswith(prefix) else hit.text

    def _line(self, hit: Hit) -> str:
        if hit.is_leaf:
            speaker = hit.metadata.get("speaker")
            if not speaker:
                speaker = {"user": self.human_prefix, "assistant": self.ai_prefix}.get(
                    hit.metadata.get("role") or ""
                )
            text = self._content(hit)
            return f"{speaker}: {text}" if speaker else text
        a, b = hit.span
        return f"Summary of messages {a + 1}-{b + 1}: {hit.text}"

    def _message(self, hit: Hit) -> BaseMessage:
        if hit.is_leaf:
            role = hit.metadata.get("role")
            if role == "user":
                return HumanMessage(content=self._content(hit))
            if role == "assistant":
                return AIMessage(content=self._content(hit))
        return SystemMessage(content=self._line(hit))

    def select(self, hits: list[Hit]) -> list[Hit]:
        """The hits kept for the prompt, in chronological order (span start, wider spans first).

        With ``max_tokens``, hits are taken best first and one is kept only when the rendered history
        (chronological, newline-joined) still fits the budget.
        """

        def order(hs: list[Hit]) -> list[Hit]:
            return sorted(hs, key=lambda h: (h.span[0], -h.span[1], h.node_id))

        if self.max_tokens is None:
            return order(hits)
        kept: list[Hit] = []
        for h in hits:
            trial = order([*kept, h])
            if count_tokens("\n".join(self._line(x) for x in trial)) <= self.max_tokens:
                kept.append(h)
        return order(kept)

    def render(self, hits: list[Hit]) -> str | list[BaseMessage]:
        """Render retrieved hits as the history text or messages (see the class docstring)."""
        chosen = self.select(hits)
        if self.return_messages:
            return [self._message(h) for h in chosen]
        return "\n".join(self._line(h) for h in chosen)

    # ------------------------------------------------------------------ modern path
    def as_retriever(
        self,
        *,
        k: int | None = None,
        policy: str | None = None,
        max_tokens: int | None = None,
        **search_kwargs: Any,
    ) -> HierMemRetriever:
        """A :class:`~langchain_hiermem.retrievers.HierMemRetriever` over the same core memory.

        Args:
            k: documents per query; default this memory's ``k`` (``None`` = the core memory's default).
            policy: retrieval policy; default this memory's ``policy``.
            max_tokens: budget of returned text in tokens, default ``None``.
            **search_kwargs: policy parameters (default this memory's ``search_kwargs``).
        """
        return HierMemRetriever(
            memory=self.memory,
            k=self.k if k is None else k,
            policy=self.policy if policy is None else policy,
            max_tokens=max_tokens,
            search_kwargs={**self.search_kwargs, **search_kwargs},
        )


class SegTreeMemory(HierMemMemory):
    """Conversation memory over a :class:`shared_core.SegTreeMem` (segment tree of the conversation).

    Args:
        memory: a ready ``SegTreeMem``; default ``None`` = built from ``embedder``, ``llm`` and the other
            keyword arguments of ``SegTreeMem`` (``compat``, ``threshold``, ``alpha``, ``horizon``,
            ``relevance``, ``admissible``, ...).
        embedder: a core embedder or a LangChain ``Embeddings`` (wrapped), default the local MiniLM.
        llm: a core LLM or a LangChain chat model / LLM (wrapped), default ``None`` (LLM-free mode).
        **kwargs: the :class:`HierMemMemory` fields (``memory_key``, ``k``, ``policy``, ``max_tokens``,
            ``return_messages``, ...) and ``SegTreeMem`` keyword arguments. A name that is a field of
            this class (e.g. ``k``) sets the field; set such options of the core memory through
            ``memory=SegTreeMem(...)``.

    References:
        SegTreeMem paper, Sec. 4.2-4.3, Appendix A Algorithms 1-2.
    """

    algorithm = ("shared_core.memories.segtree", "SegTreeMem")


class MemTreeMemory(HierMemMemory):
    """Conversation memory over a ``shared_core.memories.memtree.MemTree`` (semantic tree with collapsed
    retrieval).

    Args: as :class:`SegTreeMemory`, with ``MemTree`` keyword arguments.

    Raises:
        AlgorithmUnavailableError: ``shared_core.memories.memtree`` is not available.

    References:
        MemTree paper, Sec. 3 (insertion, collapsed retrieval).
    """

    algorithm = ("shared_core.memories.memtree", "MemTree")


class HATMemory(HierMemMemory):
    """Conversation memory over a ``shared_core.memories.hat.HAT`` (hierarchical aggregate tree).

    Args: as :class:`SegTreeMemory`, with ``HAT`` keyword arguments.

    Raises:
        AlgorithmUnavailableError: ``shared_core.memories.hat`` is not available.

    References:
        HAT paper (hierarchical aggregate tree, memory agent traversal).
    """

    algorithm = ("shared_core.memories.hat", "HAT")


class XMemoryMemory(HierMemMemory):
    """Conversation memory over a ``shared_core.memories.xmemory.XMemory`` (messages, episodes, semantics,
    themes).

    Args: as :class:`SegTreeMemory`, with ``XMemory`` keyword arguments.

    Raises:
        AlgorithmUnavailableError: ``shared_core.memories.xmemory`` is not available.

    References:
        xMemory paper, two-stage adaptive retrieval.
    """

    algorithm = ("shared_core.memories.xmemory", "XMemory")
