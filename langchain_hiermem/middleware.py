"""Long-term memory for ``langchain.agents.create_agent`` agents: :class:`HierMemMiddleware`.

``create_agent(model, tools, middleware=[HierMemMiddleware()])`` gives an agent a memory of its users
across threads: every user and assistant turn is remembered in the user's own namespace, and before each
model call what the memory recalls for the latest user message is put in front of the model, fenced as
data and within a token budget. See ``docs/langchain.md`` ("Memory middleware").

This module needs the ``langchain`` package (the ``agents`` extra: ``pip install "hiermem[agents]"``);
importing it without that package raises :class:`~langchain_hiermem.errors.MissingExtraError`.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Annotated, Any

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from typing_extensions import NotRequired

from shared_core.namespaces import MemoryStore
from shared_core.types import InvalidInputError, Message

from .errors import agents_extra_error

try:
    from langchain.agents.middleware.types import (
        AgentMiddleware,
        AgentState,
        ModelRequest,
        ModelResponse,
        PrivateStateAttr,
    )
except ModuleNotFoundError as e:
    raise agents_extra_error(e) from e
from langgraph.store.base import BaseStore

from .agent_memory import (
    _N_LOCKS,
    DEFAULT_HEADER,
    ROLES,
    SUPERSEDED_MODES,
    MemoryBackend,
    Recalled,
    _current_config,
    _now,
    _thread_id,
    check_recall_options,
    memory_backend,
    recall_block,
    render_recalled,
    resolve_user,
)
from .tools import create_memory_tools

__all__ = [
    "DEFAULT_HEADER",
    "HierMemMiddleware",
    "HierMemState",
    "MemoryBackend",
    "Recalled",
    "memory_backend",
    "recall_block",
    "render_recalled",
    "resolve_user",
]


class HierMemState(AgentState[Any]):
    """Agent state of :class:`HierMemMiddleware`: the ids of the thread's messages already looked at
    (remembered, or skipped by role), so each turn is remembered once. Private: not part of the agent's
    input or output, but kept by the checkpointer with the thread."""

    hiermem_seen: NotRequired[Annotated[list[str], PrivateStateAttr]]


def _is_summary(m: BaseMessage) -> bool:
    """A message made by LangChain's ``SummarizationMiddleware`` (not a turn of the user)."""
    return (m.additional_kwargs or {}).get("lc_source") == "summarization"


def _latest_user_text(messages: Sequence[AnyMessage]) -> str | None:
    for m in reversed(messages):
        if isinstance(m, HumanMessage) and not _is_summary(m):
            text = m.text.strip()
            return text or None
    return None


class HierMemMiddleware(AgentMiddleware):
    """Long-term memory for ``create_agent`` agents: remembers each user's turns, recalls them for the
    model in later threads.

    ``create_agent(model, tools, middleware=[HierMemMiddleware()])``, invoked with a user
    (``context={"user_id": "ann"}`` or ``config={"configurable": {"user_id": "ann", ...}}``):

    * **Remembering** (``after_model``, ``after_agent``): the thread's user and assistant turns (the
      roles in ``remember``) that were not remembered yet are added to the user's namespace, the
      message id as the source id, with the thread id and a UTC timestamp. The messages already looked at
      are tracked in the thread's state (:class:`HierMemState`), and ids already in the memory are not
      added again, so each turn is remembered once, not on every model call. Assistant messages without
      text (tool calls only), system messages and, by default, tool results are not remembered.
    * **Recalling** (``wrap_model_call``): before each model call the memory retrieves for the latest
      user message; entries for messages the model already sees in this thread, and earlier askings of
      the same message, are left out (:func:`recall_block`); the rest
      are put at the end of the system message as one block fenced with ``<<<`` ... ``>>>`` under a
      header that says it is data (:func:`render_recalled`), within ``max_tokens``. The block goes to
      that model call only: it is not added to the thread's messages, so it is never remembered itself.

    A run that names no user raises :class:`~langchain_hiermem.errors.MissingUserError`; users never
    share a namespace.

    Args:
        store: where the memories are kept: a :class:`shared_core.namespaces.MemoryStore` (e.g.
            ``MemoryStore(factory, root_dir, durable=True)`` or one on PostgreSQL), a LangGraph
            ``BaseStore`` such as :class:`~langchain_hiermem.store.HierMemStore` (the same store can
            serve the agent's ``store=``), or ``None`` (default): an in-memory ``MemoryStore`` of
            ``SegTreeMem`` memories on the embedded local embedder.
        embedder: the default store's embedder (core or LangChain ``Embeddings``); not with ``store``.
        user_key: the key of the user id in the run's context and in ``config["configurable"]``;
            default ``"user_id"``.
        namespace_prefix: a user's namespace is ``(*namespace_prefix, user_id)``; default
            ``("memories",)``. With a LangGraph store, periods and ``%`` in the user id are
            percent-encoded (LangGraph refuses periods in labels).
        k: most entries recalled per model call, default 8.
        max_tokens: token budget of the recalled block, header included (as
            :func:`shared_core.memories.base.count_tokens` counts), default 1000; ``None``: no budget.
        remember: roles to remember: ``"user"`` (human messages), ``"assistant"`` (AI messages with text),
            ``"tool"`` (tool results); default ``("user", "assistant")``.
        recall: put the recalled block before each model call (default True); ``False`` only remembers
            (e.g. with the tools deciding when to recall).
        memory_tools: also give the agent the ``remember`` / ``recall`` tools of
            :func:`~langchain_hiermem.tools.create_memory_tools` on the same store (default False).
        header: the text above the recalled block.
        policy: retrieval policy of a ``MemoryStore`` (default: the memory's).
        search_kwargs: retrieval parameters of a ``MemoryStore``.
        superseded: how a recalled statement that a newer one replaced (a ``MemoryStore``'s supersession,
            see :mod:`shared_core.memories.supersession`) is shown: ``"mark"`` (default) adds ``(replaced on
            <date> by: <the newer statement>)`` after it, ``"omit"`` leaves it out.

    Attributes:
        store: the store (the default one when none was given).
        backend: the :class:`MemoryBackend` over it.

    Raises:
        InvalidInputError: a bad argument (see :func:`memory_backend`), ``k < 1``, ``max_tokens < 1``,
            an unknown role.

    Thread safety: one instance may serve concurrent runs; the check-then-add of a namespace's turns is
    serialised within the process (processes sharing a PostgreSQL store may, rarely, both add a turn
    that arrives in both at once).
    """

    state_schema = HierMemState

    def __init__(
        self,
        store: MemoryStore | BaseStore | None = None,
        *,
        embedder: Any = None,
        user_key: str = "user_id",
        namespace_prefix: Sequence[str] = ("memories",),
        k: int = 8,
        max_tokens: int | None = 1000,
        remember: Collection[str] = ("user", "assistant"),
        recall: bool = True,
        memory_tools: bool = False,
        header: str = DEFAULT_HEADER,
        policy: str | None = None,
        search_kwargs: Mapping[str, Any] | None = None,
        superseded: str = "mark",
    ) -> None:
        super().__init__()
        check_recall_options(user_key, k, max_tokens)
        if isinstance(remember, str):
            remember = (remember,)
        unknown = sorted(set(remember) - set(ROLES))
        if unknown:
            raise InvalidInputError(
                f"remember takes roles among {', '.join(map(repr, ROLES))}; got "
                f"{', '.join(map(repr, unknown))}."
            )
        self.backend = memory_backend(
            store,
            embedder=embedder,
            namespace_prefix=namespace_prefix,
            policy=policy,
            search_kwargs=search_kwargs,
        )
        self.store: MemoryStore | BaseStore = self.backend.store  # type: ignore[attr-defined]
        self.user_key = user_key
        self.k = k
        self.max_tokens = max_tokens
        self.remember = frozenset(remember)
        self.recall = bool(recall)
        self.header = header
        if superseded not in SUPERSEDED_MODES:
            raise InvalidInputError(
                f"superseded takes {' or '.join(map(repr, SUPERSEDED_MODES))}, got {superseded!r}."
            )
        self.superseded = superseded
        self._locks = [threading.Lock() for _ in range(_N_LOCKS)]
        self.tools = []
        if memory_tools:
            self.tools = create_memory_tools(
                self.backend, user_key=user_key, k=k, max_tokens=max_tokens, header=header
            )

    # ------------------------------------------------------------------ helpers
    def namespace_for(
        self, runtime_context: Any = None, config: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        """The namespace of the run's user (see :func:`resolve_user`).

        Raises:
            MissingUserError: the run names no user.
        """
        cfg = _current_config() if config is None else config
        return self.backend.namespace(resolve_user(self.user_key, runtime_context, cfg))

    def _lock(self, ns: tuple[str, ...]) -> threading.Lock:
        return self._locks[zlib.crc32("\x00".join(ns).encode("utf-8", "surrogatepass")) % _N_LOCKS]

    def _as_memory(self, m: BaseMessage, thread: str | None) -> Message | None:
        """The stored form of a thread message, or None when it is not remembered."""
        role = next((r for r, cls in ROLES.items() if isinstance(m, cls)), None)
        if role is None or role not in self.remember or _is_summary(m) or not m.id:
            return None
        text = m.text.strip()
        if not text:
            return None
        meta: dict[str, Any] = {"thread_id": thread} if thread is not None else {}
        if isinstance(m, ToolMessage) and m.name:
            meta["tool"] = m.name
        return Message(text, role=role, timestamp=_now(), id=str(m.id), metadata=meta)

    def _remember_state(self, state: Mapping[str, Any], runtime: Any) -> dict[str, Any] | None:
        messages: list[BaseMessage] = list(state.get("messages") or [])
        seen = set(state.get("hiermem_seen") or ())
        fresh = [m for m in messages if m.id and str(m.id) not in seen]
        if not fresh:
            return None
        config = _current_config()
        ns = self.namespace_for(getattr(runtime, "context", None), config)
        thread = _thread_id(config)
        candidates = [x for x in (self._as_memory(m, thread) for m in fresh) if x is not None]
        if candidates:
            with self._lock(ns):
                known = self.backend.stored(ns, [c.id for c in candidates if c.id])
                new = [c for c in candidates if c.id not in known]
                if new:
                    self.backend.add(ns, new)
        return {"hiermem_seen": [str(m.id) for m in messages if m.id]}

    def _system_with_memory(self, request: ModelRequest[Any]) -> SystemMessage | None:
        """The request's system message with the recalled block appended (None: nothing recalled)."""
        query = _latest_user_text(request.messages)
        if not self.recall or query is None:
            return None
        config = _current_config()
        ns = self.namespace_for(getattr(request.runtime, "context", None), config)
        visible = {str(m.id) for m in request.messages if m.id}
        block = recall_block(
            self.backend, ns, query, self.k, self.max_tokens, self.header, visible, self.superseded
        )
        if block is None:
            return None
        return _append_to_system(request.system_message, block)

    # ------------------------------------------------------------------ hooks
    def after_model(self, state: HierMemState, runtime: Any) -> dict[str, Any] | None:
        """Remember the thread's turns not remembered yet (the user's message and the model's answer)."""
        return self._remember_state(state, runtime)

    async def aafter_model(self, state: HierMemState, runtime: Any) -> dict[str, Any] | None:
        """Async :meth:`after_model` (the memory work runs in a worker thread)."""
        return await asyncio.to_thread(self._remember_state, state, runtime)

    def after_agent(self, state: HierMemState, runtime: Any) -> dict[str, Any] | None:
        """Remember what came after the last model call (e.g. a tool's result, when ``"tool"`` is
        remembered)."""
        return self._remember_state(state, runtime)

    async def aafter_agent(self, state: HierMemState, runtime: Any) -> dict[str, Any] | None:
        """Async :meth:`after_agent`."""
        return await asyncio.to_thread(self._remember_state, state, runtime)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        """Call the model with the recalled block at the end of the system message."""
        system = self._system_with_memory(request)
        return handler(request if system is None else request.override(system_message=system))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        """Async :meth:`wrap_model_call` (the retrieval runs in a worker thread)."""
        system = await asyncio.to_thread(self._system_with_memory, request)
        return await handler(request if system is None else request.override(system_message=system))


def _append_to_system(system: SystemMessage | None, block: str) -> SystemMessage:
    if system is None:
        return SystemMessage(content=block)
    content = system.content
    if isinstance(content, str):
        new: Any = f"{content}\n\n{block}" if content.strip() else block
    else:
        new = [*content, {"type": "text", "text": block}]
    return system.model_copy(update={"content": new})
