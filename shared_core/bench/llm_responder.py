"""A deterministic stand-in LLM for ``hiermem bench --llm-cost``: a valid, plausible answer to every
prompt of the four memories, without a model.

:class:`ScriptedResponder` is a ``default_chat`` of
:class:`~shared_core.bench.openai_server.ScriptedOpenAIServer`: it reads the request's system message to
know which prompt it answers (:data:`PROMPT_KINDS`) and answers in the format that prompt asks for, so
that every memory takes the path it would take with a real model (no parse failures, no fallbacks).
Summaries are the first words of each summarised part, cut to the length the prompt asks for; decisions
follow the embedder's cosine (given one) or the word overlap of the texts involved:

* SegTreeMem pointwise: ``MERGE`` when the utterance is similar enough to the candidate (cosine >=
  ``segment_cosine``, else at least ``merge_overlap`` of its content words in it), else ``CONTINUE``;
  batch: the first (most specific) candidate passing that test, else ``SPLIT``; annotations: a summary of
  the children within the prompt's word budget.
* MemTree aggregation (and the rebuild after a deletion): the new entry and the existing summary within
  ``summary_words``.
* HAT aggregation: the children within 150 words (the prompt's "about 150 words"); the memory agent walks
  down, at each node to the child whose preview shares most content words with the question (the first
  on a tie), and answers ``sufficient`` at a leaf; the BFS/DFS sufficiency question: ``YES`` when the node
  holds at least half of the question's content words.
* xMemory boundaries: a new episode when the new message's timestamp differs from the last one of the
  episode (a new session) or when it is not similar enough to the episode (cosine below
  ``episode_cosine``, else under ``merge_overlap`` of its content words in it); episode records: a title
  of the first 12 words and the conversation cut to 200 words, with the first timestamp in ISO form;
  facts: up to 3 sentences of at least 5 words from the episodes; theme summaries: the statements within
  30 words; the reader: the first 8 words of the memory sentence sharing most
  content words with the question, with log-probabilities ``-2 (1 - c)`` per answer word, ``c`` the
  share of the question's content words found in the memories.
* The supersession judge (every memory with an LLM): the ids of the earlier statements the LLM-free rule
  (:mod:`shared_core.memories.updates`) says the new one updates.

Completion lengths are therefore set by this stand-in, not by a model: a real model's summaries may be
shorter or longer. Prompt lengths are the memories' own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ..memories.updates import statement_of, updates
from ..prompts import hat as HP
from ..prompts import memtree as MP
from ..prompts import segtree as SP
from ..prompts import updates as UP
from ..prompts import xmemory as XP
from ..types import parse_timestamp
from .openai_server import Reply

__all__ = ["PROMPT_KINDS", "ScriptedResponder", "content_words", "prompt_kind"]

PROMPT_KINDS: dict[str, str] = {
    SP.POINTWISE_SYSTEM: "segtree.pointwise",
    SP.BATCH_SYSTEM: "segtree.batch",
    SP.ANNOTATION_SYSTEM: "segtree.annotation",
    MP.AGGREGATE_SYSTEM: "memtree.aggregate",
    HP.AGGREGATE_SYSTEM: "hat.aggregate",
    HP.AGENT_SYSTEM: "hat.agent",
    HP.SUFFICIENT_SYSTEM: "hat.sufficient",
    XP.BOUNDARY_SYSTEM: "xmemory.boundary",
    XP.EPISODE_SYSTEM: "xmemory.episode",
    XP.SEMANTIC_SYSTEM: "xmemory.facts",
    XP.THEME_SYSTEM: "xmemory.theme",
    XP.READER_SYSTEM: "xmemory.reader",
    UP.JUDGE_SYSTEM: "memory.supersession",
}
"""System message -> prompt kind (``"<memory>.<prompt>"``) of every prompt the memories send."""

_STOP_WORDS = (
    "the and for are but not you your with this that have has had was were will would can could what "
    "when where which who whom how why from they them their there then than its it's i'm about just like "
    "really yeah yes too also been being into out our ours she her his him did does doing got get all any "
    "some one very much more most"
)
_STOP = frozenset(_STOP_WORDS.split())
_WORD = re.compile(r"[a-z0-9']+")
_BLOCK = re.compile(r"<<<\s?(.*?)\s?>>>", re.DOTALL)
_STAMP = re.compile(r"^\[([^\]]+)\]", re.MULTILINE)
_SPEAKER = re.compile(r"\b([A-Z][A-Za-z]+):")
_NUMBERED = re.compile(r"^\[\d+\]\s*", re.MULTILINE)


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` of at least 3 characters that are not common function words."""
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in _STOP}


def prompt_kind(system: str) -> str:
    """The prompt kind of a system message (:data:`PROMPT_KINDS`), ``"other"`` when unknown."""
    return PROMPT_KINDS.get(system, "other")


def _share(part: str, whole: str) -> float:
    """Share of ``part``'s content words found in ``whole`` (0 when ``part`` has none); speakers' names
    (a capitalised word right before a colon, as in ``"Caroline: ..."``) are left out of both."""
    names = {n.lower() for n in _SPEAKER.findall(part + "\n" + whole)}
    words = content_words(part) - names
    return len(words & (content_words(whole) - names)) / len(words) if words else 0.0


def _cut(text: str, words: int) -> str:
    toks = text.split()
    return " ".join(toks[: max(1, words)]) if toks else "(empty)"


def _digest(block: str, words: int) -> str:
    """A summary of numbered child texts in at most ``words`` words: the first ``max(2, words // n)``
    words of each of the ``n`` children, in order, keeping the newest ``words`` of them when longer."""
    parts = [p.split() for p in _NUMBERED.split(block) if p.strip()] or [block.split()]
    per = max(2, words // len(parts))
    toks = [w for p in parts for w in p[:per]]
    return " ".join(toks[-max(1, words) :]) if toks else "(empty)"


def _messages(block: str) -> tuple[list[str], list[str]]:
    """Timestamps and texts of rendered ``[timestamp] speaker: text`` lines."""
    stamps = _STAMP.findall(block)
    texts = [_STAMP.sub("", line).strip() for line in block.splitlines() if line.strip()]
    return stamps, texts


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


class ScriptedResponder:
    """Answers each chat request in its prompt's format (see the module); a callable for ``default_chat``.

    Args:
        merge_overlap: share of a new text's content words that must occur in a candidate for the
            "same segment / same episode" decisions when no ``embedder`` is given, default 0.1.
        summary_words: length cap of a MemTree summary in words, default 100 (its prompt gives none).
        embedder: an embedder (``embed(texts) -> (n, dim)`` unit rows); when given, the "same segment"
            decisions are cosine >= ``segment_cosine`` and the "same episode" decision is cosine >=
            ``episode_cosine`` between the new text and the candidate (episode) instead of word overlap.
        segment_cosine: default 0.25, SegTreeMem's own cosine threshold, with which its cosine model
            builds trees of the paper's shape (App. C.1 Table 5) on LoCoMo.
        episode_cosine: default 0.4, xMemory's ``drift_threshold``.

    Attributes:
        counts: requests answered per prompt kind.
    """

    def __init__(
        self,
        merge_overlap: float = 0.1,
        summary_words: int = 100,
        *,
        embedder: Any = None,
        segment_cosine: float = 0.25,
        episode_cosine: float = 0.4,
    ) -> None:
        self.merge_overlap = float(merge_overlap)
        self.summary_words = int(summary_words)
        self.embedder = embedder
        self.segment_cosine = float(segment_cosine)
        self.episode_cosine = float(episode_cosine)
        self.counts: dict[str, int] = {}
        self._vectors: dict[str, Any] = {}

    def _cosine(self, a: str, b: str) -> float:
        missing = [t for t in dict.fromkeys((a, b)) if t not in self._vectors]
        if missing:
            for t, v in zip(missing, self.embedder.embed(missing)):
                self._vectors[t] = v
        return float(self._vectors[a] @ self._vectors[b])

    def _same(self, new: str, candidate: str, cosine: float) -> bool:
        if self.embedder is not None:
            return self._cosine(new.strip(), candidate.strip()) >= cosine
        return _share(new, candidate) >= self.merge_overlap

    def __call__(self, req: dict[str, Any]) -> str | Reply:
        msgs = [m for m in req.get("messages", []) if isinstance(m, dict)]
        system = str(msgs[0].get("content", "")) if msgs and msgs[0].get("role") == "system" else ""
        user = str(msgs[-1].get("content", "")) if msgs else ""
        kind = prompt_kind(system)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        blocks = _BLOCK.findall(user)
        answer = getattr(self, "_" + kind.replace(".", "_"), None)
        if answer is None or not blocks:
            return "OK"
        return answer(user, blocks)

    # ------------------------------------------------------------------ SegTreeMem
    def _segtree_pointwise(self, user: str, blocks: Sequence[str]) -> str:
        candidate, utterance = blocks[0], blocks[-1]
        return "MERGE" if self._same(utterance, candidate, self.segment_cosine) else "CONTINUE"

    def _segtree_batch(self, user: str, blocks: Sequence[str]) -> str:
        utterance = blocks[-1]
        for label, text in re.findall(r"(MERGE_\d+):\n<<<\n(.*?)\n>>>", user, flags=re.DOTALL):
            if self._same(utterance, text, self.segment_cosine):
                return label
        return "SPLIT"

    def _segtree_annotation(self, user: str, blocks: Sequence[str]) -> str:
        m = re.search(r"At most (\d+) words", user)
        return _digest(blocks[0], int(m.group(1)) if m else 120)

    # ------------------------------------------------------------------ MemTree
    def _memtree_aggregate(self, user: str, blocks: Sequence[str]) -> str:
        return _digest("\n".join(f"[{i}] {b}" for i, b in enumerate(blocks, 1)), self.summary_words)

    # ------------------------------------------------------------------ HAT
    def _hat_aggregate(self, user: str, blocks: Sequence[str]) -> str:
        return _digest(blocks[0], 150)

    def _hat_agent(self, user: str, blocks: Sequence[str]) -> str:
        query = blocks[0]
        possible = user.rsplit("Possible here:", 1)[-1]
        kids = re.findall(r"^\[(\d+)\] <<< (.*?) >>>$", user, flags=re.MULTILINE)
        if "down" not in possible or not kids:
            return "sufficient"
        best = max(kids, key=lambda k: (_share(query, k[1]), -int(k[0])))
        return f"down {best[0]}"

    def _hat_sufficient(self, user: str, blocks: Sequence[str]) -> str:
        return "YES" if _share(blocks[0], blocks[1] if len(blocks) > 1 else "") >= 0.5 else "NO"

    # ------------------------------------------------------------------ xMemory
    def _xmemory_boundary(self, user: str, blocks: Sequence[str]) -> str:
        history, new = blocks[0], blocks[-1]
        h_stamps, _ = _messages(history)
        n_stamps, _ = _messages(new)
        if h_stamps and n_stamps and h_stamps[-1] != n_stamps[0]:
            return json.dumps({"boundary": True, "reason": "a new session begins"})
        if not self._same(new, history, self.episode_cosine):
            return json.dumps({"boundary": True, "reason": "the topic changes"})
        return json.dumps({"boundary": False, "reason": "the same topic continues"})

    def _xmemory_episode(self, user: str, blocks: Sequence[str]) -> str:
        stamps, texts = _messages(blocks[0])
        body = " ".join(texts)
        record: dict[str, Any] = {"title": _cut(body, 12), "content": _cut(body, 200)}
        when = parse_timestamp(stamps[0]) if stamps else None
        if when is not None:
            record["timestamp"] = when.isoformat(timespec="seconds")
        return json.dumps(record)

    def _xmemory_facts(self, user: str, blocks: Sequence[str]) -> str:
        facts = [s for s in _sentences(blocks[0]) if len(s.split()) >= 5][:3]
        return json.dumps({"facts": facts})

    def _xmemory_theme(self, user: str, blocks: Sequence[str]) -> str:
        return _digest(blocks[0], 30)

    def _xmemory_reader(self, user: str, blocks: Sequence[str]) -> Reply:
        question = user.rsplit("Question:", 1)[-1]
        memory = " ".join(blocks)
        sentences = _sentences(memory) or ["(none)"]
        best = max(sentences, key=lambda s: _share(question, s))
        text = _cut(best, 8)
        nll = 2.0 * (1.0 - _share(question, memory))
        return Reply(text=text, logprobs=[-nll] * len(text.split()))

    # ------------------------------------------------------------------ every memory
    def _memory_supersession(self, user: str, blocks: Sequence[str]) -> str:
        ids = [int(i) for i in re.findall(r"^\[(\d+)\]\s*$", user, flags=re.MULTILINE)]
        new = statement_of(blocks[-1])
        return json.dumps([i for i, b in zip(ids, blocks) if updates(statement_of(b), new)])
