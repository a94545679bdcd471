"""``HierMemBlock``: hiermem memories as a long-term block of LlamaIndex's ``Memory``, one per session."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.utils import get_tokenizer

from shared_core.memories.base import HierarchicalMemory
from shared_core.namespaces import (
    DEFAULT_MAX_RESIDENT,
    MAX_PARTS,
    MemoryStore,
    Namespace,
    check_max_resident,
    normalize_namespace,
)
from shared_core.types import HierMemError, Hit, InvalidInputError, Message

from .models import resolve_embedder, resolve_llm
from .retrievers import HierMemRetriever

__all__ = ["HierMemBlock", "SessionMismatchError"]


class SessionMismatchError(InvalidInputError):
    """A block given one explicit ``memory=`` was asked to serve a session that memory does not belong to.

    Leave out ``memory=`` (optionally pass ``memory_factory=``, ``store_dir=`` or ``store=``) to keep one
    memory per session, or use one block per session.
    """


def _text(message: ChatMessage) -> str:
    return "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock) and b.text).strip()


def _session_key(sid: Any) -> str | None:
    """A session id as the block keys it: ``None`` (the default session) or a non-empty string."""
    if sid is None:
        return None
    if isinstance(sid, bool) or not isinstance(sid, (str, int)):
        raise InvalidInputError(
            f"A session id is a string (or None for no session), got {type(sid).__name__}."
        )
    sid = str(sid)
    if not sid.strip():
        raise InvalidInputError("A session id must be a non-empty string; use None for the default session.")
    return sid


def _recorded_sessions(memory: HierarchicalMemory) -> set[str]:
    """Session ids recorded in the metadata of a memory's stored messages."""
    found = set()
    for node in memory.tree_view().nodes.values():
        msg = node.message
        sid = msg.metadata.get("session_id") if msg is not None and msg.metadata else None
        if sid is not None:
            found.add(str(sid))
    return found


class HierMemBlock(BaseMemoryBlock[str]):
    """Hierarchical memories as a block of ``llama_index.core.memory.Memory``, one per session.

    ``Memory`` hands every block its ``session_id``: with the messages it flushes from the short-term
    queue (when the chat history passes its token limit; LlamaIndex writes the id into each message's
    ``additional_kwargs["session_id"]``) and as a keyword argument when it reads the blocks. This block
    keeps one core memory per session id and reads only the memory of the session asked for, so a
    session never sees another session's messages. Messages without a session id (a block used without
    ``Memory``) belong to a default session of their own.

    Flushed messages are added to their session's memory in order, one leaf per message with text (role
    kept; a random id; the session id in the metadata). When the block is read, it retrieves for the latest
    user message from that session's memory and renders the hits best first, one line each (newlines
    inside a text become spaces): ``"<role>: <text>"`` for a stored message and
    ``"(summary of messages i-j) <text>"`` for an internal node (``i``, ``j``: 1-based positions of the
    first and last message under it). Lines are kept while they fit ``max_tokens``, counted with
    LlamaIndex's global tokenizer (the one ``Memory`` uses by default); when ``Memory`` asks a block with
    ``priority > 0`` to shrink, the lowest-ranked lines go first.

    The session memories live in a :class:`~shared_core.namespaces.MemoryStore`: session ``s`` under the
    namespace ``(*namespace, s)`` and the default session under ``namespace`` itself. With ``store_dir``
    every session has its own durable SQLite store below that directory, so every flushed message is on
    disk and a block built later over the same directory finds each session's memory again (and still
    keeps them apart).

    ``memory=`` (one explicit core memory, the earlier API) is still accepted. It serves exactly one
    session: ``session_id`` when given, else the first session the block is used for. A memory holding
    messages recorded under another session id is refused, and a later call for any other session raises
    :class:`SessionMismatchError`; it is never shared between sessions.

    Args:
        name: block name in the memory template, default ``"hierarchical_memory"``.
        memory_factory: builds the empty memory of a new session: a callable taking no argument or the
            namespace tuple (``lambda: MemTree(embedder=emb)``); default ``None`` = a
            :class:`~shared_core.memories.segtree.SegTreeMem` with ``embed_model`` / ``llm`` resolved as by
            the indices (explicit, else ``Settings`` when set, else the local embedder and no LLM; resolved
            once and shared by all sessions) and ``memory_kwargs``.
        embed_model: embedding model of the default factory, default ``None``.
        llm: LLM of the default factory, default ``None``.
        memory_kwargs: options of the default factory's ``SegTreeMem`` (e.g. ``{"relevance": "dense"}``),
            default ``{}``.
        store_dir: directory of durable per-session stores (``MemoryStore(..., durable=True)``; a str or
            path); default ``None`` = the memories live in this process only.
        store: a ready :class:`~shared_core.namespaces.MemoryStore` to keep the sessions in (its factory
            builds them; its ``root_dir`` / ``durable`` / ``max_resident`` settings apply); default
            ``None``.
        max_resident: most sessions kept open at once in the block's own store, default 256
            (:data:`~shared_core.namespaces.DEFAULT_MAX_RESIDENT`); with ``store_dir`` the least recently
            used sessions beyond it are closed and reopened from their store on their next use (nothing is
            embedded again); ``None``: no limit. Sessions without ``store_dir`` live only in RAM and are
            never evicted.
        namespace: prefix of the sessions' namespaces in the store (a string or a tuple of up to 7
            strings), default ``None`` = ``(name,)``.
        memory: one explicit core memory for a single session (see above); default ``None``.
        session_id: the session ``memory`` belongs to; only with ``memory``; default ``None`` = the first
            session the block is used for.
        policy: retrieval policy, default ``None`` = the memory's default.
        similarity_top_k: at most this many hits per read, default 5.
        max_tokens: budget of the rendered block in tokens, default 512; ``None`` = no budget.
        policy_params: the policy's parameters, default ``{}``.
        priority: ``Memory`` truncation priority, default 0 (never truncated).
        description, accept_short_term_memory: as for every ``BaseMemoryBlock``.

    Raises:
        InvalidInputError: ``memory`` is not a hiermem memory, or given with any of ``memory_factory``,
            ``embed_model``, ``llm``, ``memory_kwargs``, ``store_dir``, ``store``, ``namespace``,
            ``max_resident``; ``session_id`` without ``memory``; ``store`` with ``memory_factory``, models,
            ``memory_kwargs``, ``store_dir`` or ``max_resident``; ``memory_factory`` with models or
            ``memory_kwargs``; ``max_resident`` not a positive integer or ``None``; a bad
            ``similarity_top_k``, ``max_tokens``, namespace, session id or policy parameter; an option the
            default ``SegTreeMem`` does not take.
        SessionMismatchError: ``memory`` holds messages of another session than ``session_id``.
        UnknownPolicyError: a policy the memory does not have.

    Per-session memories built by a custom factory or store are checked against ``policy`` and
    ``policy_params`` when first used (a wrong policy raises then).

    References:
        LlamaIndex ``Memory`` / ``BaseMemoryBlock`` (and its ``VectorMemoryBlock``, which filters by
        session id); :class:`~shared_core.namespaces.MemoryStore`; the memories' papers (e.g. SegTreeMem
        Sec. 4, Algorithms 1-2).
    """

    name: str = Field(default="hierarchical_memory", description="The name of the memory block.")
    memory_factory: Any = Field(default=None, exclude=True, description="Builds each session's memory.")
    embed_model: Any = Field(default=None, exclude=True, description="Embedding model of the default memory.")
    llm: Any = Field(default=None, exclude=True, description="LLM of the default memory.")
    memory_kwargs: dict[str, Any] = Field(default_factory=dict, description="Options of the default memory.")
    store_dir: Any = Field(default=None, description="Directory of the durable per-session stores.")
    store: Any = Field(default=None, exclude=True, description="A MemoryStore holding the sessions.")
    max_resident: Any = Field(
        default=DEFAULT_MAX_RESIDENT, description="Most sessions kept open at once (None: no limit)."
    )
    namespace: Any = Field(default=None, description="Namespace prefix of the sessions in the store.")
    memory: Any = Field(default=None, exclude=True, description="One explicit core memory (one session).")
    session_id: Any = Field(default=None, description="The one session an explicit memory serves.")
    policy: str | None = Field(default=None, description="Retrieval policy (default: the memory's).")
    similarity_top_k: int = Field(default=5, description="At most this many hits per read.")
    max_tokens: int | None = Field(default=512, description="Token budget of the rendered block.")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="Retrieval policy parameters.")

    _store: MemoryStore | None = PrivateAttr(default=None)
    _prefix: tuple[str, ...] = PrivateAttr(default=())
    _bound: bool = PrivateAttr(default=False)
    _lock: Any = PrivateAttr(default=None)
    _checked: set = PrivateAttr(default_factory=set)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._lock = threading.Lock()
        for name, v in (("similarity_top_k", self.similarity_top_k), ("max_tokens", self.max_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}.")
        if self.memory is not None:
            self._setup_explicit()
        else:
            self._setup_store()

    def _given(self, *names: str) -> list[str]:
        given = [n for n in names if n != "max_resident" and getattr(self, n) not in (None, {}, ())]
        if "max_resident" in names and "max_resident" in self.model_fields_set:
            given.append("max_resident")
        return given

    def _setup_explicit(self) -> None:
        if not isinstance(self.memory, HierarchicalMemory):
            raise InvalidInputError(
                f"memory must be a hiermem memory (e.g. SegTreeMem()), got {type(self.memory).__name__}."
            )
        clash = self._given(
            "memory_factory",
            "embed_model",
            "llm",
            "memory_kwargs",
            "store_dir",
            "store",
            "namespace",
            "max_resident",
        )
        if clash:
            raise InvalidInputError(
                f"memory= is one ready memory for a single session; do not also pass {', '.join(clash)} "
                "(leave out memory= to have one memory per session built from them)."
            )
        self._check(self.memory)
        if self.session_id is not None:
            self.session_id = _session_key(self.session_id)
            self._bind(self.session_id)

    def _setup_store(self) -> None:
        check_max_resident(self.max_resident)
        if self.session_id is not None:
            raise InvalidInputError(
                "session_id= pins an explicit memory= to one session; without memory= the block keeps one "
                "memory per session id, which LlamaIndex's Memory passes in."
            )
        try:
            self._prefix = normalize_namespace(self.namespace if self.namespace is not None else self.name)
        except InvalidInputError as e:
            raise InvalidInputError(f"namespace (default: the block name) is not usable: {e}") from None
        if len(self._prefix) >= MAX_PARTS:
            raise InvalidInputError(f"namespace has at most {MAX_PARTS - 1} parts (a session id is added).")
        if self.namespace is not None:
            self.namespace = self._prefix
        if self.store is not None:
            if not isinstance(self.store, MemoryStore):
                raise InvalidInputError(
                    f"store must be a shared_core.namespaces.MemoryStore, got {type(self.store).__name__}."
                )
            clash = self._given(
                "memory_factory", "embed_model", "llm", "memory_kwargs", "store_dir", "max_resident"
            )
            if clash:
                raise InvalidInputError(
                    "store= brings its own factory, directory and max_resident; do not also pass "
                    f"{', '.join(clash)}."
                )
            self._store = self.store
            return
        if self.store_dir is not None:
            if not isinstance(self.store_dir, (str, os.PathLike)):
                raise InvalidInputError(
                    "store_dir must be a directory path (str or os.PathLike), got "
                    f"{type(self.store_dir).__name__}."
                )
            self.store_dir = os.fspath(self.store_dir)
        if self.memory_factory is not None:
            if not callable(self.memory_factory):
                raise InvalidInputError("memory_factory must be a callable returning a new, empty memory.")
            clash = self._given("embed_model", "llm", "memory_kwargs")
            if clash:
                raise InvalidInputError(
                    f"memory_factory builds the memories with their own models and options; do not also pass "
                    f"{', '.join(clash)}."
                )
            factory: Callable[..., HierarchicalMemory] = self.memory_factory
        else:
            factory = self._default_factory()
        self._store = MemoryStore(
            factory, self.store_dir, durable=self.store_dir is not None, max_resident=self.max_resident
        )

    def _default_factory(self) -> Callable[[], HierarchicalMemory]:
        from shared_core.memories.segtree import SegTreeMem

        embedder, core_llm = resolve_embedder(self.embed_model), resolve_llm(self.llm)
        options = dict(self.memory_kwargs)

        def build() -> HierarchicalMemory:
            return SegTreeMem(embedder=embedder, llm=core_llm, **options)

        try:
            probe = build()
        except TypeError as e:
            raise InvalidInputError(f"SegTreeMem does not take these memory_kwargs: {e}.") from None
        self._check(probe)
        return build

    def _check(self, memory: Any) -> None:
        """Validate the policy, top-k, budget and policy parameters against a memory's class (once)."""
        if not isinstance(memory, HierarchicalMemory):
            raise InvalidInputError(f"Expected a hiermem memory, got {type(memory).__name__}.")
        if type(memory) in self._checked:
            return
        HierMemRetriever(
            memory,
            policy=self.policy,
            similarity_top_k=self.similarity_top_k,
            max_tokens=self.max_tokens,
            **self.policy_params,
        )
        self._checked.add(type(memory))

    # ------------------------------------------------------------------ sessions
    def _bind(self, sid: str | None) -> None:
        """Check that the explicit memory may serve session ``sid``; bind it on first use."""
        with self._lock:
            if self._bound:
                if sid != self.session_id:
                    raise SessionMismatchError(
                        f"This HierMemBlock was given one memory (memory=...), which serves session "
                        f"{self.session_id!r} only; it was asked for session {sid!r}. Leave out memory= "
                        "(optionally pass memory_factory=, store_dir= or store=) to keep one memory per "
                        "session, or use one block per session."
                    )
                return
            others = sorted(s for s in _recorded_sessions(self.memory) if s != sid)
            if others:
                raise SessionMismatchError(
                    f"memory= holds messages of session(s) {', '.join(map(repr, others))}, so it cannot "
                    f"serve session {sid!r}. Give each session its own memory (leave out memory= to have "
                    "the block do so)."
                )
            self.session_id, self._bound = sid, True

    def _namespace(self, sid: str | None) -> Namespace:
        ns = self._prefix if sid is None else (*self._prefix, sid)
        try:
            return normalize_namespace(ns)
        except InvalidInputError as e:
            raise InvalidInputError(f"Session id {sid!r} cannot be used: {e}") from None

    def _memory_of(self, sid: str | None, create: bool) -> HierarchicalMemory | None:
        if self.memory is not None:
            self._bind(sid)
            return self.memory
        assert self._store is not None
        ns = self._namespace(sid)
        mem = self._store.get_or_create(ns) if create else self._store.get(ns)
        if mem is not None:
            self._check(mem)
        return mem

    def session_memory(self, session_id: str | None = None) -> HierarchicalMemory | None:
        """The core memory of a session, or ``None`` when the session has none yet (never creates one).

        With an explicit ``memory=`` this counts as a use: an unbound block is bound to ``session_id``.

        Args:
            session_id: the session (``Memory.session_id``); ``None`` = the default session.

        Returns:
            The memory, or ``None``.

        Raises:
            SessionMismatchError: an explicit ``memory=`` that serves another session.
            InvalidInputError: a bad session id.
            PersistenceError: the session's stored memory cannot be read.
        """
        return self._memory_of(_session_key(session_id), create=False)

    def sessions(self) -> list[str | None]:
        """Session ids with a memory (open or stored), sorted; ``None`` stands for the default session.

        With an explicit ``memory=``: the session it serves (``[]`` before its first use).
        """
        if self.memory is not None:
            return [self.session_id] if self._bound else []
        assert self._store is not None
        n = len(self._prefix)
        names = self._store.list_namespaces(self._prefix)
        out: list[str | None] = [None] if self._prefix in names else []
        out.extend(sorted(ns[n] for ns in names if len(ns) == n + 1))
        return out

    def delete_session(self, session_id: str | None = None) -> bool:
        """Forget everything stored for a session (its memory, and its store under ``store_dir``).

        With an explicit ``memory=`` the memory is cleared (it must serve that session).

        Args:
            session_id: the session; ``None`` = the default session.

        Returns:
            Whether the session had stored anything.

        Raises:
            SessionMismatchError: an explicit ``memory=`` that serves another session.
        """
        sid = _session_key(session_id)
        if self.memory is not None:
            self._bind(sid)
            existed = len(self.memory) > 0
            self.memory.clear()
            return existed
        assert self._store is not None
        return self._store.delete_namespace(self._namespace(sid))

    def close(self) -> None:
        """Close the durable session stores (they reopen on the next use). An explicit ``memory=`` is left
        as it is: its owner closes it."""
        if self._store is not None:
            self._store.close()

    @property
    def memory_store(self) -> MemoryStore | None:
        """The :class:`~shared_core.namespaces.MemoryStore` of the sessions (``None`` with ``memory=``)."""
        return self._store

    @property
    def core(self) -> HierarchicalMemory:
        """The explicit core memory given as ``memory=``.

        Raises:
            InvalidInputError: the block keeps one memory per session (use :meth:`session_memory`).
        """
        if self.memory is None:
            raise InvalidInputError(
                "This HierMemBlock keeps one memory per session; use block.session_memory(session_id)."
            )
        return self.memory

    # ------------------------------------------------------------------ rendering
    @staticmethod
    def render_hit(hit: Hit) -> str:
        """One line for a hit: ``"<role>: <text>"`` (message) or ``"(summary of messages i-j) <text>"``.

        Remembered text is data: ``<`` and ``>`` in it become ``‹`` and ``›``, so a stored text can never
        close the ``<memory>`` / ``<name>`` tags ``Memory``'s template puts around the block and pose as
        instructions after them; newlines become spaces, so one hit is one line.
        """
        text = " ".join(hit.text.split()).replace("<", "‹").replace(">", "›")
        if hit.is_leaf:
            role = hit.metadata.get("role")
            return f"{role}: {text}" if role else text
        first, last = hit.span[0] + 1, hit.span[1] + 1
        where = f"message {first}" if first == last else f"messages {first}-{last}"
        return f"(summary of {where}) {text}"

    def _render(self, hits: list[Hit]) -> str:
        tok = get_tokenizer()
        lines: list[str] = []
        used = 0
        for h in hits:
            line = self.render_hit(h)
            n = len(tok(line)) + (1 if lines else 0)
            if self.max_tokens is not None and used + n > self.max_tokens:
                continue
            lines.append(line)
            used += n
        return "\n".join(lines)

    # ------------------------------------------------------------------ BaseMemoryBlock
    @staticmethod
    def _read_session(messages: list[ChatMessage], block_kwargs: dict[str, Any]) -> str | None:
        """The session of a read: the ``session_id`` keyword (what ``Memory`` passes), else the one session
        id the messages carry, else the default session."""
        sid = block_kwargs.get("session_id")
        if sid is not None:
            return _session_key(sid)
        found = {
            _session_key(m.additional_kwargs["session_id"])
            for m in messages
            if m.additional_kwargs.get("session_id") is not None
        }
        if len(found) > 1:
            raise InvalidInputError(
                f"The messages carry several session ids ({', '.join(sorted(map(repr, found)))}); pass "
                "session_id= to say whose memory to read."
            )
        return found.pop() if found else None

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        """Retrieve for the latest user message from the session's memory.

        Args:
            messages: the chat history (the query is the latest user message with text).
            **block_kwargs: ``session_id`` (``Memory`` passes its own); without it, the session id the
                messages carry in ``additional_kwargs``, else the default session.

        Returns:
            The rendered hits; ``""`` when there is no user message or the session has no memory yet.

        Raises:
            SessionMismatchError: an explicit ``memory=`` that serves another session.
            InvalidInputError: a bad session id, or messages of several sessions without ``session_id``.
        """
        messages = messages or []
        sid = self._read_session(messages, block_kwargs)
        mem = await asyncio.to_thread(self._memory_of, sid, False)
        query = next((t for m in reversed(messages) if m.role == "user" and (t := _text(m))), "")
        if not query or mem is None or len(mem) == 0:
            return ""
        hits = await mem.aretrieve(query, self.similarity_top_k, self.policy, **self.policy_params)
        return self._render(hits)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        """Add the messages with text to their sessions' memories, in order.

        The session of a message is ``additional_kwargs["session_id"]`` (``BaseMemoryBlock.aput`` writes
        the ``session_id`` it is given there); messages without one go to the default session. Each
        session's messages are added in one atomic ``aadd``; when one session's add fails, the messages
        this call added to other sessions are deleted again.

        Raises:
            SessionMismatchError: an explicit ``memory=`` and a message of another session (nothing is
                added).
            InvalidInputError: a bad session id.
        """
        groups: dict[str | None, list[Message]] = {}
        for m in messages:
            text = _text(m)
            if not text:
                continue
            sid = _session_key(m.additional_kwargs.get("session_id"))
            meta = {"session_id": sid} if sid is not None else {}
            role = m.role.value if hasattr(m.role, "value") else str(m.role)
            groups.setdefault(sid, []).append(
                Message(text=text, role=role, id=uuid.uuid4().hex, metadata=meta)
            )
        if not groups:
            return
        mems = {sid: await asyncio.to_thread(self._memory_of, sid, True) for sid in groups}
        done: list[tuple[HierarchicalMemory, list[int]]] = []
        try:
            for sid, items in groups.items():
                mem = mems[sid]
                assert mem is not None
                report = await mem.aadd(items)
                done.append((mem, list(report.leaf_ids)))
        except BaseException:
            for mem, leaf_ids in done:
                for lid in leaf_ids:
                    try:
                        mem.delete(lid)
                    except HierMemError:
                        continue
            raise

    async def atruncate(self, content: str, tokens_to_truncate: int) -> str | None:
        """Drop the lowest-ranked lines until at least ``tokens_to_truncate`` tokens are gone.

        Returns:
            The shortened block, or ``None`` when nothing is left.
        """
        if not content:
            return None
        tok = get_tokenizer()
        lines = content.split("\n")
        removed = 0
        while lines and removed < tokens_to_truncate:
            removed += len(tok(lines.pop())) + 1
        return "\n".join(lines) or None
