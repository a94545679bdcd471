"""The LLM-free rules of xMemory: query terms, timestamps, message rendering, fact extraction and theme
summaries (the stand-ins for the Appendix C prompts when no LLM is configured).

References:
    xMemory Sec. 3.2-3.3 and Appendix C.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from ...models.extractive import ExtractiveSummarizer, split_sentences
from ...search.lexical import tokenize
from ...types import InvalidInputError, Message, parse_timestamp

__all__ = [
    "central_facts",
    "extract_facts_rule",
    "forget_fact_sentences",
    "has_fact_sentence",
    "parse_timestamp",
    "query_terms",
    "render_messages",
]


def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Question words and auxiliaries beyond the lexical index's stop words, so that a question's terms are
# the words that name what is asked about.
_QUESTION_STOP = _wordset(
    """
    about after again all also am any been before being both can could did do does doing done from had
    has have having he her here hers him his how its just me more most my nor now off once only other
    our ours out over own same she should so some than them theirs those through too under until up
    very we were what when where which while who whom why would you your yours yourself don ll re ve
    """
)
_QUESTION_STOP_STEMMED = frozenset(t for ts in tokenize(sorted(_QUESTION_STOP), stopwords=None) for t in ts)


def query_terms(text: str, stem: bool = True) -> set[str]:
    """Terms of a query for the Stage II proxy: the lexical index's tokens without question words.

    Tokens are those of :func:`shared_core.search.lexical.tokenize` (lower-cased runs of two or more word
    characters, bm25s' English stop words removed, Snowball-stemmed when ``stem``), minus question words
    and auxiliaries (*what*, *when*, *did*, ...), so that a question's terms name what is asked about.

    Args:
        text: any string.
        stem: apply the Snowball English stemmer (PyStemmer), default ``True``.

    Returns:
        A set of tokens (stemmed when ``stem``).

    References:
        xMemory Sec. 3.3 Stage II (uncertainty; the proxy used without log-probabilities).
    """
    stop = _QUESTION_STOP_STEMMED if stem else _QUESTION_STOP
    return set(tokenize([text], stem=stem)[0]) - stop


def _date_text(ts: str | None) -> str | None:
    dt = parse_timestamp(ts)
    if dt is not None:
        return f"{dt.day} {dt.strftime('%B %Y')}"
    return ts.strip() if ts and ts.strip() else None


def _who(m: Message) -> str | None:
    return m.speaker or m.role


def render_messages(messages: Sequence[Message]) -> str:
    """Render messages one per line as ``[timestamp] speaker: text``.

    The timestamp is written when it differs from the previous line's; the speaker (else the role) when
    known. This is the content of an LLM-free episode and the conversation shown to the LLM prompts.

    Args:
        messages: messages in order.

    Returns:
        The rendered text (lines joined by ``\\n``).

    References:
        xMemory App. C (the boundary and episode prompts read timestamped messages).
    """
    lines = []
    last_ts = None
    for m in messages:
        prefix = ""
        if m.timestamp and m.timestamp != last_ts:
            prefix = f"[{m.timestamp}] "
            last_ts = m.timestamp
        who = _who(m)
        lines.append(f"{prefix}{who}: {m.text}" if who else f"{prefix}{m.text}")
    return "\n".join(lines)


# =========================================================================== LLM-free fact rule
_FP_WORDS = _wordset(
    """
    i i'm i’m i've i’ve i'd i’d i'll i’ll my me mine myself we we're we’re we've our ours us
    """
)
_MONTHS_DAYS = _wordset(
    """
    january february march april may june july august september october november december monday
    tuesday wednesday thursday friday saturday sunday yesterday tomorrow week weekend month year
    """
)
_GREETINGS = _wordset(
    """
    hi hey hello thanks thank bye goodbye wow haha lol yeah yes ok okay sure congrats cool great aw
    """
)
_TOKEN_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’\-]*")


def _fact_score(sentence: str) -> int:
    words = _TOKEN_WORD.findall(sentence)
    if len(words) < 4 or sentence.rstrip().endswith("?"):
        return 0
    low = [w.lower() for w in words]
    first_person = any(w in _FP_WORDS for w in low)
    entity = any(w[0].isupper() and w.lower() not in _FP_WORDS for w in words[1:])
    number = any(any(ch.isdigit() for ch in w) for w in words) or any(w in _MONTHS_DAYS for w in low)
    score = int(first_person) + int(entity) + int(number)
    if low[0] in _GREETINGS and len(words) < 6 and not number:
        return 0
    return score


#: texts whose :func:`has_fact_sentence` answer is kept (least recently used dropped beyond it)
FACT_CACHE_SIZE = 65_536
_fact_cache: OrderedDict[str, bool] = OrderedDict()
_fact_lock = threading.Lock()


def has_fact_sentence(text: str) -> bool:
    """Whether the LLM-free fact rule accepts at least one sentence of ``text``.

    The test :func:`extract_facts_rule` applies to each sentence (at least 4 words, not a question, a
    first-person statement, named entity, number or time word, not a short greeting), before its
    ``max_facts`` cap; ``False`` for an empty text.

    Answers are cached by text for the process (the :data:`FACT_CACHE_SIZE` most recently asked);
    a memory takes the texts of the messages it deletes or clears out again
    (:func:`forget_fact_sentences`), so the cache keeps no forgotten text.

    Args:
        text: a message text (without speaker or date).

    Returns:
        ``True`` when some sentence qualifies.

    References:
        xMemory App. C "semantic generation" (the rule is its LLM-free stand-in).
    """
    key = str(text)
    with _fact_lock:
        got = _fact_cache.get(key)
        if got is not None:
            _fact_cache.move_to_end(key)
            return got
    got = any(_fact_score(sent) > 0 for sent in split_sentences(key))
    with _fact_lock:
        _fact_cache[key] = got
        while len(_fact_cache) > FACT_CACHE_SIZE:
            _fact_cache.popitem(last=False)
    return got


def forget_fact_sentences(texts: Iterable[str] | None = None) -> None:
    """Drop the cached :func:`has_fact_sentence` answers of ``texts`` (every answer when ``None``).

    Args:
        texts: texts as they were asked about (e.g. the texts of deleted messages), or ``None``.
    """
    with _fact_lock:
        if texts is None:
            _fact_cache.clear()
            return
        for t in texts:
            _fact_cache.pop(t, None)


def extract_facts_rule(messages: Sequence[Message], max_facts: int = 8) -> list[tuple[str, str, int]]:
    """LLM-free semantic extraction: informative statements of an episode's messages.

    Every message is split into sentences. A sentence qualifies when it has at least 4 words, is not a
    question (does not end with ``?``) and carries at least one of: a first-person statement (*I*, *my*,
    *we*, ...), a named entity (a capitalised word after the first word, other than *I*), a number or a
    time word (month, weekday, *yesterday*, *week*, ...). Short greetings (fewer than 6 words starting
    with *hi*, *thanks*, *wow*, ...) without a number are skipped. Sentences are ranked by how many of
    the three signals they carry (ties: earlier first); the best ``max_facts`` are kept in their
    original order and exact repeats dropped.

    Args:
        messages: the episode's messages in order.
        max_facts: at most this many facts, default 8.

    Returns:
        ``(text, key, source)`` triples: ``text`` is the stored fact, ``"[date] speaker: sentence"``
        (date from the message timestamp, speaker when known); ``key`` is ``"speaker: sentence"`` without
        the date, which is what gets embedded (so themes group facts by content, not by day); ``source``
        is the position in ``messages`` of the message the sentence comes from.

    References:
        xMemory Sec. 3.2 and App. C "semantic generation" (specific, searchable, self-contained facts);
        this rule is the LLM-free stand-in for that prompt.
    """
    cands: list[tuple[int, int, str, str, int]] = []
    seen: set[str] = set()
    pos = 0
    for j, m in enumerate(messages):
        date = _date_text(m.timestamp)
        who = _who(m)
        for sent in split_sentences(m.text):
            score = _fact_score(sent)
            if score == 0:
                continue
            key = f"{who}: {sent}" if who else sent
            if key in seen:
                continue
            seen.add(key)
            text = f"[{date}] {key}" if date else key
            cands.append((score, pos, text, key, j))
            pos += 1
    best = sorted(cands, key=lambda c: (-c[0], c[1]))[: max(0, int(max_facts))]
    return [(t, k, j) for _, _, t, k, j in sorted(best, key=lambda c: c[1])]


class _KnownVectors:
    """An embedder that returns given vectors for known sentences (no model call)."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


def central_facts(texts: Sequence[str], vectors: np.ndarray, max_chars: int = 600) -> str:
    """LLM-free theme summary: the theme's most central facts, in their order, within a length budget.

    :class:`~shared_core.models.extractive.ExtractiveSummarizer` run over the facts with their existing
    vectors (every sentence of a fact gets the fact's vector; no embedding call): sentences are ranked
    by cosine to the centroid of the normalised fact vectors and taken greedily while the summary stays
    within ``max_chars``; the chosen sentences keep their original order. When even the most central
    one is longer than the budget it is cut at a word boundary and ends with "…".

    Args:
        texts: the facts (non-empty strings) in order.
        vectors: their embeddings, float ``(len(texts), d)``.
        max_chars: length budget in characters (>= 20), default 600.

    Returns:
        The summary text.

    Raises:
        InvalidInputError: no fact, a vector count that differs from the facts, or ``max_chars < 20``.

    References:
        xMemory Sec. 3.2 (theme summaries; App. C theme prompt when an LLM is configured); centroid-based
        extractive summarisation (Radev et al., 2004).
    """
    V = np.asarray(vectors, dtype=np.float32)
    if not texts or V.ndim != 2 or V.shape[0] != len(texts):
        raise InvalidInputError("A theme summary needs at least one fact and one vector per fact.")
    table: dict[str, np.ndarray] = {}
    for text, v in zip(texts, V):
        for sentence in split_sentences(text):
            table.setdefault(sentence, v)
    text, _ = ExtractiveSummarizer(_KnownVectors(table), max_chars=max_chars).summarize(list(texts))
    return text
