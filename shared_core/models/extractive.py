"""ExtractiveSummarizer: the LLM-free aggregate function used when a memory is built with ``llm=None``."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import accumulate

import numpy as np
from bm25s.stopwords import STOPWORDS_EN_PLUS

from ..scores import inner_products, normalize_rows, unit_row_norm
from ..types import InvalidInputError, UnknownPolicyError, Usage
from .base import Embedder, call_embedder, unit_embeddings

__all__ = [
    "SENTENCE_VECTORS",
    "ExtractiveSummarizer",
    "SummaryPool",
    "has_content",
    "join_sentences",
    "sentence_spans",
    "split_sentences",
]

#: "<speaker>: " at the start of a rendered message (``Message.render``)
_SPEAKER_PREFIX = re.compile(r"^[^\W\d][\w .'-]{0,40}?:\s+")
_WORD = re.compile(r"\b(?=\w*[^\W\d_])\w{3,}\b")  # three or more word characters, a letter among them
#: words that carry no content of their own: English stop words (bm25s's longer list) and the greetings,
#: thanks and assents of chat turns
_FILLERS = (
    "hello hey hiya thanks thank cheers yes yeah yep yup okay sure please bye goodbye great cool nice "
    "awesome wow haha lol right well good morning afternoon evening night welcome sorry absolutely "
    "definitely exactly indeed alright fine glad happy help"
)
_NOT_CONTENT = frozenset(STOPWORDS_EN_PLUS) | frozenset(re.findall(r"\w+", _FILLERS))
_SENT_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")

#: The values of ``ExtractiveSummarizer(sentence_vectors=...)``.
SENTENCE_VECTORS = ("pooled", "embedded")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the sentences of ``text`` (see :func:`split_sentences`).

    Returns:
        One ``(start, end)`` pair per sentence, in order; ``text[start:end]`` is the stripped sentence.
    """
    out: list[tuple[int, int]] = []
    pos = 0
    for m in [*_SENT_RE.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        seg = text[pos:end]
        s = seg.strip()
        if s:
            a = pos + seg.index(s)
            out.append((a, a + len(s)))
        if m is not None:
            pos = m.end()
    return out


def has_content(sentence: str) -> bool:
    """Whether a sentence holds a content word: a word of three or more characters, a letter among them,
    that is neither an English stop word nor a greeting, thanks or assent, after a leading
    ``"<speaker>: "``. ``"User: Hello."``, ``"Yes, please."`` and a numbered-list stub ``"3."`` hold
    none; a summary skips them when it can (see :class:`SummaryPool`)."""
    body = _SPEAKER_PREFIX.sub("", sentence, count=1)
    return any(w.lower() not in _NOT_CONTENT for w in _WORD.findall(body))


def split_sentences(text: str) -> list[str]:
    """Split text into sentences at ``.``/``!``/``?`` followed by a capital or digit, and at newlines."""
    return [text[a:b] for a, b in sentence_spans(text)]


_STARTS_SENTENCE = re.compile(r"[\"'(\[]?[A-Z0-9]")


def join_sentences(sentences: Sequence[str]) -> str:
    """Sentences joined into one text that :func:`split_sentences` splits back into them: by a space
    where that splits (after ``.``/``!``/``?`` and before a capital or digit), else by a newline (after a
    list item without a full stop, before a lower-case ``"user: ..."``), so a summary of summaries draws
    on the sentences the summaries were made of (and their vectors) instead of new run-on ones."""
    out: list[str] = []
    for s in sentences:
        if out:
            out.append(" " if out[-1][-1:] in ".!?" and _STARTS_SENTENCE.match(s) else "\n")
        out.append(s)
    return "".join(out)


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _at_word_bounds(text: str, i: int, part: str) -> bool:
    """Whether ``part``, found at ``text[i:]``, is not the middle of a longer word there."""
    j = i + len(part)
    if part and _word_char(part[0]) and i > 0 and _word_char(text[i - 1]):
        return False
    return not (part and _word_char(part[-1]) and j < len(text) and _word_char(text[j]))


def holds_words(text: str, part: str) -> bool:
    """Whether ``part`` occurs in ``text`` as a run of whole words (not inside a longer word)."""
    i = text.find(part)
    while i >= 0:
        if _at_word_bounds(text, i, part):
            return True
        i = text.find(part, i + 1)
    return False


class ExtractiveSummarizer:
    """Picks the children's most central sentences, in their original order, within a length budget.

    Every child text is split into sentences; each sentence is embedded (cached by text, so a sentence
    is embedded once in the memory's life); the centroid is the mean of the children's mean sentence
    vectors (each child weighs the same); sentences are taken greedily by cosine to the centroid,
    skipping exact repeats, while the summary stays within ``max_chars``; the chosen sentences are
    returned in their original order, joined by :func:`join_sentences` (so that they split back into
    themselves). One embedding call per ``summarize`` at most.
    Cosines are exactly rounded (:func:`~shared_core.search.index.inner_products`), the same on every CPU. A
    caller whose children change only at the right end keeps a :meth:`pool` per node instead and pays
    for the changed child only (SegTreeMem's frontier does).

    Sentence vectors come from one of two places (``sentence_vectors``). ``"pooled"``: a
    memory that embeds a message with an embedder offering ``embed_spans`` (the embedded
    :class:`~shared_core.models.local.LocalEmbedder`) gets, from the same forward pass, each sentence's
    vector as the mean of the message's token states over the sentence's characters ("late chunking"),
    and hands them to :meth:`seed`; so a sentence costs no embedding of its own. ``"embedded"``
    (default): every sentence is embedded alone (one more forward pass over the message's tokens).
    Either way a sentence that is the whole message gets the message's vector, and sentences not
    seeded are embedded alone.

    The cache holds the words of every sentence it has seen, so a memory empties it in ``clear()``
    (:meth:`clear`) and, after a deletion, takes out the sentences no live text holds any more
    (:meth:`forget`).

    Args:
        embedder: the memory's embedder (usually shared with it).
        max_chars: length budget of a summary in characters, default 600. A first sentence longer than
            the budget is cut at a word boundary and ends with ``"…"``.
        cache_size: sentences whose vectors are kept, default 100,000 (about 150 MB at 384-d).
        sentence_vectors: ``"embedded"`` (default) or ``"pooled"``, see above.

    Raises:
        InvalidInputError: ``max_chars`` < 20.
        UnknownPolicyError: ``sentence_vectors`` is not one of :data:`SENTENCE_VECTORS`.

    References:
        Centroid-based extractive summarisation (Radev et al., 2004, "Centroid-based summarization of
        multiple documents"); used as the aggregate function S of SegTreeMem (Algorithm 1, line 21),
        MemTree's aggregation (Sec. 3.1) and HAT's (Sec. 3.1) when no LLM is configured. Pooled sentence
        vectors: Günther et al. (2024), "Late Chunking: Contextual Chunk Embeddings Using Long-Context
        Embedding Models", Sec. 3.
    """

    def __init__(
        self,
        embedder: Embedder,
        max_chars: int = 600,
        cache_size: int = 100_000,
        sentence_vectors: str = "embedded",
    ) -> None:
        if max_chars < 20:
            raise InvalidInputError("max_chars must be at least 20 characters.")
        if sentence_vectors not in SENTENCE_VECTORS:
            raise UnknownPolicyError(
                f"sentence_vectors must be one of {SENTENCE_VECTORS}, got {sentence_vectors!r}."
            )
        self.embedder = embedder
        self.max_chars = int(max_chars)
        self.cache_size = int(cache_size)
        self.sentence_vectors = sentence_vectors
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _vectors(self, sentences: list[str]) -> tuple[dict[str, np.ndarray], Usage]:
        usage = Usage()
        with self._lock:  # read the cached vectors now: a concurrent forget() may drop them meanwhile
            out = {s: self._cache[s] for s in dict.fromkeys(sentences) if s in self._cache}
        missing = [s for s in dict.fromkeys(sentences) if s not in out]
        got: dict[str, np.ndarray] = {}
        if missing:
            t0 = time.perf_counter()
            vecs = unit_embeddings(
                call_embedder(self.embedder, self.embedder.embed, missing), len(missing), None
            )
            usage = Usage(embed_calls=1, embedded_texts=len(missing), seconds=time.perf_counter() - t0)
            got = dict(zip(missing, vecs))
        with self._lock:
            self._remember(got)
            for s in sentences:
                if s not in got and s in self._cache:
                    self._cache.move_to_end(s)
            self._evict()
        out.update(got)
        return out, usage

    def _remember(self, vectors: dict[str, np.ndarray]) -> None:
        """Cache sentence vectors (unit rows); the caller holds the lock and evicts afterwards."""
        for s, v in vectors.items():
            self._cache.setdefault(s, v)

    def _evict(self) -> None:
        """Drop the least recently used vectors beyond ``cache_size`` (the caller holds the lock)."""
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def forget(self, texts: Iterable[str]) -> int:
        """Drop from the sentence cache what the sentences of ``texts`` left in it.

        A memory calls this after a deletion with the sentences of the deleted messages (xMemory: and
        of the texts the deletion rewrote) that none of its live texts still holds (see
        :meth:`HierarchicalMemory.delete <shared_core.memories.base.HierarchicalMemory.delete>`), so that no
        forgotten words stay in the process. Dropped are the vectors of every sentence of ``texts``,
        of every cached sentence that holds one of them as a run of whole words (a sentence that ran
        on across texts joined in a summary, such as ``"hello there Bob arrives at 9."`` made of an
        unpunctuated ``"hello there"`` and the next text; a rendering such as ``"ann: <sentence>"``),
        and of the shortened form (ending in ``"…"``) a summary makes of a sentence longer than
        ``max_chars``. A sentence that is still needed is only embedded again when next used.

        Args:
            texts: texts or sentences, e.g. those of deleted messages.

        Returns:
            The number of cached sentences dropped.

        Cost: one pass over the cached sentences per sentence of ``texts`` (a substring search of
        their concatenation), under the cache's lock.
        """
        targets = {s for t in texts if isinstance(t, str) and t for s in split_sentences(t)}
        if not targets:
            return 0
        targets |= {self._fit([s]) for s in targets if len(s) > self.max_chars}
        with self._lock:
            keys = list(self._cache)
            if not keys:
                return 0
            # a cached sentence has no newline (split_sentences splits there): join on it and search
            hay = "\n".join(keys)
            starts = list(accumulate((len(k) + 1 for k in keys[:-1]), initial=0))
            hit: set[int] = set()
            for s in targets:
                i = hay.find(s)
                while i >= 0:
                    if not _at_word_bounds(hay, i, s):  # inside a longer word: look further on
                        i = hay.find(s, i + 1)
                        continue
                    j = bisect_right(starts, i) - 1
                    hit.add(j)
                    i = hay.find(s, starts[j] + len(keys[j]) + 1)  # the next cached sentence on
            for j in hit:
                del self._cache[keys[j]]
        return len(hit)

    def clear(self) -> None:
        """Empty the sentence cache (a memory's ``clear()`` calls this: nothing of its texts stays)."""
        with self._lock:
            self._cache.clear()

    def spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]] | None:
        """Sentence spans of ``texts`` for an embedder's ``embed_spans`` (see :func:`sentence_spans`), or
        ``None`` when sentences are embedded alone (``sentence_vectors="embedded"``)."""
        if self.sentence_vectors != "pooled":
            return None
        return [sentence_spans(t) if isinstance(t, str) else [] for t in texts]

    def warm(self, texts: Sequence[str]) -> Usage:
        """Give the sentences of ``texts`` not yet cached a vector, in one embedding call (e.g. a batch of
        new messages): pooled from the texts' own forward pass when ``sentence_vectors="pooled"`` and the
        embedder offers ``embed_spans``, else embedded alone.

        Returns:
            The usage of that call (zero when every sentence was cached).
        """
        texts = [t for t in texts if t and t.strip()]
        with self._lock:
            texts = [t for t in dict.fromkeys(texts) if any(s not in self._cache for s in split_sentences(t))]
        if not texts:
            return Usage()
        embed_spans = getattr(self.embedder, "embed_spans", None)
        if self.sentence_vectors != "pooled" or not callable(embed_spans):
            return self._vectors([s for t in texts for s in split_sentences(t)])[1]
        # a text with a sentence cached has been pooled already (by the memory's embedding of it, which
        # seeds): only its sentences past the model's input length are missing, embedded alone below
        with self._lock:
            fresh = [t for t in texts if not any(s in self._cache for s in split_sentences(t))]
        usage = Usage()
        if fresh:
            t0 = time.perf_counter()
            vecs, parts = call_embedder(self.embedder, embed_spans, fresh, self.spans(fresh))
            usage = Usage(embed_calls=1, embedded_texts=len(fresh), seconds=time.perf_counter() - t0)
            self.seed(fresh, unit_embeddings(vecs, len(fresh), None), parts)
        return usage + self._vectors([s for t in texts for s in split_sentences(t)])[1]

    def seed(
        self,
        texts: Sequence[str],
        vectors: np.ndarray,
        sentence_vectors: Sequence[np.ndarray | None] | None = None,
    ) -> None:
        """Cache sentence vectors of texts embedded elsewhere by the same embedder (e.g. a memory's
        messages), so that their sentences are not embedded again.

        Args:
            texts: the texts.
            vectors: their vectors, ``float (len(texts), dim)``: a text that is exactly one sentence
                gives that sentence its vector.
            sentence_vectors: optional, per text ``None`` or ``float (len(sentence_spans(text)), dim)``
                (an embedder's ``embed_spans`` with :meth:`spans`); rows of zeros (sentences cut off by
                the model's input length) are skipped. Ignored when ``sentence_vectors="embedded"``.

        Raises:
            InvalidInputError: a row count that does not match the text's sentences.
        """
        known: dict[str, np.ndarray] = {}
        pooled = sentence_vectors if self.sentence_vectors == "pooled" else None
        for j, (t, v) in enumerate(zip(texts, vectors)):
            if not t or not isinstance(t, str):
                continue
            sents = split_sentences(t)
            if sents == [t]:
                known.setdefault(t, v)
                continue
            rows = pooled[j] if pooled is not None and j < len(pooled) else None
            if rows is None:
                continue
            rows = np.asarray(rows, dtype=np.float32)
            if rows.ndim != 2 or rows.shape[0] != len(sents):
                raise InvalidInputError(
                    f"seed: {len(sents)} sentences but sentence vectors of shape {rows.shape}."
                )
            for s, r in zip(sents, rows):
                if np.any(r):
                    known.setdefault(s, r)
        if not known:
            return
        vecs = normalize_rows(np.asarray(list(known.values()), dtype=np.float32))
        with self._lock:
            self._remember(dict(zip(known, vecs)))
            self._evict()

    def compose(self, texts: Sequence[str]) -> tuple[np.ndarray, Usage]:
        """Vectors of texts made of sentences, from the sentences' cached vectors.

        The vector of a text is the normalised mean of the unit vectors of its sentences (one vector
        per sentence occurrence); sentences never seen before (e.g. a sentence cut to fit
        ``max_chars``) are embedded, all in one call, and cached. An extractive summary's sentences are
        its children's, so composing its vector embeds nothing.

        Args:
            texts: non-empty texts.

        Returns:
            ``(vectors float32 (n, dim) with unit rows, usage)``.

        Raises:
            InvalidInputError: an empty text.
        """
        parts = [split_sentences(t) if t and t.strip() else [] for t in texts]
        if any(not p for p in parts):
            raise InvalidInputError("compose needs non-empty texts.")
        vec, usage = self._vectors([s for p in parts for s in p])
        out = np.stack([np.mean([vec[s] for s in p], axis=0) for p in parts]).astype(np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms, usage

    def summarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """Summarise ordered child texts.

        Args:
            texts: the children's texts in order (at least one non-empty).
            **fields: ignored (accepted for interface compatibility with LLM summarisers).

        Returns:
            ``(summary, usage)``; the summary has at most ``max_chars`` characters.

        Raises:
            InvalidInputError: no non-empty text.
        """
        pool = self.pool()
        for t in texts:
            pool.append(t)
        return pool.summary()

    def pool(self) -> SummaryPool:
        """An empty :class:`SummaryPool`: this summariser's state for one node whose children change at
        the right end (appended, or the last one replaced), so that re-summarising costs the sentences
        that changed instead of every sentence of every child."""
        return SummaryPool(self)

    def _fit(self, sentences: list[str]) -> str:
        text = join_sentences(sentences)
        if len(text) <= self.max_chars:
            return text
        cut = text[: self.max_chars - 1]
        if " " in cut[self.max_chars // 2 :]:
            cut = cut[: cut.rfind(" ")]
        return cut.rstrip() + "…"

    async def asummarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """Async :meth:`summarize` (in a worker thread)."""
        return await asyncio.to_thread(self.summarize, texts, **fields)


#: Sentences ranked first by a partial sort; the rest are sorted only when the budget is not yet full.
_TOP = 64


def _scores(M: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Cosine of every row of ``M`` (unit rows, float32) with ``c``, exactly rounded to float32
    (:func:`~shared_core.search.index.inner_products`): a row's score depends on that row and ``c`` alone,
    never on the other rows, their number or the CPU, so a pool built incrementally and one built from
    scratch rank alike, on every machine."""
    return inner_products(M, c, row_norm=unit_row_norm(M.shape[1]))


class _Child:
    """One child of a :class:`SummaryPool`: its key and text, its sentences, their mean vector once
    known, and the pool's counters before it (so that it can be taken out again)."""

    __slots__ = ("key", "mark", "mean", "sentences", "text")

    def __init__(self, key: object, text: str, sentences: list[str], mark: tuple[int, int, int]) -> None:
        self.key = key
        self.text = text
        self.sentences = sentences
        self.mean: np.ndarray | None = None
        self.mark = mark  # (distinct sentences, their characters + 1 each, sentence occurrences) before it


class SummaryPool:
    """The state of :meth:`ExtractiveSummarizer.summarize` for one node, kept as its children change.

    Children are appended, or the last one is taken out (:meth:`pop`) and another appended in its
    place; :meth:`summary` then equals ``summarizer.summarize(texts)`` over the same texts, whatever
    the appends and pops that led there (``summarize`` itself fills a new pool). Kept: the distinct
    sentences in order of first occurrence with their unit vectors as rows of one matrix, each
    child's mean sentence vector, and the running sum of the children's means taken child by child in
    order (as ``numpy.mean`` over the children adds them, so the centroid is the same to the bit). A
    change costs the changed child's sentences; :meth:`summary` scores every distinct sentence with one
    vectorised, exactly rounded product (O(sentences x dim), no Python work per sentence) and sorts
    only the best 64 unless the budget still has room after them. Vectors are fetched only when a
    summary goes over the budget, as ``summarize`` does.

    Args:
        summarizer: the :class:`ExtractiveSummarizer` whose budget, sentence cache and embedder it uses.

    References:
        As :class:`ExtractiveSummarizer`; used by SegTreeMem's annotation update (Algorithm 1, lines
        19-22), where only the rightmost children of frontier nodes change.
    """

    def __init__(self, summarizer: ExtractiveSummarizer) -> None:
        self.summarizer = summarizer
        self.children: list[_Child] = []
        self._full: list[_Child] = []  # the children with sentences, in order
        self._index: dict[str, int] = {}  # distinct sentence -> row, in order of first occurrence
        self._sentences: list[str] = []
        self._content: list[bool] = []  # has_content of each distinct sentence
        self._lens = np.zeros(0, dtype=np.int64)
        self._M: np.ndarray | None = None  # rows of the distinct sentences' unit vectors
        self._rows = 0  # rows of _M filled: a prefix of _sentences
        self._chars = 0  # sum of len(s) + 1 over the distinct sentences
        self._flat = 0  # sentence occurrences
        self._acc: np.ndarray | None = None  # sum of the means of _full[:_k], added in order
        self._k = 0
        self._meaned = 0  # _full[:_meaned] have their mean vector

    def __len__(self) -> int:
        return len(self.children)

    @property
    def texts(self) -> list[str]:
        """The children's texts, in order."""
        return [c.text for c in self.children]

    @property
    def keys(self) -> list[object]:
        """The children's keys (as given to :meth:`append`), in order."""
        return [c.key for c in self.children]

    def append(self, text: str, key: object = None) -> None:
        """Add a child text at the right end, with an optional ``key`` for the caller (e.g. a node id).
        An empty or blank text is a child without sentences, which ``summarize`` skips."""
        sents = split_sentences(text) if isinstance(text, str) and text.strip() else []
        child = _Child(key, text, sents, (len(self._sentences), self._chars, self._flat))
        self.children.append(child)
        if not sents:
            return
        for s in sents:
            if s not in self._index:
                self._index[s] = len(self._sentences)
                self._sentences.append(s)
                self._content.append(has_content(s))
                self._chars += len(s) + 1
        self._flat += len(sents)
        self._full.append(child)

    def pop(self) -> str:
        """Take out the last child; returns its text.

        Raises:
            InvalidInputError: the pool is empty.
        """
        if not self.children:
            raise InvalidInputError("pop from an empty summary pool.")
        child = self.children.pop()
        if not child.sentences:
            return child.text
        self._full.pop()
        n_distinct, self._chars, self._flat = child.mark
        for s in self._sentences[n_distinct:]:
            del self._index[s]
        del self._sentences[n_distinct:]
        del self._content[n_distinct:]
        self._rows = min(self._rows, n_distinct)
        if self._k > len(self._full):  # its mean is in the running sum, which cannot be undone
            self._acc, self._k = None, 0
        self._meaned = min(self._meaned, len(self._full))
        return child.text

    def _need_vectors(self, usage: Usage) -> None:
        """Give every child its mean vector and every distinct sentence its row (one embedding call for
        the sentences missing from the sentence cache)."""
        todo = [c for c in self._full[self._meaned :] if c.mean is None]
        if not todo and self._rows == len(self._sentences):
            self._meaned = len(self._full)
            return
        need = [s for c in todo for s in c.sentences] + self._sentences[self._rows :]
        vec, u = self.summarizer._vectors(need)
        usage += u
        for c in todo:
            c.mean = np.mean([vec[s] for s in c.sentences], axis=0)
        self._meaned = len(self._full)
        n = len(self._sentences)
        if self._rows < n:
            new = np.stack([vec[s] for s in self._sentences[self._rows : n]])
            if self._M is None or len(self._M) < n:
                grown = np.empty(
                    (max(n, 2 * (0 if self._M is None else len(self._M))), new.shape[1]), np.float32
                )
                if self._M is not None:
                    grown[: self._rows] = self._M[: self._rows]
                self._M = grown
            self._M[self._rows : n] = new
            lens = np.fromiter((len(s) for s in self._sentences[self._rows : n]), np.int64, n - self._rows)
            self._lens = np.concatenate([self._lens[: self._rows], lens])
            self._rows = n

    def _centroid(self) -> np.ndarray:
        """The mean of the children's means; the running sum keeps all of them but the last."""
        while self._k < len(self._full) - 1:
            m = self._full[self._k].mean
            assert m is not None
            self._acc = m.copy() if self._acc is None else self._acc + m
            self._k += 1
        total = self._acc
        if self._k < len(self._full):
            last = self._full[-1].mean
            assert last is not None
            total = last.copy() if total is None else total + last
        assert total is not None
        return total / len(self._full)

    def summary(self) -> tuple[str, Usage]:
        """The summary of the current children (``ExtractiveSummarizer.summarize`` of :attr:`texts`).

        Returns:
            ``(summary, usage)``: usage counts the embedding call for sentences not cached, if any.

        Raises:
            InvalidInputError: no child has a sentence.
        """
        if not self._full:
            raise InvalidInputError("Nothing to summarise: all child texts are empty.")
        sm = self.summarizer
        # sentences without a content word (greetings, "Yes.", "3.") stand only when no sentence has one
        only = any(self._content)
        if self._flat == 1 or self._chars - 1 <= sm.max_chars:
            return sm._fit([s for s, c in zip(self._sentences, self._content) if c or not only]), Usage()
        usage = Usage()
        self._need_vectors(usage)
        assert self._M is not None
        n = len(self._sentences)
        neg = -_scores(self._M[:n], self._centroid())
        lens = self._lens[:n]
        ok = np.array(self._content, dtype=bool) if only else np.ones(n, dtype=bool)
        neg = np.where(ok, neg, np.inf)  # ranked last; never taken (see take)
        shortest = int(lens[ok].min())
        chosen: list[int] = []
        used = 0

        def take(ranked: np.ndarray, start: int) -> bool:
            """Greedy over ``ranked[start:]``; False once nothing more can fit."""
            nonlocal used
            for i in ranked[start:].tolist():
                if not ok[i]:
                    continue
                cost = int(lens[i]) + (1 if chosen else 0)
                if used + cost <= sm.max_chars:
                    chosen.append(i)
                    used += cost
                    if used + 1 + shortest > sm.max_chars:
                        return False
            return True

        if n > _TOP:
            kth = np.partition(neg, _TOP - 1)[_TOP - 1]
            cand = np.flatnonzero(neg <= kth)  # the best _TOP and every tie with the last of them
            top = cand[np.argsort(neg[cand], kind="stable")]
            first = int(top[0])
            if take(top, 0):  # room left: on down the full order (which starts with ``top``)
                take(np.argsort(neg, kind="stable"), len(top))
        else:
            full = np.argsort(neg, kind="stable")
            first = int(full[0])
            take(full, 0)
        if not chosen:
            return sm._fit([self._sentences[first]]), usage
        chosen.sort()
        return join_sentences([self._sentences[i] for i in chosen]), usage
