"""Loaders of evaluation conversations: LoCoMo, RealMem, plain JSONL, and the bundled RealMem excerpt.

Every loader returns :class:`Conversation` objects: the messages in the order they are ingested and the
queries with the online position at which each is asked (the number of messages ingested before it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..memories.base import HierarchicalMemory
from ..types import InvalidInputError, Message

__all__ = [
    "Conversation",
    "Query",
    "load_jsonl",
    "load_locomo",
    "load_realmem",
    "load_realmem_excerpt",
    "normalize_evidence_id",
    "render_message",
]

EXCERPT_RESOURCE = "realmem_excerpt.json"


@dataclass
class Query:
    """A question asked of memory, with its gold answer and evidence.

    Attributes:
        question: the question text.
        answer: the gold answer text (``""`` when the dataset gives none, e.g. LoCoMo category 5).
        evidence: caller ids of the messages holding the evidence (``Message.id`` values: LoCoMo turn
            ids, RealMem session ids), distinct, in dataset order.
        category: the dataset's category (LoCoMo: int 1–5; RealMem: its ``category_name``), or None.
        position: number of messages ingested before the query is asked (online protocol).
        id: a stable query id.
        meta: dataset-specific extras (e.g. RealMem ``memory_used``), JSON-serialisable.
    """

    question: str
    answer: str
    evidence: list[str]
    category: str | int | None
    position: int
    id: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form."""
        return asdict(self)


@dataclass
class Conversation:
    """One conversation to ingest in order, with the queries asked along the way.

    Attributes:
        id: the conversation's id (LoCoMo ``sample_id``, RealMem person name, or the file name).
        messages: the messages in ingestion order.
        queries: the queries, sorted by ``position``.
        skipped_evidence: evidence ids dropped because they were malformed beyond repair or named no
            message ingested before the query.
        meta: loader facts (source, skipped queries, ...).
    """

    id: str
    messages: list[Message]
    queries: list[Query]
    skipped_evidence: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (messages as dicts)."""
        return {
            "id": self.id,
            "messages": [m.to_dict() for m in self.messages],
            "queries": [q.to_dict() for q in self.queries],
            "skipped_evidence": self.skipped_evidence,
            "meta": dict(self.meta),
        }


def render_message(message: Message) -> str:
    """The text under which a message is indexed and returned by the flat baselines.

    ``"<speaker>: <text>"`` when the message has a speaker, else its text. Questions often name the
    speaker ("What did Melanie paint?"), so the name belongs in the indexed text; the reference figures
    of the evaluation data were measured on this rendering.

    Args:
        message: the message.

    Returns:
        The rendered string.
    """
    return message.render()


# --------------------------------------------------------------------------- helpers
def _read_json(path: str | Path) -> Any:
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(f"No such file: {p}; pass the path of an existing JSON file.")
    try:
        with p.open(encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"{p} is not valid JSON ({e}).") from None


_ID_RE = re.compile(r"D:?(\d+):(\d+)")


def normalize_evidence_id(raw: str) -> list[str]:
    """Split and repair one LoCoMo evidence string into turn ids ``"D<session>:<turn>"``.

    Repairs the known defects: several ids in one string separated by ``;``, ``,`` or spaces
    (``"D8:6; D9:17"`` → ``["D8:6", "D9:17"]``), a stray colon (``"D:11:26"`` → ``"D11:26"``) and
    leading zeros (``"D30:05"`` → ``"D30:5"``). Pieces that match no id pattern are left out.

    Args:
        raw: the evidence string as found in the file.

    Returns:
        The repaired ids, in order (possibly empty).

    References:
        Maharana et al. (2024), LoCoMo, ``qa[].evidence`` field.
    """
    out: list[str] = []
    for piece in re.split(r"[;,\s]+", str(raw).strip()):
        m = _ID_RE.fullmatch(piece)
        if m:
            out.append(f"D{int(m.group(1))}:{int(m.group(2))}")
    return out


def _session_keys(conv: dict[str, Any]) -> list[tuple[int, str]]:
    keys = []
    for k, v in conv.items():
        m = re.fullmatch(r"session_(\d+)", k)
        if m and isinstance(v, list):
            keys.append((int(m.group(1)), k))
    return sorted(keys)


# --------------------------------------------------------------------------- LoCoMo
def _locomo_conversation(item: dict[str, Any], categories: set[int] | None, captions: bool) -> Conversation:
    try:
        sample_id = str(item["sample_id"])
        conv = item["conversation"]
        qa = item.get("qa", [])
    except (KeyError, TypeError):
        raise InvalidInputError(
            "A LoCoMo item needs 'sample_id', 'conversation' and 'qa'; is this a LoCoMo file?"
        ) from None
    messages: list[Message] = []
    for n, key in _session_keys(conv):
        when = conv.get(f"{key}_date_time")
        for turn in conv[key]:
            text = str(turn.get("text", ""))
            caption = turn.get("blip_caption")
            if captions and caption:
                text = (
                    f"{text} [shares a photo: {caption}]" if text.strip() else f"[shares a photo: {caption}]"
                )
            if not text.strip():
                continue
            messages.append(
                Message(
                    text=text,
                    speaker=turn.get("speaker"),
                    timestamp=when,
                    id=turn.get("dia_id"),
                    role=None,
                    metadata={"session": n},
                )
            )
    known = {m.id for m in messages}
    queries: list[Query] = []
    skipped_ev = 0
    skipped_q = 0
    for qi, q in enumerate(qa):
        cat = q.get("category")
        if categories is not None and cat not in categories:
            continue
        ev: list[str] = []
        for raw in q.get("evidence") or []:
            fixed = normalize_evidence_id(raw)
            if not fixed:
                skipped_ev += 1
            for e in fixed:
                if e in known:
                    if e not in ev:
                        ev.append(e)
                else:
                    skipped_ev += 1
        if not ev:
            skipped_q += 1
            continue
        answer = q.get("answer")
        meta = {}
        if "adversarial_answer" in q:
            meta["adversarial_answer"] = q["adversarial_answer"]
        queries.append(
            Query(
                question=str(q["question"]),
                answer="" if answer is None else str(answer),
                evidence=ev,
                category=cat,
                position=len(messages),
                id=f"{sample_id}:q{qi}",
                meta=meta,
            )
        )
    return Conversation(
        id=sample_id,
        messages=messages,
        queries=queries,
        skipped_evidence=skipped_ev,
        meta={
            "source": "locomo",
            "speakers": [conv.get("speaker_a"), conv.get("speaker_b")],
            "sessions": len(_session_keys(conv)),
            "skipped_queries": skipped_q,
        },
    )


def load_locomo(
    path: str | Path, categories: Iterable[int] | None = (1, 2, 3, 4), *, captions: bool = True
) -> list[Conversation]:
    """Load a LoCoMo file (a list of conversations, or one conversation object).

    Messages are the turns in session order: ``Message(text, speaker, timestamp=<session date_time>,
    id=<dia_id>, role=None, metadata={"session": n})``. A turn that shares an image gets its caption
    appended as ``" [shares a photo: <blip_caption>]"``. Queries are asked after the whole conversation
    (``position = len(messages)``). Evidence ids are repaired with :func:`normalize_evidence_id`; ids
    naming no turn are dropped and counted in ``skipped_evidence``; queries left without evidence are
    dropped and counted in ``meta["skipped_queries"]``.

    Args:
        path: the JSON file (e.g. LoCoMo's ``locomo10.json``).
        categories: QA categories to keep, default ``(1, 2, 3, 4)`` (5, adversarial, left out);
            ``None`` keeps all.
        captions: append image captions to the turn text, default ``True``.

    Returns:
        One :class:`Conversation` per LoCoMo sample, in file order.

    Raises:
        InvalidInputError: the file is missing, not JSON, or not in LoCoMo's shape.

    References:
        Maharana et al. (2024), "Evaluating Very Long-Term Conversational Memory of LLM Agents", §3
        (dataset) and the public ``locomo10.json`` format.
    """
    data = _read_json(path)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise InvalidInputError(f"{path}: expected a JSON list of LoCoMo conversations.")
    cats = None if categories is None else {int(c) for c in categories}
    return [_locomo_conversation(item, cats, captions) for item in data]


# --------------------------------------------------------------------------- RealMem
def _realmem_from_data(data: Any, default_id: str) -> Conversation:
    if not isinstance(data, dict) or not isinstance(data.get("dialogues"), list):
        raise InvalidInputError(
            "A RealMem file is an object with a 'dialogues' list; is this a RealMem file?"
        )
    meta_in = data.get("_metadata") or {}
    messages: list[Message] = []
    queries: list[Query] = []
    skipped_ev = 0
    skipped_q = 0
    skipped_msgs = 0
    for s in data["dialogues"]:
        try:
            uuid = str(s["session_uuid"])
            turns = s["dialogue_turns"]
        except (KeyError, TypeError):
            raise InvalidInputError(
                "Each RealMem dialogue needs 'session_uuid' and 'dialogue_turns'."
            ) from None
        ident = s.get("session_identifier")
        when = s.get("current_time")
        for j, t in enumerate(turns):
            speaker = str(t.get("speaker", ""))
            content = str(t.get("content", ""))
            if t.get("is_query"):
                nxt = turns[j + 1] if j + 1 < len(turns) else None
                raw_ev = list((nxt or {}).get("memory_session_uuids") or [])
                ingested = {m.id for m in messages}
                ev: list[str] = []
                for e in raw_ev:
                    e = str(e)
                    if e in ingested:
                        if e not in ev:
                            ev.append(e)
                    else:
                        skipped_ev += 1
                if not ev or nxt is None:
                    skipped_q += 1
                else:
                    qid = t.get("query_id") or f"{uuid}:{j}"
                    queries.append(
                        Query(
                            question=content,
                            answer=str(nxt.get("content", "")),
                            evidence=ev,
                            category=t.get("category_name"),
                            position=len(messages),
                            id=str(qid),
                            meta={
                                "memory_used": [
                                    str(m.get("content", "")) if isinstance(m, dict) else str(m)
                                    for m in nxt.get("memory_used") or []
                                ],
                                "topic": t.get("topic"),
                                "session": ident,
                            },
                        )
                    )
            if not content.strip():
                skipped_msgs += 1
                continue
            messages.append(
                Message(
                    text=content,
                    role="user" if speaker.lower() == "user" else "assistant",
                    speaker="User" if speaker.lower() == "user" else "Assistant",
                    timestamp=when,
                    id=uuid,
                    metadata={"session": ident},
                )
            )
    return Conversation(
        id=str(meta_in.get("person_name") or default_id),
        messages=messages,
        queries=queries,
        skipped_evidence=skipped_ev,
        meta={
            "source": "realmem",
            "sessions": len(data["dialogues"]),
            "skipped_queries": skipped_q,
            "skipped_messages": skipped_msgs,
            "file_metadata": {k: v for k, v in meta_in.items() if isinstance(v, (str, int, float, bool))},
        },
    )


def load_realmem(path: str | Path) -> Conversation:
    """Load one RealMem persona file as an online conversation.

    Messages are all dialogue turns in order: ``Message(text=content, role="user"|"assistant",
    speaker="User"|"Assistant", timestamp=<session current_time>, id=<session_uuid>,
    metadata={"session": <session_identifier>})`` — evidence is session-level, so a message's id is its
    session's uuid. A turn with ``is_query`` true is asked at ``position`` = its index (the query turn
    and everything after it are not yet ingested; the query turn is still ingested afterwards as an
    ordinary message). Its evidence is the next assistant turn's ``memory_session_uuids`` restricted to
    sessions already ingested (ids outside are dropped and counted in ``skipped_evidence``); its answer
    is that assistant turn's ``content`` — the reply the memory
    should enable — while the extracted ``memory_used`` texts are kept in ``Query.meta``. Queries without
    evidence are skipped and counted in ``meta["skipped_queries"]``; turns with empty content are left
    out and counted in ``meta["skipped_messages"]``.

    Args:
        path: the persona JSON file (``{"_metadata": ..., "dialogues": [...]}``).

    Returns:
        The conversation.

    Raises:
        InvalidInputError: the file is missing, not JSON, or not in RealMem's shape.

    References:
        Bian et al. (2026), "RealMem: Benchmarking LLMs in Real-World Memory-Driven Interaction",
        dataset format (``memory_session_uuids``: session-level evidence).
    """
    return _realmem_from_data(_read_json(path), Path(path).stem)


def load_realmem_excerpt() -> Conversation:
    """The RealMem excerpt bundled with the package (first sessions of one persona, Apache-2.0).

    Returns:
        The conversation (about 400 turns and a couple of dozen queries whose evidence lies inside it).

    References:
        Bian et al. (2026), RealMemBench; see the package's NOTICE for attribution.
    """
    res = resources.files("shared_core") / "data" / EXCERPT_RESOURCE
    with resources.as_file(res) as p:
        return load_realmem(p)


# --------------------------------------------------------------------------- JSONL
_MESSAGE_FIELDS = ("role", "speaker", "timestamp", "id", "metadata")


def load_jsonl(path: str | Path) -> Conversation:
    """Load a conversation from JSON Lines.

    Each line is an object. A line with ``"text"`` is a message (optional ``role``, ``speaker``,
    ``timestamp``, ``id``, ``metadata``). A line with ``"question"`` is a query asked after the messages
    above it (optional ``answer``, ``evidence`` — message ids —, ``category``, ``id``). Blank lines are
    ignored.

    Args:
        path: the ``.jsonl`` file.

    Returns:
        The conversation (id = the file's stem).

    Raises:
        InvalidInputError: the file is missing, a line is not a JSON object, or has neither ``text``
            nor ``question``, or its text is empty.
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(f"No such file: {p}; pass the path of an existing JSONL file.")
    messages: list[Message] = []
    queries: list[Query] = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"{p}:{lineno}: not valid JSON ({e}).") from None
            if not isinstance(obj, dict):
                raise InvalidInputError(f"{p}:{lineno}: each line must be a JSON object.")
            if "text" in obj:
                try:
                    messages.append(
                        Message(text=obj["text"], **{k: obj[k] for k in _MESSAGE_FIELDS if k in obj})
                    )
                except InvalidInputError as e:
                    raise InvalidInputError(f"{p}:{lineno}: {e}") from None
            elif "question" in obj:
                ev = obj.get("evidence") or []
                if isinstance(ev, str):
                    ev = [ev]
                queries.append(
                    Query(
                        question=str(obj["question"]),
                        answer=str(obj.get("answer") or ""),
                        evidence=list(dict.fromkeys(str(e) for e in ev)),
                        category=obj.get("category"),
                        position=len(messages),
                        id=str(obj.get("id") or f"{p.stem}:q{len(queries)}"),
                    )
                )
            else:
                raise InvalidInputError(f"{p}:{lineno}: a line needs a 'text' (message) or a 'question'.")
    return Conversation(id=p.stem, messages=messages, queries=queries, meta={"source": "jsonl"})


def add_turns(obj: Any, messages: list[Message]) -> Any:
    """Add a conversation's turns to a memory or a flat baseline (anything with ``add(list[Message])``).

    The turns of one session share their session id in RealMem and LongMemEval (evidence is counted per
    session), so a memory keeps several messages under one id (``allow_duplicate_ids=True``).
    """
    if isinstance(obj, HierarchicalMemory):
        return obj.add(messages, allow_duplicate_ids=True)
    return obj.add(messages)
