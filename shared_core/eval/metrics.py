"""Retrieval metrics: evidence recall, span recall, answer-token recall, token counts, grouped means.

One tokenizer for every method: :func:`count_tokens` counts regex word and punctuation tokens, so
returned-token budgets compare across memories without any model-specific vocabulary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..models.extractive import holds_words, split_sentences
from ..search.lexical import tokenize
from ..types import InvalidInputError, count_tokens, parse_timestamp

__all__ = [
    "RENDERS",
    "date_text",
    "render_returned",
    "answer_token_recall",
    "content_words",
    "contained_recall",
    "count_tokens",
    "evidence_recall",
    "mean_by",
    "message_sentences",
    "rouge_l_recall",
    "span_recall",
]


def _flatten_ids(retrieved: Sequence[Sequence[str]] | Sequence[str]) -> set[str]:
    out: set[str] = set()
    for item in retrieved:
        if isinstance(item, str):
            out.add(item)
        else:
            out.update(str(x) for x in item)
    return out


def evidence_recall(
    retrieved_source_ids: Sequence[Sequence[str]] | Sequence[str], evidence: Sequence[str]
) -> float:
    """Share of the distinct evidence ids that the retrieved items cover.

    Args:
        retrieved_source_ids: the source ids of the retrieved items — either one flat list of ids, or one
            list per retrieved item (e.g. each hit's ``source_ids``; a summary node covers all its leaves).
        evidence: the gold evidence ids (duplicates count once).

    Returns:
        A float in [0, 1].

    Raises:
        InvalidInputError: ``evidence`` is empty.

    References:
        LoCoMo (Maharana et al., 2024) retrieval recall@k over dialogue ids; RealMem (Bian et al., 2026)
        session-level evidence.
    """
    ev = set(map(str, evidence))
    if not ev:
        raise InvalidInputError(
            "evidence is empty; evidence recall is defined only for queries with evidence."
        )
    got = _flatten_ids(retrieved_source_ids)
    return len(ev & got) / len(ev)


def span_recall(
    spans: Iterable[tuple[int, int]], evidence: Sequence[str], positions: Mapping[str, Sequence[int]]
) -> float:
    """Share of distinct evidence ids with at least one message inside a retrieved node's span.

    Coverage by position, whether or not the node's text shows the message (a summary over a span is
    credited with every message in it); :func:`contained_recall` credits only what the texts show.

    Args:
        spans: ``(first, last)`` insertion indices (inclusive) of the retrieved nodes (``Hit.span``).
        evidence: gold evidence ids.
        positions: for each id, the insertion indices of the messages carrying it (a RealMem session id
            maps to all its turns).

    Returns:
        A float in [0, 1]; evidence ids absent from ``positions`` count as not covered.

    Raises:
        InvalidInputError: ``evidence`` is empty.

    References:
        SegTreeMem (interval nodes); DESIGN "span recall".
    """
    ev = list(dict.fromkeys(map(str, evidence)))
    if not ev:
        raise InvalidInputError("evidence is empty; span recall is defined only for queries with evidence.")
    sp = [(int(a), int(b)) for a, b in spans]
    if not sp:
        return 0.0
    lo = np.array([a for a, _ in sp])
    hi = np.array([b for _, b in sp])
    covered = 0
    for e in ev:
        pos = np.asarray(positions.get(e, ()), dtype=np.int64)
        if pos.size and bool(((pos[:, None] >= lo[None, :]) & (pos[:, None] <= hi[None, :])).any()):
            covered += 1
    return covered / len(ev)


def contained_recall(
    hits: Iterable[tuple[str, bool, Sequence[str]]],
    evidence: Sequence[str],
    sentences: Mapping[str, Sequence[str]],
) -> float:
    """Share of distinct evidence ids whose message a returned text shows.

    A leaf hit shows the messages it stores (its ``source_ids``). Any other hit (a summary, a fact, an
    episode) shows an evidence id only when the id is among its ``source_ids`` *and* one of the
    sentences of a message carrying that id occurs in the hit's text as a run of whole words
    (:func:`~shared_core.models.extractive.holds_words`): a summary covering a span is credited with the
    messages it quotes, not with every message below it. An abstractive (LLM) summary quotes nothing
    verbatim and so is credited with nothing; a sentence cut off by a summary's length limit does not
    count.

    Args:
        hits: per returned hit ``(text, is_leaf, source_ids)``.
        evidence: gold evidence ids (duplicates count once).
        sentences: per evidence id the sentences of the messages carrying it (e.g.
            :func:`~shared_core.models.extractive.split_sentences` of each ``Message.render()``; a
            RealMem session id maps to the sentences of all its turns). An id missing here is shown
            only by a leaf.

    Returns:
        A float in [0, 1].

    Raises:
        InvalidInputError: ``evidence`` is empty.

    Examples:
        >>> hit = ("A: x. B y.", False, ["d1", "d2"])  # a summary over d1 and d2
        >>> contained_recall([hit], ["d1", "d2"], {"d1": ["B y."], "d2": ["C z."]})
        0.5
    """
    ev = list(dict.fromkeys(map(str, evidence)))
    if not ev:
        raise InvalidInputError(
            "evidence is empty; contained recall is defined only for queries with evidence."
        )
    want = set(ev)
    shown: set[str] = set()
    for text, is_leaf, ids in hits:
        for sid in map(str, ids):
            if sid not in want or sid in shown:
                continue
            if is_leaf or any(s and holds_words(text, s) for s in sentences.get(sid, ())):
                shown.add(sid)
    return len(shown) / len(ev)


def message_sentences(messages: Iterable[Any]) -> dict[str, list[str]]:
    """Per source id, the sentences of the rendered messages carrying it (for :func:`contained_recall`).

    Args:
        messages: :class:`~shared_core.types.Message` objects; those without an ``id`` are skipped.

    Returns:
        ``{id: [sentence, ...]}``, sentences from
        :func:`~shared_core.models.extractive.split_sentences` of ``Message.render()``, in message order.
    """
    out: dict[str, list[str]] = {}
    for m in messages:
        if m.id is not None:
            out.setdefault(str(m.id), []).extend(split_sentences(m.render()))
    return out


RENDERS = ("plain", "dated")
"""How ``hiermem eval`` renders the returned texts it scores (answer-token recall, returned tokens, the
LLM's context), for every method alike: ``"plain"`` (the stored texts as returned) or ``"dated"``
(each message leaf prefixed with its date, ``"[8 May 2023] speaker: text"``, the form of xMemory's
fact texts; other hits unchanged)."""


def date_text(timestamp: str | None) -> str | None:
    """A timestamp as the date xMemory writes in its facts: ``"8 May 2023"``.

    Args:
        timestamp: any string :func:`~shared_core.types.parse_timestamp` reads, else kept stripped.

    Returns:
        ``"<day> <Month> <year>"``, the stripped string when it cannot be read, ``None`` when empty.
    """
    dt = parse_timestamp(timestamp)
    if dt is not None:
        return f"{dt.day} {dt.strftime('%B %Y')}"
    return timestamp.strip() if isinstance(timestamp, str) and timestamp.strip() else None


def render_returned(text: str, is_leaf: bool, timestamp: str | None, render: str = "plain") -> str:
    """The returned text of one hit as scored under a render (:data:`RENDERS`).

    Args:
        text: the hit's text. is_leaf: whether it is a message leaf. timestamp: the message's timestamp.
        render: ``"plain"`` (default, ``text`` unchanged) or ``"dated"`` (a leaf with a readable date
            becomes ``"[<date_text>] <text>"``; any other hit is unchanged).

    Returns:
        The text.

    Raises:
        InvalidInputError: an unknown render.
    """
    if render not in RENDERS:
        raise InvalidInputError(f"render must be one of {', '.join(RENDERS)}, got {render!r}.")
    if render == "dated" and is_leaf:
        d = date_text(timestamp)
        if d is not None:
            return f"[{d}] {text}"
    return text


def content_words(text: str) -> set[str]:
    """The content words of a text: lower-cased word tokens without stop words, unstemmed.

    Tokens are runs of two or more word characters (bm25s' pattern ``(?u)\\b\\w\\w+\\b``); stop words are
    bm25s' English list (33 words: "a", "an", "and", "are", "as", "at", "be", "but", "by", "for",
    "if", "in", "into", "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their",
    "then", "there", "these", "they", "this", "to", "was", "will", "with") — the same tokens the lexical
    index sees before stemming.

    Args:
        text: any string.

    Returns:
        The set of content words.
    """
    if not isinstance(text, str):
        text = str(text)
    return set(tokenize([text], stem=False, stopwords="en")[0]) if text.strip() else set()


def answer_token_recall(answer: str, retrieved_text: str | Sequence[str]) -> float:
    """Share of the answer's content words present anywhere in the retrieved text.

    Args:
        answer: the gold answer.
        retrieved_text: the retrieved text, or a list of texts (joined with newlines).

    Returns:
        A float in [0, 1]; 1.0 when the answer has no content words (nothing to find).

    References:
        hiermem DESIGN, Evaluation ("answer-token recall"): an LLM-free proxy of whether the retrieved
        context can answer the question, over LoCoMo (Maharana et al., 2024) style short answers.
    """
    words = content_words(answer)
    if not words:
        return 1.0
    if not isinstance(retrieved_text, str):
        retrieved_text = "\n".join(retrieved_text)
    return len(words & content_words(retrieved_text)) / len(words)


def mean_by(values: Sequence[float], keys: Sequence[Hashable]) -> dict[Any, float]:
    """Mean of ``values`` per key, ignoring NaN values.

    Args:
        values: numbers, one per item.
        keys: group keys, one per item (e.g. query categories).

    Returns:
        ``{key: mean}`` in order of first appearance; a group whose values are all NaN maps to NaN.

    Raises:
        InvalidInputError: the lengths differ.
    """
    if len(values) != len(keys):
        raise InvalidInputError(
            f"mean_by got {len(values)} values and {len(keys)} keys; pass one key per value."
        )
    groups: dict[Any, list[float]] = {}
    for v, k in zip(values, keys):
        groups.setdefault(k, []).append(float(v))
    out: dict[Any, float] = {}
    for k, vs in groups.items():
        ok = [v for v in vs if not math.isnan(v)]
        out[k] = float(np.mean(ok)) if ok else math.nan
    return out


_WORD_RE = re.compile(r"\w+")


def rouge_l_recall(reference: str, prediction: str) -> float:
    """ROUGE-L recall: length of the longest common token subsequence over the reference's length.

    Tokens are lower-cased word runs (``\\w+``), stop words kept.

    Args:
        reference: the gold answer.
        prediction: the generated answer.

    Returns:
        A float in [0, 1]; NaN when the reference has no tokens.

    References:
        Lin (2004), "ROUGE: A Package for Automatic Evaluation of Summaries", ROUGE-L (LCS recall);
        MemTree paper Sec. 4 (ROUGE-L recall of the generated answer against short gold answers).
    """
    ref = _WORD_RE.findall(str(reference).lower())
    if not ref:
        return math.nan
    pred = _WORD_RE.findall(str(prediction).lower())
    if not pred:
        return 0.0
    prev = [0] * (len(pred) + 1)
    for r in ref:
        cur = [0] * (len(pred) + 1)
        for j, p in enumerate(pred, 1):
            cur[j] = prev[j - 1] + 1 if r == p else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1] / len(ref)
