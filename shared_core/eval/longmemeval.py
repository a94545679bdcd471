"""LongMemEval in ``hiermem eval``: the loader, the question selection, the retrieval metrics and tables.

Each LongMemEval question carries its own haystack, so each becomes one
:class:`~shared_core.eval.data.Conversation` (id = ``question_id``): the haystack's sessions sorted by
``haystack_dates`` (a stable sort: sessions of one date keep their file order), every turn a
:class:`~shared_core.types.Message` with the session's date as its timestamp (ISO 8601,
``"2023-05-20 02:21"``), the role as speaker and the id ``"<session_id>:<turn index>"``, and the question
asked once, after the whole haystack. The metrics (:func:`question_metrics`) are taken over
the *leaf* hits among the first ``c`` hits, ``c`` in :data:`CUTOFFS`:

* ``turn_recall@c``: share of the question's ``has_answer`` turns among them;
* ``session_recall_any@c`` / ``session_recall_all@c``: 1 when any / every evidence session
  (``answer_session_ids``) holds one of them, else 0 (the paper's recall_any / recall_all);
* ``ndcg@10``: NDCG of the turns, binary relevance (``has_answer``), ranks over all returned hits;
* ``newest_first@10`` (knowledge-update questions with two or more evidence sessions, else undefined): 1
  when the first leaf hit from an evidence session comes from the newest one (the updated statement), 0
  when it comes from an older one, undefined when none is among the first 10 hits;
* ``newest_turn_first@10``: the same over the evidence turns (``has_answer``) only: 1 when the first
  evidence turn among the first 10 hits is from the newest evidence session, so the labelled statements
  themselves, not other turns of their sessions (a question, an assistant's reply), decide.

Abstention questions (id ending ``_abs``: the answer is not in the history) are counted apart: their rows
carry ``"abstention": true`` and category ``"abstention"``, and the pooled figures and intervals leave them
out.

References:
    Wu et al. (ICLR 2025), "LongMemEval: Benchmarking Chat Assistants on Long-Term Interactive Memory":
    Sec. 3 (question types, abstention), Sec. 5 and Table 3 (recall_any / recall_all@k and NDCG@k at
    session and round granularity); the ``longmemeval_s`` file format of its public release.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..types import InvalidInputError, Message
from .data import Conversation, Query, _read_json

__all__ = [
    "ABSTENTION",
    "CUTOFFS",
    "LME_METRICS",
    "REQUIRED_FIELDS",
    "LongMemEvalFormatError",
    "load_longmemeval",
    "longmemeval_lines",
    "parse_longmemeval",
    "question_metrics",
    "select_questions",
]

REQUIRED_FIELDS = (
    "question_id",
    "question_type",
    "question",
    "answer",
    "question_date",
    "haystack_session_ids",
    "haystack_dates",
    "haystack_sessions",
    "answer_session_ids",
)
"""The fields every LongMemEval question must have, in the order they are checked."""

CUTOFFS = (5, 10)
"""The ``k`` of the LongMemEval metrics (a cutoff above the run's ``k`` is not computed)."""

LME_METRICS = (
    "turn_recall@5",
    "turn_recall@10",
    "session_recall_any@5",
    "session_recall_any@10",
    "session_recall_all@5",
    "session_recall_all@10",
    "ndcg@10",
    "newest_first@10",
    "newest_turn_first@10",
)
"""The per-question LongMemEval figures, averaged per method and per question type."""

ABSTENTION = "abstention"
"""The category of abstention questions (ids ending ``_abs``), reported apart from the six types."""

_DATE_RE = re.compile(r"^\s*(\d{4})/(\d{2})/(\d{2})(?:\s*\([A-Za-z]+\))?(?:\s+(\d{1,2}):(\d{2}))?\s*$")


class LongMemEvalFormatError(InvalidInputError):
    """A file is not LongMemEval-shaped.

    Attributes:
        field: the first missing or malformed field.
        question_id: the question it belongs to (``None`` when the question has no id).
    """

    def __init__(self, message: str, field: str, question_id: str | None) -> None:
        super().__init__(message)
        self.field = field
        self.question_id = question_id


def _iso(date: Any, qid: str, field: str) -> str:
    """``"2023/05/20 (Sat) 02:21"`` as ``"2023-05-20 02:21"`` (ISO 8601, readable by every memory)."""
    m = _DATE_RE.match(str(date)) if isinstance(date, str) else None
    if m is None:
        raise LongMemEvalFormatError(
            f"LongMemEval question {qid!r}: {field} holds {date!r}, not a date like "
            "'2023/05/20 (Sat) 02:21'.",
            field,
            qid,
        )
    y, mo, d, h, mi = m.groups()
    return f"{y}-{mo}-{d} {int(h or 0):02d}:{mi or '00'}"


def _check(item: Any, index: int) -> str:
    """The question id of a well-shaped item; :class:`LongMemEvalFormatError` naming the first bad field."""
    if not isinstance(item, Mapping):
        raise LongMemEvalFormatError(
            f"LongMemEval item #{index} is a {type(item).__name__}, not an object; is this a LongMemEval "
            "file?",
            "question_id",
            None,
        )
    qid = str(item["question_id"]) if "question_id" in item else None
    who = f"question {qid!r}" if qid is not None else f"item #{index} (no question_id)"
    for f in REQUIRED_FIELDS:
        if f not in item:
            raise LongMemEvalFormatError(
                f"LongMemEval {who}: missing field {f!r}; is this a LongMemEval file?", f, qid
            )
    assert qid is not None
    lists = ("haystack_session_ids", "haystack_dates", "haystack_sessions", "answer_session_ids")
    for f in lists:
        if not isinstance(item[f], list):
            raise LongMemEvalFormatError(f"LongMemEval {who}: {f!r} must be a list.", f, qid)
    n = len(item["haystack_session_ids"])
    for f in ("haystack_dates", "haystack_sessions"):
        if len(item[f]) != n:
            raise LongMemEvalFormatError(
                f"LongMemEval {who}: {f!r} has {len(item[f])} entries for {n} haystack_session_ids.", f, qid
            )
    for s in item["haystack_sessions"]:
        if not isinstance(s, list) or not all(
            isinstance(t, Mapping) and "role" in t and "content" in t for t in s
        ):
            raise LongMemEvalFormatError(
                f"LongMemEval {who}: 'haystack_sessions' must hold lists of turns with 'role' and 'content'.",
                "haystack_sessions",
                qid,
            )
    if not isinstance(item["question"], str) or not item["question"].strip():
        raise LongMemEvalFormatError(
            f"LongMemEval {who}: 'question' must be a non-empty string.", "question", qid
        )
    return qid


def _question(item: Mapping[str, Any], qid: str) -> Conversation:
    dates = [_iso(d, qid, "haystack_dates") for d in item["haystack_dates"]]
    order = sorted(range(len(dates)), key=lambda i: dates[i])  # stable: equal dates keep file order
    seen: dict[str, int] = {}
    messages: list[Message] = []
    evidence_turns: list[str] = []
    canon: dict[str, str] = {}
    skipped_msgs = 0
    lost_turns = 0
    for i in order:
        sid = str(item["haystack_session_ids"][i])
        seen[sid] = seen.get(sid, 0) + 1
        key = sid if seen[sid] == 1 else f"{sid}#{seen[sid]}"  # a repeated session: ids stay unique
        for j, t in enumerate(item["haystack_sessions"][i]):
            text = str(t.get("content") or "")
            turn = f"{sid}:{j}"
            if not text.strip():
                skipped_msgs += 1
                lost_turns += bool(t.get("has_answer"))
                continue
            mid = f"{key}:{j}"
            canon[mid] = turn
            if t.get("has_answer") and turn not in evidence_turns:
                evidence_turns.append(turn)
            role = str(t.get("role") or "")
            messages.append(
                Message(
                    text=text,
                    role=role if role in ("user", "assistant") else None,
                    speaker=role or None,
                    timestamp=dates[i],
                    id=mid,
                    metadata={"session": key, "session_id": sid, "turn": j},
                )
            )
    haystack = {str(s) for s in item["haystack_session_ids"]}
    last_date = {str(item["haystack_session_ids"][i]): dates[i] for i in order}  # a repeat: its last date
    want = list(dict.fromkeys(str(s) for s in item["answer_session_ids"]))
    present = [s for s in want if s in haystack]
    missing = [s for s in want if s not in haystack]
    abstention = qid.endswith("_abs")
    qtype = str(item["question_type"])
    query = Query(
        question=str(item["question"]),
        answer=str(item["answer"]),
        evidence=[] if abstention else list(evidence_turns),
        category=ABSTENTION if abstention else qtype,
        position=len(messages),
        id=qid,
        meta={
            "question_type": qtype,
            "question_date": _iso(item["question_date"], qid, "question_date"),
            "abstention": abstention,
            "evidence_turns": evidence_turns,
            "evidence_sessions": present,
            "newest_evidence_session": max(present, key=lambda s: last_date[s]) if present else None,
            "missing_evidence_sessions": missing,
        },
    )
    return Conversation(
        id=qid,
        messages=messages,
        queries=[query],
        skipped_evidence=len(missing) + lost_turns,
        meta={
            "source": "longmemeval",
            "question_type": qtype,
            "sessions": len(dates),
            "skipped_queries": 0,
            "skipped_messages": skipped_msgs,
            "repeated_sessions": sum(n - 1 for n in seen.values()),
            "missing_evidence_sessions": len(missing),
            "bulk": True,
            "canonical_turns": canon,
        },
    )


def select_questions(questions: Sequence[Conversation], limit: int | None) -> list[Conversation]:
    """At most ``limit`` questions spread over the question types: the first of each type (types in
    order of first appearance, abstention questions under their own type), then the second, ...; the
    chosen questions keep their file order.

    Args:
        questions: the loaded questions, in file order.
        limit: how many to keep, a positive integer, or ``None`` for all.

    Returns:
        The chosen questions.

    Raises:
        InvalidInputError: ``limit`` is not a positive integer.
    """
    if limit is None:
        return list(questions)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"limit must be a positive integer, got {limit!r}.")
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(questions):
        groups.setdefault(str(c.meta.get("question_type")), []).append(i)
    chosen: list[int] = []
    rank = 0
    while len(chosen) < min(limit, len(questions)):
        for idx in groups.values():
            if rank < len(idx) and len(chosen) < limit:
                chosen.append(idx[rank])
        rank += 1
    return [questions[i] for i in sorted(chosen)]


def load_longmemeval(path: Any, limit: int | None = None) -> list[Conversation]:
    """Load a LongMemEval file (``longmemeval_s`` / ``_m`` / ``_oracle`` format), a conversation per question.

    Messages: every turn of the haystack, sessions sorted by date, ``Message(text=content, role=role,
    speaker=role, timestamp="YYYY-MM-DD HH:MM", id="<session_id>:<turn index>", metadata={"session",
    "session_id", "turn"})``; a session id repeated in one haystack gets ``"<session_id>#2"`` as its
    ``session`` key and id prefix (counted in ``meta["repeated_sessions"]``). Empty turns are left out
    (``meta["skipped_messages"]``). The query is asked after the haystack (``position = len(messages)``);
    its ``evidence`` is the ``has_answer`` turns (none for an abstention question), its ``meta`` holds the
    question type and date, the evidence sessions present in the haystack and those that are not
    (``missing_evidence_sessions``: counted in ``skipped_evidence`` and reported, the question kept).

    Args:
        path: the JSON file (a list of questions, or one question object).
        limit: keep at most this many questions, spread over the types (:func:`select_questions`),
            default all.

    Returns:
        The questions as conversations, in file order.

    Raises:
        InvalidInputError: the file is missing or not JSON. LongMemEvalFormatError: an item misses a field
            or has one of the wrong shape (the message names the first such field and the question id).

    References:
        Wu et al. (ICLR 2025), LongMemEval, the released data format.
    """
    return parse_longmemeval(_read_json(path), limit, source=str(path))


def parse_longmemeval(data: Any, limit: int | None = None, *, source: str = "data") -> list[Conversation]:
    """:func:`load_longmemeval` of data already read (a list of question objects, or one).

    Args:
        data: the parsed JSON. limit: as in :func:`load_longmemeval`. source: how errors name the data.

    Returns:
        The questions as conversations, in order.

    Raises:
        LongMemEvalFormatError: as in :func:`load_longmemeval`.
    """
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, list):
        raise LongMemEvalFormatError(
            f"{source}: expected a JSON list of LongMemEval questions.", "question_id", None
        )
    ids = [_check(item, i) for i, item in enumerate(data)]
    dup = [q for q in dict.fromkeys(ids) if ids.count(q) > 1]
    if dup:
        raise LongMemEvalFormatError(
            f"{source}: question id {dup[0]!r} occurs more than once.", "question_id", dup[0]
        )
    return select_questions([_question(item, qid) for item, qid in zip(data, ids)], limit)


def question_metrics(q: Query, hits: Sequence[Any], k: int, canonical: Mapping[str, str]) -> dict[str, Any]:
    """The LongMemEval figures of one question's hits (see the module docstring).

    Args:
        q: a query from :func:`load_longmemeval`.
        hits: the returned hits, best first (``is_leaf``, ``source_ids``).
        k: the number of hits asked for; a cutoff of :data:`CUTOFFS` above it gives ``None``.
        canonical: message id -> ``"<session_id>:<turn>"`` (``Conversation.meta["canonical_turns"]``).

    Returns:
        ``{metric: float, NaN when undefined, or None above k}`` for :data:`LME_METRICS`, plus
        ``"abstention"`` (bool) and ``"question_type"``.
    """
    turns = set(q.meta.get("evidence_turns") or [])
    sessions = set(q.meta.get("evidence_sessions") or [])
    ranked: list[tuple[int, str]] = []  # (1-based rank among all hits, canonical turn) of the leaf hits
    for r, h in enumerate(hits, 1):
        if h.is_leaf:
            ranked.extend((r, canonical.get(str(s), str(s))) for s in h.source_ids)
    out: dict[str, Any] = {
        "abstention": bool(q.meta.get("abstention")),
        "question_type": q.meta.get("question_type"),
    }
    for c in CUTOFFS:
        got = {t for r, t in ranked if r <= c}
        got_s = {t.rsplit(":", 1)[0] for t in got}
        if c > k:
            vals: tuple[Any, Any, Any] = (None, None, None)
        else:
            vals = (
                len(turns & got) / len(turns) if turns else math.nan,
                float(bool(sessions & got_s)) if sessions else math.nan,
                float(sessions <= got_s) if sessions else math.nan,
            )
        for name, v in zip(("turn_recall", "session_recall_any", "session_recall_all"), vals):
            out[f"{name}@{c}"] = v
    if k < 10:
        out["ndcg@10"] = None
    elif not turns:
        out["ndcg@10"] = math.nan
    else:
        # a hit gains once, at its rank, when it holds an evidence turn not found above it (a leaf
        # holding several turns gains once, so DCG never passes the ideal)
        seen: set[str] = set()
        dcg = 0.0
        for r in sorted({r for r, _ in ranked if r <= 10}):
            new = {t for rr, t in ranked if rr == r and t in turns} - seen
            if new:
                dcg += 1.0 / math.log2(r + 1)
                seen |= new
        ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(turns), 10) + 1))
        out["ndcg@10"] = dcg / ideal
    newest = q.meta.get("newest_evidence_session")
    for name, among in (("newest_first@10", None), ("newest_turn_first@10", turns)):
        out[name] = None if k < 10 else math.nan
        if k >= 10 and out["question_type"] == "knowledge-update" and len(sessions) >= 2:
            first_s = next(
                (
                    s
                    for r, t in ranked
                    if r <= 10 and (among is None or t in among) and (s := t.rsplit(":", 1)[0]) in sessions
                ),
                None,
            )
            if first_s is not None:
                out[name] = float(first_s == newest)
    return out


def _fmt(v: Any) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _type_order(cats: Iterable[str]) -> list[str]:
    cs = [c for c in dict.fromkeys(cats) if c != ABSTENTION]
    return sorted(cs) + ([ABSTENTION] if ABSTENTION in set(cats) else [])


def longmemeval_lines(doc: Mapping[str, Any], label: str) -> list[str]:
    """Markdown tables of one LongMemEval dataset of a results document.

    A pooled table (abstention questions left out) with every metric of :data:`LME_METRICS` per method,
    then per metric of ``turn_recall@10``, ``session_recall_all@10`` and ``turn_recall@5`` a table by
    question type (abstention questions in their own column), then the data facts (evidence sessions not
    in their haystack, repeated sessions, empty turns left out).

    Args:
        doc: the results document of :func:`~shared_core.eval.runner.run_eval`.
        label: the dataset label.

    Returns:
        Markdown lines (empty when no method has LongMemEval figures for ``label``).
    """
    methods = doc.get("methods", {})
    rows = [(n, m["by_dataset"][label]) for n, m in methods.items() if label in m.get("by_dataset", {})]
    if not rows or all(ds["overall"].get("turn_recall@10") is None for _, ds in rows):
        return []
    n_q = rows[0][1]["overall"].get("n_queries", 0)
    cats = _type_order(c for _, ds in rows for c in ds.get("by_category", {}))
    n_abs = (rows[0][1].get("by_category", {}).get(ABSTENTION) or {}).get("n_queries", 0)
    lines = [
        f"### LongMemEval retrieval ({label}: {n_q} questions pooled, {n_abs} abstention questions apart)",
        "",
        "| method | " + " | ".join(LME_METRICS) + " |",
        "|---" + "|---:" * len(LME_METRICS) + "|",
    ]
    for name, ds in rows:
        lines.append(f"| {name} | " + " | ".join(_fmt(ds["overall"].get(m)) for m in LME_METRICS) + " |")
    lines.append("")
    for metric in ("turn_recall@10", "session_recall_all@10", "turn_recall@5"):
        counts = {c: (rows[0][1]["by_category"].get(c) or {}).get("n_queries", 0) for c in cats}
        lines += [
            f"{metric} by question type ({label}):",
            "",
            "| method | " + " | ".join(f"{c} ({counts[c]})" for c in cats) + " |",
            "|---" + "|---:" * len(cats) + "|",
        ]
        for name, ds in rows:
            bc = ds.get("by_category", {})
            lines.append(
                f"| {name} | " + " | ".join(_fmt((bc.get(c) or {}).get(metric)) for c in cats) + " |"
            )
        lines.append("")
    data = doc.get("data", {}).get(label, {})
    convs = data.get("conversations", {})
    missing = {
        q: c["missing_evidence_sessions"] for q, c in convs.items() if c.get("missing_evidence_sessions")
    }
    facts = [
        f"evidence sessions not in their haystack: {sum(missing.values())}"
        + (
            f" (questions {', '.join(sorted(missing))}; recall taken over the evidence present)"
            if missing
            else ""
        ),
        "repeated sessions given their own key: "
        f"{sum(int(c.get('repeated_sessions', 0)) for c in convs.values())}",
        f"empty turns left out: {sum(int(c.get('skipped_messages', 0)) for c in convs.values())}",
    ]
    lines += ["LongMemEval data: " + "; ".join(facts) + ".", ""]
    return lines
