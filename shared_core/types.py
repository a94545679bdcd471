"""Plain data types shared by every memory: messages, hits, usage reports and typed errors."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Union

__all__ = [
    "count_tokens",
    "parse_timestamp",
    "AddReport",
    "CommitUnknownError",
    "Completion",
    "DuplicateIdError",
    "EmbeddingError",
    "HierMemError",
    "Hit",
    "InvalidInputError",
    "LLMRequiredError",
    "MAX_ID_CHARS",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_DEPTH",
    "MAX_ROLE_CHARS",
    "MAX_SPEAKER_CHARS",
    "MAX_TIMESTAMP_CHARS",
    "MemoryClosedError",
    "Message",
    "MessageLike",
    "ModelError",
    "NamespaceBusyError",
    "NodeNotFoundError",
    "PersistenceError",
    "UnknownPolicyError",
    "Usage",
    "VersionMismatchError",
    "check_message_fields",
]


# --------------------------------------------------------------------------- errors
class HierMemError(Exception):
    """Base class of every error raised by hiermem."""


class InvalidInputError(HierMemError, ValueError):
    """Input that cannot be stored or used: empty text, ``None``, a non-string, a bad parameter."""


class EmbeddingError(HierMemError, ValueError):
    """An embedder returned vectors of the wrong shape, dtype or with NaN/inf values."""


class ModelError(HierMemError, RuntimeError):
    """A model provider (embedder or LLM) failed after the configured retries."""


class LLMRequiredError(HierMemError, ValueError):
    """An option that needs an LLM was used on a memory built with ``llm=None``."""


class UnknownPolicyError(HierMemError, ValueError):
    """A retrieval ``policy`` (or another named option) that this memory does not have."""


class NodeNotFoundError(HierMemError, KeyError):
    """No node or source id of that name exists in the memory."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class DuplicateIdError(InvalidInputError):
    """An ``add`` gave a source id (``Message.id``) the memory already holds, or the same id twice in one
    call; nothing was added. ``add(..., upsert=True)`` replaces the stored message instead.

    Attributes:
        ids: the offending ids, in the order of the call.
    """

    def __init__(self, message: str, *, ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.ids = ids


class MemoryClosedError(HierMemError, RuntimeError):
    """The memory was closed (``close()`` or the end of its ``with`` block); open it again to use it."""


class PersistenceError(HierMemError, OSError):
    """A save could not be written, or a directory is not a saved hiermem memory."""


class VersionMismatchError(PersistenceError):
    """A saved memory was written by an incompatible format version."""


class NamespaceBusyError(PersistenceError):
    """A call found a namespace of a shared store busy: its writer lock (or, for any call, a table lock
    another session holds, e.g. VACUUM FULL) was not free within the lock timeout, or other processes
    kept committing to it while this write computed its change (every attempt was recomputed from their
    changes). Nothing was written; trying again later is safe.

    Attributes:
        namespace: the busy namespace (a tuple of strings), when known.
    """

    def __init__(self, message: str, *, namespace: tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        self.namespace = namespace


class CommitUnknownError(PersistenceError):
    """The connection was lost during a ``COMMIT`` and the server could not be asked whether it landed:
    the change may or may not be stored. The process reloads its state from the database before its
    next operation, so it then shows whichever is true; check before retrying (a retry may store the
    change twice)."""


# --------------------------------------------------------------------------- messages
#: Limits of the stored fields of a :class:`Message` other than its text (whose limit is the memory's
#: ``max_message_chars``, 100,000 characters by default). A memory's ``add`` checks every message of
#: the call against them before it changes anything (:func:`check_message_fields`), so a rejected call
#: leaves the memory as it was. ``speaker`` is stored in the leaf's text (``"<speaker>: <text>"``), the
#: others beside it and in every save.
#: longest ``speaker`` in characters
MAX_SPEAKER_CHARS = 1_000
#: longest ``role`` in characters
MAX_ROLE_CHARS = 256
#: longest ``timestamp`` in characters
MAX_TIMESTAMP_CHARS = 256
#: longest ``id`` (the caller's source id) in characters
MAX_ID_CHARS = 1_000
#: largest ``metadata`` as JSON (``json.dumps(metadata, ensure_ascii=False)``), in UTF-8 bytes
MAX_METADATA_BYTES = 100_000
#: deepest nesting of ``metadata``: the dict itself is level 1, a list or dict inside it level 2, ...
MAX_METADATA_DEPTH = 32

_FIELD_LIMITS = (
    ("speaker", MAX_SPEAKER_CHARS, "MAX_SPEAKER_CHARS"),
    ("role", MAX_ROLE_CHARS, "MAX_ROLE_CHARS"),
    ("timestamp", MAX_TIMESTAMP_CHARS, "MAX_TIMESTAMP_CHARS"),
    ("id", MAX_ID_CHARS, "MAX_ID_CHARS"),
)
#: fields kept as the caller gave them, so only a string (or None) is accepted; ``id`` and ``timestamp``
#: are turned into strings when the message is made
_TEXT_FIELDS = ("speaker", "role")


@dataclass(frozen=True)
class Message:
    """One unit of conversation to remember.

    Args:
        text: the content (a non-empty, non-whitespace string).
        role: e.g. ``"user"`` / ``"assistant"``; free-form string, default ``None``.
        speaker: the speaker's name (a string), default ``None``.
        timestamp: when it was said (ISO string or any string the caller uses), default ``None``;
            another value is turned into ``str(value)``.
        id: the caller's source id (e.g. a LoCoMo ``dia_id``), kept on the leaf and reported in hits;
            another value is turned into ``str(value)``.
        metadata: any JSON-serialisable extra data with string keys, kept on the leaf.

    Raises:
        InvalidInputError: ``text`` is not a string, is empty or whitespace-only. A memory's ``add``
            checks the other fields (:func:`check_message_fields`).
    """

    text: str
    role: str | None = None
    speaker: str | None = None
    timestamp: str | None = None
    id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise InvalidInputError(
                f"Message text must be a str, got {type(self.text).__name__}; convert it with str() first."
            )
        if not self.text.strip():
            raise InvalidInputError("Message text is empty or whitespace-only; pass a non-empty string.")
        if self.id is not None and not isinstance(self.id, str):
            object.__setattr__(self, "id", str(self.id))
        if self.timestamp is not None and not isinstance(self.timestamp, str):
            object.__setattr__(self, "timestamp", str(self.timestamp))
        if not isinstance(self.metadata, dict):
            raise InvalidInputError("Message metadata must be a dict.")

    def render(self) -> str:
        """The text a memory stores, embeds and returns for this message: ``"<speaker>: <text>"`` when
        it has a speaker, else its text. Questions often name the speaker ("What did Melanie paint?"),
        so the name belongs in what is indexed (on LoCoMo, dense recall@10 over bare turn texts is 0.24
        against 0.46 with the speaker)."""
        return f"{self.speaker}: {self.text}" if self.speaker else self.text

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable when ``metadata`` is)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["metadata"] = copy.deepcopy(self.metadata)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


MessageLike = Union[str, Message]


def as_messages(items: MessageLike | Iterable[MessageLike] | None) -> list[Message]:
    """Normalise ``str | Message | iterable of them`` into a list of messages, validating all first.

    Raises:
        InvalidInputError: ``None``, an empty iterable, or any element that is not a valid message.
    """
    if items is None:
        raise InvalidInputError("Nothing to add: got None; pass a string, a Message or a list of them.")
    if isinstance(items, (str, Message)):
        items = [items]
    elif isinstance(items, dict):
        raise InvalidInputError("Got a dict; wrap it as Message(**d) or pass its text.")
    elif isinstance(items, (bytes, bytearray, memoryview)):
        raise InvalidInputError(
            f"Cannot add {type(items).__name__}; decode it to a str first (e.g. data.decode('utf-8'))."
        )
    try:
        seq = list(items)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidInputError(
            f"Cannot add {type(items).__name__}; pass a string, a Message or a list of them."
        ) from None
    if not seq:
        raise InvalidInputError("Nothing to add: the list is empty.")
    out: list[Message] = []
    for i, it in enumerate(seq):
        if isinstance(it, Message):
            out.append(it)
        elif isinstance(it, str):
            try:
                out.append(Message(it))
            except InvalidInputError as e:
                raise InvalidInputError(f"Item {i}: {e}") from None
        else:
            raise InvalidInputError(
                f"Item {i} is a {type(it).__name__}; every item must be a str or a Message."
            )
    return out


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (for error messages about hostile values)."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _metadata_shape(metadata: dict[str, Any], i: int) -> None:
    """Reject metadata with a key that is not a string (at any depth), nested deeper than
    ``MAX_METADATA_DEPTH`` (a cycle is infinitely deep) or whose keys and strings alone exceed
    ``MAX_METADATA_BYTES`` characters, walking at most about that many values (a value shared many times
    is walked each time, as JSON would write it)."""
    stack: list[tuple[Any, int]] = [(metadata, 1)]
    budget = MAX_METADATA_BYTES  # every value, key and character takes at least one byte of JSON
    while stack:
        value, depth = stack.pop()
        budget -= 1
        if isinstance(value, str):
            budget -= len(value)
        elif isinstance(value, (dict, list, tuple)):
            if depth > MAX_METADATA_DEPTH:
                raise InvalidInputError(
                    f"Item {i}: the message metadata is nested deeper than {MAX_METADATA_DEPTH} levels "
                    "(MAX_METADATA_DEPTH); flatten it."
                )
            if isinstance(value, dict):
                for k, v in value.items():
                    if not isinstance(k, str):
                        raise InvalidInputError(
                            f"Item {i}: the message metadata has the key {_short(k)} of type "
                            f"{type(k).__name__}; keys must be strings (JSON would turn it into "
                            f"{_short(str(k))} in a save or a store)."
                        )
                    budget -= 1 + len(k)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in value)
        if budget < 0:
            raise InvalidInputError(
                f"Item {i}: the message metadata is larger than {MAX_METADATA_BYTES:,} bytes as JSON "
                "(MAX_METADATA_BYTES); keep large data outside the memory and store a reference to it."
            )


def check_message_fields(m: Message, i: int = 0) -> str:
    """Check the fields of a message other than its text against their limits.

    Args:
        m: the message. i: its position in the call (for the error message).

    Returns:
        The message as JSON (``json.dumps(m.to_dict(), ensure_ascii=False)``), for further checks.

    Raises:
        InvalidInputError: naming the field and its limit: ``speaker``, ``role``, ``timestamp`` or
            ``id`` longer than ``MAX_SPEAKER_CHARS`` / ``MAX_ROLE_CHARS`` / ``MAX_TIMESTAMP_CHARS`` /
            ``MAX_ID_CHARS`` characters; a ``speaker`` or ``role`` that is neither a string nor
            ``None``; ``metadata`` with a key that is not a string (at any depth), nested deeper than
            ``MAX_METADATA_DEPTH``, larger than ``MAX_METADATA_BYTES`` as JSON, or not
            JSON-serialisable.
    """
    import json

    for name, limit, const in _FIELD_LIMITS:
        value = getattr(m, name)
        if value is None:
            continue
        if name in _TEXT_FIELDS and not isinstance(value, str):
            raise InvalidInputError(
                f"Item {i}: the message {name} must be a string or None, got {type(value).__name__} "
                f"{_short(value)}."
            )
        n = len(value) if isinstance(value, str) else len(str(value))
        if n > limit:
            raise InvalidInputError(
                f"Item {i}: the message {name} has {n:,} characters; the limit is {limit:,} ({const})."
            )
    _metadata_shape(m.metadata, i)
    try:
        meta = json.dumps(m.metadata, ensure_ascii=False)
        payload = json.dumps(m.to_dict(), ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(
            f"Item {i}: the message metadata is not JSON-serialisable ({e}); use str / int / float / bool / "
            "None / lists / dicts."
        ) from None
    except RecursionError:  # pragma: no cover - the depth limit comes first
        raise InvalidInputError(f"Item {i}: the message metadata is nested too deeply.") from None
    size = len(meta.encode("utf-8", errors="surrogatepass"))
    if size > MAX_METADATA_BYTES:
        raise InvalidInputError(
            f"Item {i}: the message metadata is {size:,} bytes as JSON; the limit is {MAX_METADATA_BYTES:,} "
            "(MAX_METADATA_BYTES). Keep large data outside the memory and store a reference to it."
        )
    return payload


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Hit:
    """One retrieved node.

    Attributes:
        node_id: the node's id in the memory (int, stable for the node's life).
        text: the node's text (a leaf's message or an internal node's annotation/summary).
        score: how close the hit's text is to the query, in ``[0, 1]``: the cosine similarity of the
            query's and the node's embeddings (the node's own vector: a leaf's is its message's
            embedding), clipped to ``[0, 1]``. It is the same for the same query and message whatever
            else the memory holds, comparable across queries, and what ``min_score`` thresholds; it is
            not the order of the hits (hits come in the policy's order: see ``components["rank"]``).
        depth: distance from the root (root = 0).
        is_leaf: whether the node is a leaf (a stored message).
        span: ``(first, last)`` insertion index (0-based) of the leaves under the node.
        source_ids: caller ids (``Message.id``) of the leaves under the node, in insertion order;
            leaves without an id are left out.
        metadata: policy- and algorithm-specific extras (e.g. ``level``, ``speaker``, ``timestamp``).
        components: the figures behind the hit: ``"rank"`` (the policy's own ranking score, higher
            first; relative to the rest of the memory: e.g. relevance divided by its maximum over every
            node, or relevance propagated over the tree), ``"dense"`` (the raw cosine, in ``[-1, 1]``)
            and, when the memory's relevance reads BM25, ``"bm25"`` (the Okapi BM25 score of the text,
            not normalised); under ``top_down`` and ``bottom_up`` also ``"propagated"`` (the relevance
            propagated over the tree, which is the ranking figure there). Empty on a hit not made by
            ``retrieve``.
        rank: 1-based position in the policy's order (0 on a hit not made by ``retrieve``).
        policy: the retrieval policy that ranked it (``""`` on a hit not made by ``retrieve``).
        path: node ids from the root down to this node (empty on a hit not made by ``retrieve``).
        superseded_by: the source ids (``Message.id``; ``"node:<id>"`` for a message without one) of
            the newer messages that restate this leaf's statement with another value, as of the
            retrieval's ``as_of``; empty while the statement is current (and on internal nodes).
        valid_from: the leaf's ``Message.timestamp`` (``None`` without one, and on internal nodes).
        valid_to: the timestamp of the earliest newer statement that supersedes it; ``None`` while it
            is current (or when that message has no timestamp).
    """

    node_id: int
    text: str
    score: float
    depth: int
    is_leaf: bool
    span: tuple[int, int]
    source_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)
    rank: int = 0
    policy: str = ""
    path: list[int] = field(default_factory=list)
    superseded_by: tuple[str, ...] = ()
    valid_from: str | None = None
    valid_to: str | None = None

    def explain(self) -> str:
        """Why the hit ranked where it did, in words: its place in the policy's order and the figure
        it was ranked by, what scored (cosine, BM25), and where it sits in the tree.

        Returns:
            One or two sentences, e.g. ``"#1 by collapsed (rank score 0.8731): a message (leaf at depth
            2, path 0 > 4 > 17); cosine similarity to the query 0.62, BM25 7.41."``
        """
        what = "a message" if self.is_leaf else f"a summary of {self.span[1] - self.span[0] + 1} messages"
        where = f"leaf at depth {self.depth}" if self.is_leaf else f"node at depth {self.depth}"
        if self.path:
            where += ", path " + " > ".join(str(i) for i in self.path)
        head = f"#{self.rank} by {self.policy}" if self.rank else "not ranked by retrieve"
        if "rank" in self.components:
            head += f" (rank score {self.components['rank']:.4f})"
        parts = [f"cosine similarity to the query {self.components.get('dense', self.score):.2f}"]
        if "bm25" in self.components:
            parts.append(f"BM25 {self.components['bm25']:.2f}")
        extra = ""
        if "neighbour_of" in self.metadata:
            extra = f" It was added as a neighbour of node {self.metadata['neighbour_of']}."
        if self.superseded_by:
            when = f" on {self.valid_to}" if self.valid_to else ""
            extra += f" It was replaced{when} by {', '.join(self.superseded_by)}."
        return f"{head}: {what} ({where}); {', '.join(parts)}.{extra}"


@dataclass
class Usage:
    """Model usage counters. Seconds are wall-clock seconds."""

    embed_calls: int = 0
    embedded_texts: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __iadd__(self, other: Usage) -> Usage:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def copy(self) -> Usage:
        return Usage(**self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class AddReport:
    """What one ``add`` did.

    Attributes:
        leaf_ids: node ids of the new leaves, in order.
        usage: model usage of this call (embedding calls, LLM calls, tokens, seconds).
        details: algorithm-specific facts per message (e.g. SegTreeMem's attachment level).
    """

    leaf_ids: list[int] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    details: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Completion:
    """An LLM answer.

    Attributes:
        text: the completion text.
        usage: its usage (``llm_calls`` = 1, tokens as the provider reported them).
        logprobs: per-token log-probabilities of the completion (natural log), when asked for and given.
    """

    text: str
    usage: Usage = field(default_factory=Usage)
    logprobs: list[float] | None = None


def check_finite(x: float, name: str) -> float:
    """Return ``x`` as float, or raise InvalidInputError when it is NaN or infinite."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        raise InvalidInputError(f"{name} must be a finite number, got {x}.")
    return x


def check_branching(value: Any, none_means: str) -> int | None:
    """A branching factor (the most children a node may have): an int >= 2, or ``None`` for no bound.

    Args:
        value: the option's value.
        none_means: what ``None`` stands for, named in the error message.

    Raises:
        InvalidInputError: not ``None`` and not an int >= 2 (booleans included).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 2:
        raise InvalidInputError(f"branching must be an int >= 2 or None ({none_means}), got {value!r}.")
    return int(value)


_ISO_PREFIX = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?")
_TIME_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%d %B %Y", "%B %d, %Y")


def parse_timestamp(value: Any) -> datetime | None:
    """Parse a message timestamp leniently; ``None`` when it cannot be read.

    Accepts ISO 8601 (``"2025-12-19T10:00:00"``), a leading ISO date or date-time followed by anything
    (RealMem's ``"2025-12-19 (Friday)"``) and LoCoMo's ``"1:56 pm on 8 May, 2023"``. Time zones are
    dropped (times are compared as wall-clock times).

    Args:
        value: the ``Message.timestamp`` (any type; non-strings give ``None``).

    Returns:
        A naive :class:`datetime`, or ``None``.
    """
    if not isinstance(value, str) or not value.strip():
        return None
    s = value.strip()
    try:
        return datetime.fromisoformat(s).replace(tzinfo=None)
    except ValueError:
        pass
    m = _ISO_PREFIX.match(s)
    if m:
        try:
            return datetime.fromisoformat(m.group(0).replace(" ", "T"))
        except ValueError:
            pass
    for fmt in _TIME_FORMATS:
        try:
            return datetime.strptime(s, fmt)
        except ValueError:
            continue
    return None


_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str | Sequence[str]) -> int:
    """Number of tokens, counted as regex word runs and single punctuation marks (``\\w+|[^\\w\\s]``).

    Args:
        text: a string or a list of strings (counts add up).

    Returns:
        The token count (int >= 0).
    """
    if isinstance(text, str):
        return len(_TOKEN_RE.findall(text))
    return sum(len(_TOKEN_RE.findall(t)) for t in text)
