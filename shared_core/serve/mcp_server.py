"""``hiermem mcp``: hierarchical memories served over the Model Context Protocol.

An MCP client (Claude Desktop, an IDE agent, any MCP SDK) gets five tools: ``remember``, ``recall``,
``forget``, ``list_namespaces`` and ``memory_stats``. Every namespace (a user, an agent, a project...)
owns a separate memory in one :class:`~shared_core.namespaces.MemoryStore`; a namespace never sees
another's memories. The memories share one embedder (the embedded local all-MiniLM-L6-v2 by default,
loaded once).

Storage: in memory (lost when the server stops), one durable SQLite store per namespace under a
directory, or one PostgreSQL database shared with other processes.

Access: over stdio the client that spawns the server owns it. Over HTTP, a tokens file (see
:mod:`shared_core.serve.mcp_auth`) maps bearer tokens to the namespaces each may use; the server refuses to
listen on an address other than loopback without one.

Needs the ``mcp`` extra: ``pip install "hiermem[mcp]"``.

Example:
    Programmatic use (the command line does the same)::

        from shared_core.serve.mcp_server import build_server, open_store

        store = open_store("~/.hiermem", memory="segtree")
        build_server(store).run()  # stdio
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from ..memories.base import HierarchicalMemory
from ..models.base import Embedder
from ..namespaces import (
    DEFAULT_MAX_RESIDENT,
    MAX_PART_CHARS,
    MemoryStore,
    check_max_resident,
    normalize_namespace,
)
from ..stores import is_postgres_url
from ..stores.namespace import NamespaceDeletedError
from ..types import (
    CommitUnknownError,
    EmbeddingError,
    HierMemError,
    InvalidInputError,
    LLMRequiredError,
    Message,
    ModelError,
    NamespaceBusyError,
    NodeNotFoundError,
    PersistenceError,
    UnknownPolicyError,
)
from ..viz import parse_timestamp
from .mcp_auth import (
    Grant,
    TokenTable,
    TokenTableVerifier,
    UnauthenticatedBindError,
    auth_settings,
    current_grant,
    is_loopback,
    tokens_file_notice,
    transport_security,
    url_host,
)

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        'The MCP server needs the official MCP SDK (mcp >= 2.3): pip install "hiermem[mcp]".'
    ) from _e

__all__ = [
    "MAX_K",
    "MEMORY_KINDS",
    "HierMemTools",
    "RecallHit",
    "TokenTable",
    "UnauthenticatedBindError",
    "build_server",
    "memory_factory",
    "open_store",
    "parse_host_port",
    "serve",
]

#: ``--memory`` choices, in the order shown by the help.
MEMORY_KINDS: tuple[str, ...] = ("segtree", "memtree", "hat", "xmemory")
#: Most hits one ``recall`` returns.
MAX_K = 100

_INSTRUCTIONS = (
    "Long-term memory. Call `remember` to store a fact or a conversation turn in a namespace (e.g. the "
    "user's name), `recall` to find what was stored about a query (best hits first, each with the ids of "
    "the messages it comes from), `forget` to delete a message by its id. Namespaces are separate: a "
    "recall only sees its own namespace."
)


class RecallHit(BaseModel):
    """One ``recall`` hit: a stored message (a leaf) or a summary of several (an internal node)."""

    text: str = Field(description="The message as stored ('<speaker>: <text>' with a speaker) or a summary.")
    score: float = Field(
        description="Cosine similarity of the query and the hit's text, in [0, 1]; "
        "hits come in the policy's order."
    )
    is_leaf: bool = Field(description="True for one stored message, False for a summary of several.")
    span: tuple[int, int] = Field(
        description="(first, last) insertion index (0-based) of the messages under the hit."
    )
    source_ids: list[str] = Field(
        description="Ids of the messages under the hit (the ids remember returned)."
    )
    timestamp: str | None = Field(default=None, description="The message's timestamp (leaves only).")
    speaker: str | None = Field(default=None, description="The message's speaker (leaves only).")
    superseded_by: list[str] = Field(
        default_factory=list,
        description="Ids of newer messages that restate this one with another value (empty while current).",
    )
    valid_to: str | None = Field(
        default=None, description="When the earliest of those newer messages was said (None while current)."
    )


# --------------------------------------------------------------------------- argument types
Namespace = Annotated[
    str,
    Field(
        description=(
            f"The memory to use, e.g. a user or project name (1 to {MAX_PART_CHARS} printable "
            "characters). Namespaces never see each other's memories."
        )
    ),
]
Text = Annotated[str, Field(description="What to remember (non-empty).")]
Speaker = Annotated[str | None, Field(description="Who said it, e.g. 'user' or a name (optional).")]
Timestamp = Annotated[
    str | None,
    Field(
        description=(
            "When it was said, ISO-8601 (e.g. '2025-05-08' or '2025-05-08T14:30:00'); default: now (UTC)."
        )
    ),
]
Query = Annotated[str, Field(description="What to look for (non-empty).")]
K = Annotated[int, Field(ge=1, le=MAX_K, description=f"Most hits to return (1 to {MAX_K}).")]
Policy = Annotated[
    str | None,
    Field(description="Retrieval policy of the memory (default: the memory's own); memory_stats lists them."),
]
RangeStart = Annotated[
    str | None,
    Field(description="Only messages at or after this ISO-8601 date or date-time (optional)."),
]
RangeEnd = Annotated[
    str | None,
    Field(description="Only messages at or before this ISO-8601 date or date-time; a date includes its day."),
]
AsOf = Annotated[
    str | None,
    Field(
        description="Ask as of this ISO-8601 date or date-time (a date means the end of that day): nothing "
        "remembered with a later timestamp comes back, and 'last Friday' or 'in June' in the query mean "
        "the ones before it (default: now)."
    ),
]
MinScore = Annotated[
    float | None,
    Field(ge=0.0, le=1.0, description="Only hits whose score (cosine similarity, 0 to 1) is at least this."),
]
MessageId = Annotated[str, Field(description="The id remember returned (a source id of a recall hit).")]


_log = logging.getLogger(__name__)

#: Errors about the caller's own arguments, raised while checking them against the caller's own
#: namespace: their message (which quotes what the caller sent, or its memory's choices) reaches it.
_CALLER_ERRORS: tuple[type[HierMemError], ...] = (
    InvalidInputError,
    UnknownPolicyError,
    LLMRequiredError,
    NodeNotFoundError,
)
#: What a client is told of an error of the server's side (its store, its models), most specific
#: first. The error's own message is for the operator: it may name files, other namespaces (a copied
#: directory's record) or a provider's reply, so it goes to the server's log only.
_SERVER_ERRORS: tuple[tuple[type[HierMemError], str], ...] = (
    (
        NamespaceBusyError,
        "The namespace is busy (another writer holds it); nothing was changed, try again later.",
    ),
    (
        CommitUnknownError,
        "The connection to the database was lost while committing: the change may or may not be stored; "
        "recall before trying again.",
    ),
    (NamespaceDeletedError, "The namespace was deleted by another process meanwhile; try again."),
    (PersistenceError, "The server could not read or write this namespace's store."),
    (ModelError, "The server's model (embedder or LLM) failed."),
    (EmbeddingError, "The server's embedder returned unusable vectors."),
)
#: Expected in normal operation (a busy or shared store): logged as a warning without a traceback.
_TRANSIENT = (NamespaceBusyError, CommitUnknownError, NamespaceDeletedError)


@contextmanager
def _as_tool_errors(tool: str) -> Iterator[None]:
    """Turn hiermem's typed errors raised by ``tool`` into MCP tool errors.

    An error about the caller's arguments (:data:`_CALLER_ERRORS`) carries its message. Any other
    (the store, a model, an internal check) carries a fixed sentence for its kind and a reference;
    its message is logged under that reference (logger ``shared_core.serve.mcp_server``), so no
    client ever reads another namespace's name or text, a path or a provider's reply.

    Raises:
        ToolError: from any :class:`~shared_core.types.HierMemError`.
    """
    try:
        yield
    except _CALLER_ERRORS as e:
        raise ToolError(str(e)) from e
    except HierMemError as e:
        ref = uuid.uuid4().hex[:12]
        told = next((text for cls, text in _SERVER_ERRORS if isinstance(e, cls)), None)
        transient = isinstance(e, _TRANSIENT)
        _log.log(
            logging.WARNING if transient else logging.ERROR,
            "%s failed (reference %s): %s: %s",
            tool,
            ref,
            type(e).__name__,
            e,
            exc_info=None if transient else e,
        )
        told = told or "The server failed to complete the call."
        raise ToolError(f"{told} (Reference {ref} in the server's log.)") from e


def _check_namespace(namespace: Any) -> tuple[str]:
    """Validate an MCP namespace (a plain string) into the one-part MemoryStore namespace.

    Raises:
        ToolError: not a string, empty, longer than ``MAX_PART_CHARS``, a control character or a lone
            surrogate.
    """
    if not isinstance(namespace, str):
        raise ToolError(f"namespace must be a string, got {type(namespace).__name__}.")
    if not namespace.strip():
        raise ToolError("namespace is empty; give a name such as 'alice' or 'project-x'.")
    if len(namespace) > MAX_PART_CHARS:
        raise ToolError(f"namespace has {len(namespace)} characters; the limit is {MAX_PART_CHARS}.")
    try:
        parts = normalize_namespace((namespace,))
    except InvalidInputError as e:
        msg = str(e).replace("Namespace part 0", "namespace")
        raise ToolError(msg) from None
    return (parts[0],)


def _json_safe(value: Any) -> Any:
    """``value`` with numpy scalars and arrays, tuples and other non-JSON types made JSON-safe."""

    def default(o: Any) -> Any:
        if hasattr(o, "tolist"):  # numpy scalars and arrays
            return o.tolist()
        if isinstance(o, (set, frozenset)):
            return sorted(o, key=str)
        return str(o)

    return json.loads(json.dumps(value, default=default, allow_nan=False))


class HierMemTools:
    """The MCP tools over one :class:`~shared_core.namespaces.MemoryStore` (plain methods, no MCP state).

    Args:
        store: the memories, one per namespace; an MCP namespace ``"x"`` is the store's ``("x",)``.
        access: ``None`` (every namespace: stdio, or HTTP on loopback without tokens), or a callable
            returning the :class:`~shared_core.serve.mcp_auth.Grant` of the request being served (``None``
            when it has none: every call is then refused).

    Every method raises :class:`ToolError` (an MCP error result with a clear message) for bad arguments
    and for a namespace the request's token may not use (checked before the store is touched, with
    one message whether the namespace exists or not). An error of the server's side (the store, a
    model) reaches the client as a fixed sentence with a reference; its message goes to the server's
    log only (see :func:`_as_tool_errors`), so no error carries text or names of another namespace.
    """

    def __init__(self, store: MemoryStore, access: Callable[[], Grant | None] | None = None) -> None:
        self.store = store
        self.access = access
        self._probe: HierarchicalMemory | None = None
        self._probe_lock = threading.Lock()
        self._skipped: set[tuple[str, str]] = set()  # directories logged as skipped

    def _grant(self) -> Grant | None:
        """The request's grant; ``None`` without access control.

        Raises:
            ToolError: access control is on and the request carries no known token.
        """
        if self.access is None:
            return None
        grant = self.access()
        if grant is None:
            raise ToolError("Not authenticated: this server needs a bearer token.")
        return grant

    def _namespace(self, namespace: Any) -> tuple[str]:
        """Validate a namespace (:func:`_check_namespace`) and check the request may use it.

        The check is on the exact string the store keys the namespace by, so a token reaches its own
        namespaces and no spelling of another.

        Raises:
            ToolError: a bad namespace, or one the request's token may not use.
        """
        grant = self._grant()
        ns = _check_namespace(namespace)
        if grant is not None and not grant.allows(ns[0]):
            raise ToolError(
                f"Access denied: this token may not use namespace {ns[0]!r} (its namespaces: "
                f"{grant.describe()})."
            )
        return ns

    def _empty_memory(self) -> HierarchicalMemory:
        """An empty memory of the store's kind, to validate a recall in a namespace that does not exist
        (a read never creates a namespace)."""
        with self._probe_lock:
            if self._probe is None:
                self._probe = self.store._new(("hiermem-mcp-probe",))
            return self._probe

    def remember(
        self,
        namespace: Namespace,
        text: Text,
        speaker: Speaker = None,
        timestamp: Timestamp = None,
    ) -> str:
        """Store a message (a fact, a note, a conversation turn) in a namespace's memory.

        Args:
            namespace: the memory to add to (created on first use).
            text: what to remember.
            speaker: who said it (stored as '<speaker>: <text>'), optional.
            timestamp: when it was said, ISO-8601; default now (UTC).

        Returns:
            The message's id: pass it to forget; recall hits list it in source_ids.

        Raises:
            ToolError: a bad namespace or one the token may not use, empty text, an unreadable timestamp.
        """
        ns = self._namespace(namespace)
        if timestamp is None:
            timestamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        elif parse_timestamp(timestamp) is None:
            raise ToolError(
                f"timestamp must be an ISO-8601 date or date-time such as '2025-05-08' or "
                f"'2025-05-08T14:30:00', got {timestamp!r}."
            )
        if speaker is not None and not speaker.strip():
            speaker = None
        mid = uuid.uuid4().hex
        with _as_tool_errors("remember"):
            msg = Message(text, speaker=speaker, timestamp=timestamp, id=mid)
            self.store.add(ns, msg)
        return mid

    def recall(
        self,
        namespace: Namespace,
        query: Query,
        k: K = 10,
        policy: Policy = None,
        time_range_start: RangeStart = None,
        time_range_end: RangeEnd = None,
        as_of: AsOf = None,
        min_score: MinScore = None,
    ) -> list[RecallHit]:
        """Find what a namespace's memory holds about a query, best first.

        Args:
            namespace: the memory to search (a namespace that does not exist has no hits).
            query: what to look for.
            k: most hits (1 to 100), default 10.
            policy: the memory's retrieval policy (default: its own).
            time_range_start: only messages at or after this ISO-8601 date or date-time.
            time_range_end: only messages at or before this one (a date includes its whole day).
            as_of: the time the query is asked at (ISO-8601; a date means the end of that day): no
                message timestamped after it, and time expressions resolve against it.
            min_score: only hits whose score (cosine similarity in [0, 1]) is at least this.

        Returns:
            Hits with text, score, is_leaf, span, source_ids (message ids), timestamp and speaker
            (of a leaf's message), and for a message that a newer one restates with another value
            (as of ``as_of``), ``superseded_by`` (the newer ids) and ``valid_to`` (when it was replaced).

        Raises:
            ToolError: a bad namespace or one the token may not use, an empty query, an unknown
                policy (the message names the choices), an unreadable or reversed time range, an
                unreadable ``as_of``, a ``min_score`` outside [0, 1].
        """
        ns = self._namespace(namespace)
        kw: dict[str, Any] = {}
        if time_range_start is not None or time_range_end is not None:
            kw["time_range"] = (time_range_start, time_range_end)
        if as_of is not None:
            kw["as_of"] = as_of
        if min_score is not None:
            kw["min_score"] = min_score
        with _as_tool_errors("recall"):
            # a namespace that does not exist: an empty memory validates the arguments and finds nothing
            mem = self.store.get(ns) or self._empty_memory()
            hits = mem.retrieve(query, k=k, policy=policy, **kw)
        out = []
        for h in hits:
            md = h.metadata if h.is_leaf else {}
            ts, who = md.get("timestamp"), md.get("speaker")
            out.append(
                RecallHit(
                    text=h.text,
                    score=float(h.score),
                    is_leaf=bool(h.is_leaf),
                    span=(int(h.span[0]), int(h.span[1])),
                    source_ids=[str(s) for s in h.source_ids],
                    timestamp=None if ts is None else str(ts),
                    speaker=None if who is None else str(who),
                    superseded_by=list(h.superseded_by),
                    valid_to=h.valid_to,
                )
            )
        return out

    def forget(self, namespace: Namespace, id: MessageId) -> int:
        """Delete a stored message by its id (the tree is repaired; summaries no longer draw on it).

        Args:
            namespace: the memory holding the message.
            id: the id remember returned.

        Returns:
            How many messages were removed (1, or more when several messages share the id).

        Raises:
            ToolError: a bad or unknown namespace or one the token may not use, an unknown id.
        """
        ns = self._namespace(namespace)
        if not isinstance(id, str) or not id.strip():
            raise ToolError("id is empty; pass an id that remember returned.")
        with _as_tool_errors("forget"):
            if self.store.get(ns) is None:
                raise ToolError(f"No namespace {namespace!r}; list_namespaces shows the existing ones.")
            return int(self.store.delete(ns, id))

    def list_namespaces(self) -> list[str]:
        """List the namespaces that have a memory, sorted (with a token: only those it may use).

        Returns:
            The namespace names (in-memory servers: those used since the server started).

        Raises:
            ToolError: the store cannot be read; no token (with access control).
        """
        grant = self._grant()
        with _as_tool_errors("list_namespaces"):
            stored = self.store.list_namespaces(on_invalid=self._skip_directory)
        names = [ns[0] for ns in stored if len(ns) == 1]
        return names if grant is None else [n for n in names if grant.allows(n)]

    def _skip_directory(self, path: Path | str, error: PersistenceError) -> None:
        """A namespace directory or PostgreSQL row that cannot be listed (e.g. its ``namespace.json``
        names another namespace: a copied or tampered directory): left out of every listing, and
        logged once (path and reason) for the operator; never shown to a client."""
        key = (str(path), str(error))
        with self._probe_lock:
            if key in self._skipped:
                return
            self._skipped.add(key)
        _log.warning("Skipping namespace directory %s: %s", path, error)

    def memory_stats(self, namespace: Namespace) -> dict[str, Any]:
        """Describe a namespace's memory: size, tree shape, model usage, retrieval policies.

        Args:
            namespace: the memory to describe.

        Returns:
            The memory's stats: kind, messages, leaves, nodes, internal_nodes, max_depth, mean_depth,
            mean_branching, usage, query_usage, policies, default_policy and kind-specific figures.

        Raises:
            ToolError: a bad or unknown namespace, or one the token may not use.
        """
        ns = self._namespace(namespace)
        with _as_tool_errors("memory_stats"):
            mem = self.store.get(ns)
            if mem is None:
                raise ToolError(
                    f"No namespace {namespace!r} (nothing remembered there yet); list_namespaces shows the "
                    "existing ones."
                )
            stats = dict(mem.stats())
        stats["messages"] = len(mem)
        stats["policies"] = list(mem.policies)
        stats["default_policy"] = mem.default_policy
        return _json_safe(stats)


# --------------------------------------------------------------------------- building blocks
def memory_factory(memory: str, embedder: Embedder) -> Callable[[], HierarchicalMemory]:
    """A factory of empty memories of one kind, all on ``embedder``.

    Args:
        memory: one of :data:`MEMORY_KINDS` (``segtree``, ``memtree``, ``hat``, ``xmemory``).
        embedder: shared by every memory the factory builds.

    Returns:
        A callable with no arguments returning a new memory.

    Raises:
        InvalidInputError: an unknown kind (the message names the choices).
    """
    from .. import memory_classes

    classes = memory_classes()
    if memory not in MEMORY_KINDS or memory not in classes:
        raise InvalidInputError(f"Unknown memory {memory!r}; choose one of {', '.join(MEMORY_KINDS)}.")
    cls = classes[memory]

    def factory() -> HierarchicalMemory:
        return cls(embedder=embedder)

    return factory


def open_store(
    store: str | Path | None = None,
    memory: str = "segtree",
    embedder: Embedder | None = None,
    *,
    max_resident: int | None = DEFAULT_MAX_RESIDENT,
) -> MemoryStore:
    """The namespaced memories the server serves.

    Args:
        store: ``None`` (in memory, lost on exit), a directory (one durable SQLite store per
            namespace; ``~`` is expanded, the directory is created) or a ``postgresql://`` URL.
        memory: the memory kind of new namespaces, one of :data:`MEMORY_KINDS`.
        embedder: shared by every namespace; default the embedded :class:`LocalEmbedder`.
        max_resident: most namespaces kept open at once (the least recently used durable ones beyond it
            are closed and reopened from their store on their next call), default 256; ``None``: no
            limit. In-memory namespaces (``store=None``) are never evicted.

    Returns:
        A :class:`~shared_core.namespaces.MemoryStore`.

    Raises:
        InvalidInputError: an unknown kind, a malformed URL, ``max_resident`` not a positive integer or
            ``None``.
        PersistenceError: the directory cannot be created or the database reached.
    """
    max_resident = check_max_resident(max_resident)
    if embedder is None:
        from ..models.local import LocalEmbedder

        embedder = LocalEmbedder()
    factory = memory_factory(memory, embedder)
    if store is None:
        return MemoryStore(factory, max_resident=max_resident)
    if isinstance(store, str) and is_postgres_url(store):
        return MemoryStore(factory, url=store, max_resident=max_resident)
    root = Path(store).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from ..types import PersistenceError

        raise PersistenceError(f"Cannot create the store directory {root}: {e}") from None
    return MemoryStore(factory, root_dir=root, durable=True, max_resident=max_resident)


def _warm_up(embedder: Embedder) -> None:
    """Embed one text so the model is loaded before the first tool call needs it."""
    # a failure (e.g. a missing 'local' extra) is reported again, in the server's log, by the first call
    # that embeds
    with suppress(Exception):
        embedder.embed(["hiermem"])


def build_server(
    store: MemoryStore,
    *,
    name: str = "hiermem",
    warm_up: Embedder | None = None,
    tokens: TokenTable | None = None,
    address: tuple[str, int] = ("127.0.0.1", 8000),
) -> MCPServer:
    """An MCP server with the five memory tools over ``store``.

    Args:
        store: the memories, one per namespace.
        name: the server's name, reported to clients.
        warm_up: an embedder to load in a background thread when the server starts (the one the
            store's memories use), so the first call does not wait for the model; ``None``: no warm-up.
        tokens: bearer tokens and their namespaces; ``None``: no access control. With tokens the
            HTTP app answers only requests with ``Authorization: Bearer <a configured token>``
            (HTTP 401 otherwise, the MCP SDK's bearer middleware) and each token reaches only its
            namespaces; in-process and stdio clients carry no token, so every call is refused.
        address: ``(host, port)`` the HTTP app is served at (the SDK's auth settings need a URL).

    Returns:
        An :class:`mcp.server.mcpserver.MCPServer`; ``.run()`` serves stdio,
        ``.run("streamable-http", host=..., port=...)`` HTTP.
    """
    from .. import __version__

    started = threading.Event()

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        if warm_up is not None and not started.is_set():
            started.set()
            threading.Thread(target=_warm_up, args=(warm_up,), name="hiermem-warm-up", daemon=True).start()
        yield {}

    auth: dict[str, Any] = {}
    if tokens is not None:
        auth = {"token_verifier": TokenTableVerifier(tokens), "auth": auth_settings(*address)}
    server: MCPServer = MCPServer(
        name,
        title="hiermem: hierarchical long-term memory",
        instructions=_INSTRUCTIONS,
        version=__version__,
        lifespan=lifespan,
        log_level="WARNING",
        **auth,
    )
    tools = HierMemTools(store, access=None if tokens is None else functools.partial(current_grant, tokens))
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    server.add_tool(tools.remember, annotations=ToolAnnotations(read_only_hint=False, open_world_hint=False))
    server.add_tool(tools.recall, annotations=read_only)
    server.add_tool(
        tools.forget,
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
    )
    server.add_tool(tools.list_namespaces, annotations=read_only)
    server.add_tool(tools.memory_stats, annotations=read_only)
    return server


def parse_host_port(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:8000`` for IPv6).

    Returns:
        ``(host, port)``.

    Raises:
        InvalidInputError: no port, a port that is not an integer in 1..65535, an empty host.
    """
    host, sep, port_s = value.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host:
        raise InvalidInputError(f"--http takes HOST:PORT such as 127.0.0.1:8000, got {value!r}.")
    try:
        port = int(port_s)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise InvalidInputError(f"--http port must be an integer from 1 to 65535, got {port_s!r}.")
    return host, port


def serve(
    store: str | Path | None = None,
    memory: str = "segtree",
    http: str | None = None,
    *,
    tokens: str | Path | TokenTable | None = None,
    embedder: Embedder | None = None,
    on_ready: Callable[[str], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    max_resident: int | None = DEFAULT_MAX_RESIDENT,
) -> None:
    """Serve the memory tools until the client disconnects (stdio) or the process is interrupted (HTTP).

    Every check below runs before the model loads, the store opens or a socket is bound.

    Args:
        store: see :func:`open_store` (``None``: in memory).
        memory: the memory kind of new namespaces.
        http: ``HOST:PORT`` to serve streamable HTTP at ``http://HOST:PORT/mcp``; ``None``: stdio.
        tokens: HTTP only: a tokens file (see :mod:`shared_core.serve.mcp_auth`) or a loaded table; every
            request then needs a bearer token, and each token reaches only its namespaces. Required
            unless ``HOST`` is loopback (``127.0.0.0/8``, ``::1``, ``localhost``).
        embedder: default the embedded local embedder.
        on_ready: called with a one-line description before serving (e.g. to print it on stderr).
        on_notice: called with each warning (an unauthenticated loopback server, a tokens file other
            users can read); default: printed on stderr.
        max_resident: most namespaces kept open at once, default 256 (see :func:`open_store`).

    Raises:
        InvalidInputError: a bad ``http``, kind, URL or ``max_resident``; ``tokens`` without ``http``.
        UnauthenticatedBindError: ``http`` on a host other than loopback without ``tokens``.
        TokensFileError: an unreadable or malformed tokens file, or a tokens path that is not a regular
            file (a FIFO, a socket, a device).
        PersistenceError: the store cannot be opened.
    """
    notice = on_notice if on_notice is not None else _print_notice
    max_resident = check_max_resident(max_resident)
    address = parse_host_port(http) if http is not None else None
    table: TokenTable | None = None
    if tokens is not None:
        if address is None:
            raise InvalidInputError(
                "--tokens applies to --http only: over stdio the client that starts the server owns it."
            )
        if isinstance(tokens, TokenTable):
            table = tokens
        else:
            table = TokenTable.load(tokens)
            warn = tokens_file_notice(tokens)
            if warn is not None:
                notice(warn)
    if address is not None and table is None and not is_loopback(address[0]):
        raise UnauthenticatedBindError(
            f"refusing to serve on {address[0]} without authentication: it is not a loopback address, so "
            "anyone who can reach it could read, change and delete every namespace. Give --tokens FILE "
            "(bearer tokens and the namespaces each may use), or bind 127.0.0.1."
        )
    if embedder is None:
        from ..models.local import LocalEmbedder

        embedder = LocalEmbedder()
    mem_store = open_store(store, memory, embedder, max_resident=max_resident)
    try:
        server = build_server(
            mem_store, warm_up=embedder, tokens=table, address=address or ("127.0.0.1", 8000)
        )
        # bm25s sets its own logger to DEBUG; keep the server's stderr (an MCP client's log) readable
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        where = "in memory only (lost when it stops)" if store is None else f"in {_describe(store)}"
        if address is None:
            if on_ready is not None:
                on_ready(f"hiermem MCP server on stdio: {memory} memories {where}")
            server.run()
        else:
            host, port = address
            if on_ready is not None:
                access = "" if table is None else f"; bearer tokens required ({len(table)} in {table.source})"
                url = f"http://{url_host(host)}:{port}/mcp"
                on_ready(f"hiermem MCP server on {url}: {memory} memories {where}{access}")
            if table is None:
                notice(
                    f"warning: no --tokens, so this server is unauthenticated: any program on this machine "
                    f"that can reach {url_host(host)}:{port} can read, change and delete every namespace."
                )
            server.run("streamable-http", host=host, port=port, transport_security=transport_security(host))
    finally:
        mem_store.close()


def _print_notice(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _describe(store: str | Path) -> str:
    """The store for a log line, without a PostgreSQL password."""
    s = str(store)
    if is_postgres_url(s):
        from urllib.parse import urlsplit

        parts = urlsplit(s)
        host = parts.hostname or ""
        return f"{parts.scheme}://{host}{parts.path}"
    return s
