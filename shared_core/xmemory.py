"""xMemory: messages -> episodes -> semantics -> themes, guided split/merge, two-stage adaptive retrieval.

The memory keeps a four-level hierarchy (paper Sec. 3.2) in the shared node store::

    root ("" structural, level 4)
     +- theme (level 3): a group of related semantics, text = theme summary
     |   +- semantic (level 2): one persistent fact, linked to every episode it was distilled from
     |       +- episode (level 1): a contiguous block of messages, text = episode record
     |           +- message (level 0, leaf)
     +- episode (level 1) that is still open, or that yielded no semantic ("unfiled")

A semantic may come from several episodes (deduplication merges repeated facts): all its episodes are
listed in its node data (``episodes``), and each episode lists its semantics (``semantics``). In the tree,
an episode hangs under its *primary* semantic (the first one it is linked to). Episodes are built online:
the open episode grows under the root and stays retrievable (its text is the rendering of its messages)
until the boundary detector closes it; closing it writes its record, distils and deduplicates semantics,
attaches them to themes, splits overcrowded themes and merges tiny ones by the sparsity-semantics
objective f(P) (Eq. 1-3), and updates the kNN graphs. :meth:`XMemory.flush` closes the open episode on
demand.

Retrieval (Sec. 3.3): ``representative`` is Stage I, greedy representative selection (Eq. 4) on themes
and then on the semantics of the chosen themes; ``adaptive`` adds Stage II, which probes linked episodes
by priority and keeps one (and, for LLM-written records, its raw messages) only when it lowers the
reader's uncertainty, stopping early when episodes stop helping; ``collapsed`` is flat top-k over every
node.

References:
    Hu et al., "Beyond RAG for Agent Memory: Retrieval by Decoupling and Aggregation" (xMemory):
    Sec. 3.2 (hierarchy, Eq. 1-3, attach/split/merge, kNN graphs), Sec. 3.3 (Eq. 4, Stage II),
    Sec. 5.3 (reassignment ratio), Appendix B (theme size cap 12), Appendix C (prompts).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .base import HierarchicalMemory, count_tokens
from .index import normalize_rows
from .models.base import LLM, Embedder, Summarizer
from .models.extractive import split_sentences
from .models.parsing import complete_parsed, parse_json_object
from .prompts import xmemory as P
from .types import (
    AddReport,
    Hit,
    InvalidInputError,
    LLMRequiredError,
    Message,
    MessageLike,
    UnknownPolicyError,
    Usage,
    as_messages,
    check_finite,
)

__all__ = [
    "LEVEL_NAMES",
    "KNNGraph",
    "XMemory",
    "bell_regularizer",
    "candidate_splits",
    "central_facts",
    "extract_facts_rule",
    "greedy_representatives",
    "mean_nll",
    "nearest_theme_similarities",
    "parse_timestamp",
    "partition_objective",
    "query_terms",
    "render_messages",
    "sem_score",
    "sparsity_score",
    "theme_cohesion",
]

#: Node ``level`` -> name reported in hits (``metadata["level"]``).
LEVEL_NAMES: dict[int, str] = {0: "message", 1: "episode", 2: "semantic", 3: "theme", 4: "root"}
MESSAGE, EPISODE, SEMANTIC, THEME, ROOT = 0, 1, 2, 3, 4
BOUNDARY_MODES = ("auto", "llm", "rule")

_RETRIEVE_PARAMS = frozenset(
    {
        "alpha",
        "coverage",
        "semantic_pool",
        "theme_budget",
        "semantic_budget",
        "episode_budget",
        "patience",
        "min_gain",
        "expand_messages",
        "support_weight",
    }
)


# =========================================================================== small helpers
_WORD_RE = re.compile(r"[a-z0-9]+")


def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# English stop words (the Lucene list bm25s uses) plus question words and auxiliaries, so that a
# question's content words are the words that name what is asked about.
_EXTRA_STOP = _wordset(
    """
    a about after again all also am an and any are as at be been before being both but by can could did
    do does doing done for from had has have having he her here hers him his how i if in into is it its
    just me more most my no nor not now of off on once only or other our ours out over own same she
    should so some such than that the their theirs them then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your
    yours yourself s t don ll m re ve d
    """
)


def _stop_words() -> frozenset[str]:
    try:
        from bm25s.stopwords import STOPWORDS_EN

        return frozenset(STOPWORDS_EN) | _EXTRA_STOP
    except ImportError:  # pragma: no cover - bm25s is a core dependency
        return _EXTRA_STOP


STOP_WORDS = _stop_words()
_STEMMER: Any = None


def _stem(words: list[str]) -> list[str]:
    global _STEMMER
    if _STEMMER is None:
        import Stemmer

        _STEMMER = Stemmer.Stemmer("english")
    return list(_STEMMER.stemWords(words))


def query_terms(text: str, stem: bool = True) -> set[str]:
    """Terms of a query for the Stage II proxy: lower-cased alphanumeric words without stop words.

    The stop list is bm25s' English list plus question words and auxiliaries (*what*, *when*, *did*,
    ...), so that a question's terms name what is asked about; words are Snowball-stemmed. (The
    evaluation metric :func:`shared_core.eval.metrics.content_words` is a separate, unstemmed rule.)

    Args:
        text: any string.
        stem: apply the Snowball English stemmer (PyStemmer), default ``True``.

    Returns:
        A set of words (stemmed when ``stem``).

    References:
        xMemory Sec. 3.3 Stage II (uncertainty; the proxy used without log-probabilities).
    """
    words = [w for w in _WORD_RE.findall(text.lower()) if w not in STOP_WORDS]
    return set(_stem(words)) if stem and words else set(words)


def mean_nll(logprobs: Sequence[float]) -> float:
    """Mean negative log-likelihood of answer tokens: ``-(1/T) * sum_t log p(y_t)``.

    Args:
        logprobs: natural-log probabilities of the T answer tokens (T >= 1), as
            :attr:`shared_core.types.Completion.logprobs` gives them.

    Returns:
        The mean NLL in nats per token (float >= 0 for valid log-probabilities).

    Raises:
        InvalidInputError: no log-probabilities, or a NaN / infinite value.

    References:
        xMemory Sec. 3.3, Stage II (the reader's predictive uncertainty).
    """
    lp = np.asarray(list(logprobs), dtype=np.float64)
    if lp.size == 0:
        raise InvalidInputError("mean_nll needs at least one log-probability.")
    if not np.isfinite(lp).all():
        raise InvalidInputError("log-probabilities must be finite numbers.")
    return float(-lp.mean())


_TS_FORMATS = (
    "%I:%M %p on %d %B, %Y",
    "%I:%M %p on %d %b, %Y",
    "%H:%M on %d %B, %Y",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
    "%Y/%m/%d %H:%M:%S",
    "%Y/%m/%d %H:%M",
    "%Y/%m/%d",
    "%d %B %Y",
    "%d %B, %Y",
    "%B %d, %Y",
    "%d %b %Y",
    "%b %d, %Y",
)


def parse_timestamp(ts: str | None) -> datetime | None:
    """Parse a message timestamp, or return ``None`` when it cannot be read.

    Accepted: ISO 8601 (``2024-03-14T15:00:00``, ``...Z``, offsets; aware times are converted to naive
    UTC), LoCoMo's ``"1:56 pm on 8 May, 2023"``, ``"2025-12-27 (Saturday)"`` (a trailing parenthesis is
    ignored) and common ``Y-m-d`` / ``d Month Y`` / ``Month d, Y`` forms.

    Args:
        ts: the timestamp string (``Message.timestamp``) or ``None``.

    Returns:
        A naive :class:`datetime` or ``None``.
    """
    if not ts or not isinstance(ts, str):
        return None
    s = re.sub(r"\s*\([^)]*\)\s*$", "", ts.strip())
    if not s:
        return None
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        dt = None
        for fmt in _TS_FORMATS:
            try:
                dt = datetime.strptime(s, fmt)
                break
            except ValueError:
                continue
    if dt is not None and dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt


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


def extract_facts_rule(messages: Sequence[Message], max_facts: int = 8) -> list[tuple[str, str]]:
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
        ``(text, key)`` pairs: ``text`` is the stored fact, ``"[date] speaker: sentence"`` (date from the
        message timestamp, speaker when known), ``key`` is ``"speaker: sentence"`` without the date,
        which is what gets embedded (so themes group facts by content, not by day).

    References:
        xMemory Sec. 3.2 and App. C "semantic generation" (specific, searchable, self-contained facts);
        this rule is the LLM-free stand-in for that prompt.
    """
    cands: list[tuple[int, int, str, str]] = []
    seen: set[str] = set()
    pos = 0
    for m in messages:
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
            cands.append((score, pos, text, key))
            pos += 1
    best = sorted(cands, key=lambda c: (-c[0], c[1]))[: max(0, int(max_facts))]
    return [(t, k) for _, _, t, k in sorted(best, key=lambda c: c[1])]


# =========================================================================== objective (Eq. 1-3)
def sparsity_score(sizes: Sequence[int] | np.ndarray) -> float:
    """SparsityScore of a partition: ``N^2 / (K * sum_k n_k^2)`` (Eq. 2).

    It is ``(N / K) / E[n_cluster]`` with ``E[n_cluster] = (1/N) sum_k n_k^2``, the expected size of the
    theme that a uniformly drawn semantic falls in. By Cauchy-Schwarz it lies in ``(0, 1]`` and equals
    1 exactly when all themes have the same size.

    Args:
        sizes: theme sizes ``n_k`` (K >= 1 positive integers).

    Returns:
        The score (float).

    Raises:
        InvalidInputError: no theme or a size < 1.

    References:
        xMemory Sec. 3.2, Eq. (2); Appendix B.2.
    """
    n = np.asarray(sizes, dtype=np.float64).ravel()
    if n.size == 0 or (n < 1).any():
        raise InvalidInputError("sparsity_score needs at least one theme and sizes >= 1.")
    N = n.sum()
    return float(N * N / (n.size * float((n * n).sum())))


def nearest_theme_similarities(centroids: np.ndarray) -> np.ndarray:
    """``s_k = max_{j != k} cos(mu_k, mu_j)``: each theme's nearest-neighbour similarity (Eq. 3).

    Args:
        centroids: theme centroids, float array ``(K, d)`` with K >= 2 (any norm; zero rows give 0).

    Returns:
        float64 array ``(K,)``.

    Raises:
        InvalidInputError: fewer than two themes.

    References:
        xMemory Sec. 3.2, definition of ``s_k`` below Eq. (3).
    """
    C = np.asarray(centroids, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] < 2:
        raise InvalidInputError("nearest-neighbour similarities need at least two theme centroids.")
    norms = np.linalg.norm(C, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    C = C / norms
    S = C @ C.T
    np.fill_diagonal(S, -np.inf)
    return S.max(axis=1)


def bell_regularizer(s: Sequence[float] | np.ndarray, eps: float = 1e-2) -> np.ndarray:
    """Bell-shaped regulariser ``g(s_k) = exp(-(s_k - m)^2 / (2 sigma^2))`` (Eq. 3).

    ``m = median(s)`` and ``sigma = median(|s - m|) + eps`` (median absolute deviation, a robust scale):
    themes whose nearest neighbour is much closer than usual (redundant) or much farther (islands) are
    penalised.

    Args:
        s: nearest-neighbour similarities ``s_k`` (K >= 1 finite values).
        eps: the ``epsilon`` added to the MAD, default 0.01 (the paper leaves its value open).

    Returns:
        float64 array ``(K,)`` with values in ``(0, 1]``.

    Raises:
        InvalidInputError: empty input, non-finite values or ``eps <= 0``.

    References:
        xMemory Sec. 3.2, Eq. (3).
    """
    x = np.asarray(s, dtype=np.float64).ravel()
    if x.size == 0 or not np.isfinite(x).all():
        raise InvalidInputError("bell_regularizer needs at least one finite similarity.")
    if not eps > 0:
        raise InvalidInputError("eps must be > 0.")
    m = float(np.median(x))
    sigma = float(np.median(np.abs(x - m))) + eps
    return np.exp(-((x - m) ** 2) / (2.0 * sigma * sigma))


def _normalize64(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise InvalidInputError(f"Expected a 2-d array of embeddings, got shape {X.shape}.")
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return X / norms


def theme_cohesion(X: np.ndarray) -> tuple[float, np.ndarray]:
    """Cohesion of one theme: mean cosine between its semantics and their centroid (Eq. 3).

    Args:
        X: the theme's semantic embeddings, float array ``(n_k, d)``, n_k >= 1.

    Returns:
        ``(cohesion, centroid)``: ``(1/n_k) sum_i cos(x_i, mu_k)`` (float) and ``mu_k``, the mean of the
        L2-normalised rows (float64 ``(d,)``).

    References:
        xMemory Sec. 3.2, Eq. (3) (intra-theme term).
    """
    Xn = _normalize64(X)
    if Xn.shape[0] == 0:
        raise InvalidInputError("A theme needs at least one semantic.")
    mu = Xn.mean(axis=0)
    norm = float(np.linalg.norm(mu))
    if norm == 0.0:
        return 0.0, mu
    return float((Xn @ mu).mean() / norm), mu


def sem_score(cohesions: Sequence[float] | np.ndarray, centroids: np.ndarray, eps: float = 1e-2) -> float:
    """SemScore: ``(1/K) sum_k cohesion_k * g(s_k)`` (Eq. 3).

    With a single theme there is no inter-theme relation; ``g`` is taken as 1.

    Args:
        cohesions: per-theme cohesion, float ``(K,)``.
        centroids: theme centroids, float ``(K, d)``.
        eps: the MAD offset of :func:`bell_regularizer`, default 0.01.

    Returns:
        The score (float).

    References:
        xMemory Sec. 3.2, Eq. (3).
    """
    c = np.asarray(cohesions, dtype=np.float64).ravel()
    if c.size == 0:
        raise InvalidInputError("sem_score needs at least one theme.")
    if c.size == 1:
        return float(c[0])
    g = bell_regularizer(nearest_theme_similarities(centroids), eps)
    return float((c * g).mean())


def _objective_from_stats(
    sizes: Sequence[int], cohesions: Sequence[float], centroids: np.ndarray, eps: float
) -> float:
    return sparsity_score(sizes) + sem_score(cohesions, centroids, eps)


def partition_objective(X: np.ndarray, labels: Sequence[Any], eps: float = 1e-2) -> float:
    """``f(P) = SparsityScore(P) + SemScore(P)`` of a partition of semantic embeddings (Eq. 1).

    Args:
        X: semantic embeddings, float array ``(N, d)``.
        labels: theme label of each row (length N; any hashable values).
        eps: the MAD offset of the bell regulariser, default 0.01.

    Returns:
        ``f(P)`` (float).

    Raises:
        InvalidInputError: ``labels`` does not have one entry per row, or ``N = 0``.

    References:
        xMemory Sec. 3.2, Eq. (1)-(3).
    """
    X = np.asarray(X, dtype=np.float64)
    labels = list(labels)
    if X.ndim != 2 or X.shape[0] == 0 or len(labels) != X.shape[0]:
        raise InvalidInputError("partition_objective needs X of shape (N, d), N >= 1, and N labels.")
    order = list(dict.fromkeys(labels))
    sizes, cohs, cents = [], [], []
    for lab in order:
        rows = [i for i, x in enumerate(labels) if x == lab]
        coh, mu = theme_cohesion(X[rows])
        sizes.append(len(rows))
        cohs.append(coh)
        cents.append(mu)
    return _objective_from_stats(sizes, cohs, np.stack(cents), eps)


def candidate_splits(X: np.ndarray, max_parts: int = 3) -> list[np.ndarray]:
    """Candidate partitions of an overcrowded theme, by clustering its semantics.

    Agglomerative clustering of the L2-normalised embeddings with average and Ward linkage
    (``scipy.cluster.hierarchy``), each dendrogram cut into 2..``max_parts`` clusters; duplicates are
    removed. Deterministic. When clustering cannot separate the rows (e.g. identical vectors), the rows
    are split into two halves in order.

    Args:
        X: the theme's semantic embeddings, float ``(n, d)``, n >= 2.
        max_parts: the largest number of parts tried, default 3.

    Returns:
        Label arrays (int, shape ``(n,)``, labels ``0..m-1`` in order of first appearance), each with at
        least two parts.

    References:
        xMemory Sec. 3.2 "Guided attach, split, and merge" (candidate splits by clustering).
    """
    from scipy.cluster.hierarchy import fcluster, linkage

    Xn = _normalize64(X)
    n = Xn.shape[0]
    if n < 2:
        raise InvalidInputError("A split needs at least two semantics.")
    out: list[np.ndarray] = []
    seen: set[tuple[int, ...]] = set()
    for method in ("average", "ward"):
        Z = linkage(Xn, method=method, metric="euclidean")
        for k in range(2, min(n, max(2, max_parts)) + 1):
            lab = fcluster(Z, k, criterion="maxclust")
            canon = _canonical(lab)
            if len(set(canon)) >= 2 and tuple(canon) not in seen:
                seen.add(tuple(canon))
                out.append(np.asarray(canon))
    if not out:
        out.append(np.asarray([0] * (n // 2) + [1] * (n - n // 2)))
    return out


def central_facts(texts: Sequence[str], vectors: np.ndarray, max_chars: int = 600) -> str:
    """LLM-free theme summary: the theme's most central facts, in their order, within a length budget.

    The rule of :class:`~shared_core.models.extractive.ExtractiveSummarizer` applied to whole facts and
    their existing vectors (no embedding call): facts are ranked by cosine to the centroid of the
    normalised fact vectors and taken greedily while the summary (facts joined by one space) stays
    within ``max_chars``; the chosen facts keep their original order. When even the most central fact
    is longer than the budget it is cut at a word boundary and ends with "…".

    Args:
        texts: the facts (non-empty strings) in order.
        vectors: their embeddings, float ``(len(texts), d)``.
        max_chars: length budget in characters, default 600.

    Returns:
        The summary text.

    References:
        xMemory Sec. 3.2 (theme summaries; App. C theme prompt when an LLM is configured); centroid-based
        extractive summarisation (Radev et al., 2004).
    """
    if not texts:
        raise InvalidInputError("A theme summary needs at least one fact.")
    V = normalize_rows(np.asarray(vectors, dtype=np.float32))
    mu = V.mean(axis=0)
    order = sorted(range(len(texts)), key=lambda i: (-float(V[i] @ mu), i))
    chosen: list[int] = []
    used = 0
    for i in order:
        cost = len(texts[i]) + (1 if chosen else 0)
        if used + cost <= max_chars:
            chosen.append(i)
            used += cost
    if not chosen:
        text = texts[order[0]][: max(1, max_chars - 1)]
        if " " in text[max_chars // 2 :]:
            text = text[: text.rfind(" ")]
        return text.rstrip() + "…"
    return " ".join(texts[i] for i in sorted(chosen))


def _canonical(labels: Iterable[Any]) -> list[int]:
    m: dict[Any, int] = {}
    return [m.setdefault(x, len(m)) for x in labels]


# =========================================================================== kNN graph
class KNNGraph:
    """Exact directed k-nearest-neighbour graph over unit vectors, maintained incrementally.

    ``rows[i]`` maps each of node ``i``'s k most similar other nodes to the cosine similarity (ties broken
    by smaller id). After :meth:`upsert` and :meth:`remove` the rows equal what :meth:`rebuild` would give
    on the same vectors: a changed node's row is recomputed; another node's row is recomputed when it
    listed a changed or removed node, and otherwise only gains a changed node that beats its k-th
    neighbour. Cost per update: one product of the changed rows against all vectors plus the recomputed
    rows, instead of the O(N^2) rebuild.

    Args:
        k: neighbours per node, default 10.

    References:
        xMemory Sec. 3.2 "kNN graph for high-level navigation" (top-k similarity edges per node).
    """

    def __init__(self, k: int = 10) -> None:
        if isinstance(k, bool) or int(k) < 1:
            raise InvalidInputError("k must be a positive integer.")
        self.k = int(k)
        self.rows: dict[int, dict[int, float]] = {}

    def neighbors(self, nid: int) -> dict[int, float]:
        """Neighbour id -> similarity of ``nid`` (empty when unknown)."""
        return self.rows.get(nid, {})

    def _row(self, j: int, ids: Sequence[int], sims: np.ndarray) -> dict[int, float]:
        ids_arr = np.asarray(ids, dtype=np.int64)
        mask = ids_arr != j
        cand_ids, cand = ids_arr[mask], sims[mask]
        order = np.lexsort((cand_ids, -cand))[: self.k]
        return {int(cand_ids[o]): float(cand[o]) for o in order}

    def rebuild(self, ids: Sequence[int], mat: np.ndarray) -> None:
        """Recompute every row from scratch.

        Args:
            ids: node ids (length N).
            mat: their unit vectors, float ``(N, d)``.
        """
        ids = list(ids)
        self.rows = {}
        if not ids:
            return
        S = np.asarray(mat, dtype=np.float64) @ np.asarray(mat, dtype=np.float64).T
        for r, j in enumerate(ids):
            self.rows[j] = self._row(j, ids, S[r])

    def upsert(self, ids: Sequence[int], mat: np.ndarray, changed: Iterable[int]) -> None:
        """Add new nodes or update nodes whose vectors changed.

        Args:
            ids: every current node id (length N), including the changed ones.
            mat: their unit vectors, float ``(N, d)``, in the order of ``ids``.
            changed: ids (within ``ids``) that are new or whose vector changed.
        """
        ids = list(ids)
        pos = {j: r for r, j in enumerate(ids)}
        ch = [c for c in dict.fromkeys(changed) if c in pos]
        if not ch:
            return
        M = np.asarray(mat, dtype=np.float64)
        chset = set(ch)
        cross = M @ M[[pos[c] for c in ch]].T  # (N, |ch|)
        redo = set(ch)
        for j, row in self.rows.items():
            if j in chset or j not in pos:
                continue
            if chset.intersection(row):
                redo.add(j)
                continue
            r = pos[j]
            for ci, c in enumerate(ch):
                s = float(cross[r, ci])
                if len(row) < self.k:
                    row[c] = s
                    continue
                worst = min(row.items(), key=lambda kv: (kv[1], -kv[0]))
                if (s, -c) > (worst[1], -worst[0]):
                    del row[worst[0]]
                    row[c] = s
        self._recompute(sorted(redo), ids, M, pos)

    def remove(self, removed: Iterable[int], ids: Sequence[int], mat: np.ndarray) -> None:
        """Remove nodes; rows that listed one of them are recomputed over the remaining nodes.

        Args:
            removed: ids to drop.
            ids: the remaining node ids.
            mat: their unit vectors, float ``(len(ids), d)``.
        """
        gone = set(removed)
        for g in gone:
            self.rows.pop(g, None)
        ids = list(ids)
        pos = {j: r for r, j in enumerate(ids)}
        redo = [j for j, row in self.rows.items() if gone.intersection(row)]
        self._recompute(sorted(redo), ids, np.asarray(mat, dtype=np.float64), pos)

    def _recompute(self, which: list[int], ids: list[int], M: np.ndarray, pos: dict[int, int]) -> None:
        which = [j for j in which if j in pos]
        if not which:
            return
        S = M[[pos[j] for j in which]] @ M.T
        for r, j in enumerate(which):
            self.rows[j] = self._row(j, ids, S[r])


# =========================================================================== Eq. 4
def greedy_representatives(
    candidates: Sequence[int],
    relevance: Mapping[int, float],
    neighbors: Mapping[int, Mapping[int, float]],
    *,
    alpha: float = 0.7,
    coverage: float = 0.8,
    budget: int = 5,
) -> list[tuple[int, float]]:
    """Query-aware greedy representative selection on a kNN graph (Eq. 4).

    ``V`` = ``candidates``; ``N(i)`` = i's graph neighbours inside V with edge weight ``w_iu > 0``; the
    node itself counts with ``w_ii = 1``. With ``C(R)`` the nodes covered by the selected set R and
    ``Delta(i; R) = ({i} u N(i)) \\ C(R)``, each step picks::

        i* = argmax_{i in V \\ R}  alpha * sum_{u in Delta(i;R)} w_iu / Z  +  (1 - alpha) * s~(q, i)

    where ``s~(q, i) = max(relevance_i, 0) / max_{j in V} max(relevance_j, 0)`` (in [0, 1]; 0 when all
    are 0) and ``Z = max_{i in V} (1 + sum_{u in N(i)} w_iu)`` (so the coverage term is in [0, 1]). Ties
    go to the higher ``s~``, then to the earlier candidate. Selection stops when ``|C(R)| / |V|``
    reaches ``coverage`` or ``|R|`` reaches ``budget``.

    Args:
        candidates: candidate node ids V (order breaks ties).
        relevance: query-node similarity of each candidate (missing = 0).
        neighbors: kNN rows: node id -> {neighbour id: similarity}.
        alpha: weight of the coverage term, in [0, 1], default 0.7.
        coverage: target covered ratio in (0, 1], default 0.8.
        budget: at most this many representatives (>= 1), default 5.

    Returns:
        ``(node id, objective value at selection)`` in selection order.

    Raises:
        InvalidInputError: ``alpha`` outside [0, 1], ``coverage`` outside (0, 1] or ``budget < 1``.

    References:
        xMemory Sec. 3.3 "Stage I", Eq. (4).
    """
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1], got {alpha}.")
    if not 0.0 < coverage <= 1.0:
        raise InvalidInputError(f"coverage must be in (0, 1], got {coverage}.")
    if isinstance(budget, bool) or int(budget) < 1:
        raise InvalidInputError(f"budget must be a positive integer, got {budget!r}.")
    V = list(dict.fromkeys(int(c) for c in candidates))
    if not V:
        return []
    Vset = set(V)
    nbr: dict[int, dict[int, float]] = {
        i: {int(u): float(w) for u, w in neighbors.get(i, {}).items() if u in Vset and u != i and w > 0}
        for i in V
    }
    rel = {i: max(float(relevance.get(i, 0.0)), 0.0) for i in V}
    rmax = max(rel.values())
    s_t = {i: (rel[i] / rmax if rmax > 0 else 0.0) for i in V}
    Z = max(1.0 + sum(nbr[i].values()) for i in V)
    covered: set[int] = set()
    chosen: list[tuple[int, float]] = []
    in_R: set[int] = set()
    while len(chosen) < min(int(budget), len(V)):
        if chosen and len(covered) / len(V) >= coverage:
            break
        best, best_key = None, None
        for order, i in enumerate(V):
            if i in in_R:
                continue
            gain = (0.0 if i in covered else 1.0) + sum(w for u, w in nbr[i].items() if u not in covered)
            val = alpha * gain / Z + (1.0 - alpha) * s_t[i]
            key = (val, s_t[i], -order)
            if best_key is None or key > best_key:
                best, best_key = i, key
        assert best is not None and best_key is not None
        chosen.append((best, float(best_key[0])))
        in_R.add(best)
        covered.add(best)
        covered.update(nbr[best])
    return chosen


# =========================================================================== derived structures
@dataclasses.dataclass
class _Derived:
    """Structures derived from the node store and vectors; rebuilt after a rollback or a load."""

    sem_ids: list[int]
    sem_vec: dict[int, np.ndarray]
    theme_stats: dict[int, tuple[int, float, np.ndarray]]  # size, cohesion, centroid (mean of unit rows)
    sem_graph: KNNGraph
    theme_graph: KNNGraph
    _mat: np.ndarray | None = None

    def sem_matrix(self) -> np.ndarray:
        # sem_ids only grows while a cache lives (a deletion drops the cache), so the length tells
        # whether the stacked matrix is current
        if not self.sem_ids:
            return np.zeros((0, 1), dtype=np.float32)
        if self._mat is None or len(self._mat) != len(self.sem_ids):
            self._mat = np.stack([self.sem_vec[i] for i in self.sem_ids])
        return self._mat

    def theme_matrix(self) -> tuple[list[int], np.ndarray]:
        ids = sorted(self.theme_stats)
        if not ids:
            return ids, np.zeros((0, 1))
        return ids, normalize_rows(np.stack([self.theme_stats[t][2] for t in ids]).astype(np.float32))


# =========================================================================== the memory
class XMemory(HierarchicalMemory):
    """xMemory: a four-level memory (message -> episode -> semantic -> theme) with two-stage retrieval.

    Construction (online, per message): the boundary detector decides whether the new message opens a
    new episode. With an LLM (``boundary="llm"``, the default when ``llm`` is given) it answers the
    App. C boundary prompt as JSON, parsed strictly with one retry; an unusable answer falls back to
    the rule. The rule (``boundary="rule"``, the default without LLM) cuts when (a) the open episode
    already has ``max_episode_messages`` messages (also enforced with an LLM), (b) the time between the
    previous message and the new one exceeds ``time_gap_minutes`` (when both timestamps parse), or (c)
    the open episode has at least ``min_episode_messages`` messages and the cosine between the new
    message and the normalised mean of the open episode's message vectors is below
    ``drift_threshold``. A closed episode gets its record (LLM: title + third-person content with
    relative dates resolved against the timestamps; LLM-free: the rendered messages themselves), then
    semantics (LLM: a JSON list of facts; LLM-free: :func:`extract_facts_rule`), each merged into an
    existing semantic whose cosine is at least ``dedup_threshold`` (adding the episode link) or created
    and attached to the theme with the nearest centroid when its cosine is at least
    ``attach_threshold``, else to a new theme. A theme above ``theme_size_cap`` semantics is split into
    the candidate partition (:func:`candidate_splits`) with the highest ``f(P)``; a tiny theme (at most
    ``tiny_theme_size`` semantics) is merged into the neighbour theme (centroid cosine at least
    ``merge_threshold``, at most ``merge_candidates`` tried) whose merge gives the highest ``f(P)``.
    Theme summaries come from the summariser: with an LLM the App. C theme prompt; without one
    :func:`central_facts` (the theme's most central facts, from their existing vectors); a given
    ``summarizer`` is always used.

    Args:
        embedder: the embedder (default: the embedded all-MiniLM-L6-v2).
        llm: an LLM for boundaries, episode records, facts and theme summaries, or ``None`` (rules).
        reader: the LLM whose answer log-probabilities measure uncertainty in Stage II; default ``llm``.
            Without a reader, or when it returns no log-probabilities, a proxy is used (see
            :meth:`uncertainty`).
        boundary: ``"auto"`` (LLM when ``llm`` is given, else rule), ``"llm"`` or ``"rule"``.
        max_episode_messages: length cap of an episode in messages, default 12 (App. C: 10-15).
        min_episode_messages: messages before the drift rule may cut, default 2.
        drift_threshold: cosine below which the rule cuts, default 0.4. Measured on the LoCoMo dev
            conversations with all-MiniLM-L6-v2 over ``"speaker: text"``: a message's cosine to the mean
            of the previous (up to 6) messages of its session has median 0.62 and 5th percentile 0.41,
            so 0.4 cuts at the sharpest few percent of turns; an embedder with another similarity scale
            needs its own value.
        time_gap_minutes: a gap above this cuts (rule), default 30 (App. C).
        max_facts: facts per episode at most, default 8.
        dedup_threshold: cosine at or above which a new fact merges into an existing semantic,
            default 0.9.
        attach_threshold: theme attach threshold, default 0.62.
        merge_threshold: tiny-theme merge threshold, default 0.78.
        theme_size_cap: split themes above this size, default 12 (App. B).
        tiny_theme_size: themes of at most this size are merge candidates, default 2.
        merge_candidates: nearest themes tried for a merge, default 3.
        split: enable theme splits, default ``True``.
        merge: enable tiny-theme merges, default ``True``.
        knn_k: neighbours per node in the theme and semantic kNN graphs, default 10.
        eps: the MAD offset of Eq. 3, default 0.01.
        alpha: Eq. 4 coverage/relevance balance, default 0.7.
        coverage: Eq. 4 target covered ratio, default 0.8.
        semantic_pool: semantics first retrieved by similarity, default 40.
        theme_budget: themes selected at most, default 5.
        semantic_budget: semantics selected at most, default 20.
        episode_budget: episodes probed at most in Stage II, default 10.
        patience: Stage II stops after this many consecutive episodes that do not lower uncertainty,
            default 2.
        min_gain: an episode (or its messages) is included only when uncertainty drops by more than
            this, default 0.0.
        expand_messages: in Stage II, try the raw messages of included LLM-written episodes, default
            ``True``.
        support_weight: weight of semantic support (vs. direct cosine) in episode priority, default 0.5.
        answer_tokens: completion cap of the reader in tokens, default 32.
        summarizer: theme summariser (default: LLM with the App. C theme prompt, or
            :func:`central_facts`).
        summary_chars: LLM-free theme summary budget in characters, default 600.

    Policies: ``adaptive`` (Stage I + II, default), ``representative`` (Stage I), ``collapsed`` (flat
    top-k). Hits carry ``metadata["level"]`` in ``{"theme", "semantic", "episode", "message"}`` and
    ``metadata["tokens"]``.

    Raises:
        InvalidInputError: a parameter out of range.
        UnknownPolicyError: an unknown ``boundary`` mode.
        LLMRequiredError: ``boundary="llm"`` without ``llm``.

    References:
        xMemory (shared/seeds/xmemory-paper.txt): Sec. 3.2-3.3, Eq. (1)-(4), Sec. 5.3, App. B, App. C.
    """

    kind = "xmemory"
    policies = ("adaptive", "representative", "collapsed")
    default_policy = "adaptive"
    contiguous_spans = False
    default_k: ClassVar[int] = 10

    def __init__(
        self,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        *,
        reader: LLM | None = None,
        boundary: str = "auto",
        max_episode_messages: int = 12,
        min_episode_messages: int = 2,
        drift_threshold: float = 0.4,
        time_gap_minutes: float = 30.0,
        max_facts: int = 8,
        dedup_threshold: float = 0.9,
        attach_threshold: float = 0.62,
        merge_threshold: float = 0.78,
        theme_size_cap: int = 12,
        tiny_theme_size: int = 2,
        merge_candidates: int = 3,
        split: bool = True,
        merge: bool = True,
        knn_k: int = 10,
        eps: float = 1e-2,
        alpha: float = 0.7,
        coverage: float = 0.8,
        semantic_pool: int = 40,
        theme_budget: int = 5,
        semantic_budget: int = 20,
        episode_budget: int = 10,
        patience: int = 2,
        min_gain: float = 0.0,
        expand_messages: bool = True,
        support_weight: float = 0.5,
        answer_tokens: int = 32,
        summarizer: Summarizer | None = None,
        summary_chars: int = 600,
        store: str | Path | None = None,
    ) -> None:
        if boundary not in BOUNDARY_MODES:
            raise UnknownPolicyError(f"boundary must be one of {BOUNDARY_MODES}, got {boundary!r}.")
        if boundary == "llm" and llm is None:
            raise LLMRequiredError("boundary='llm' needs an LLM; pass llm=... or use boundary='rule'.")
        if reader is not None and not hasattr(reader, "complete"):
            raise InvalidInputError(
                f"reader must have a complete(prompt) method, got {type(reader).__name__}."
            )
        self.boundary = boundary
        self.max_episode_messages = _pos_int(max_episode_messages, "max_episode_messages")
        self.min_episode_messages = _pos_int(min_episode_messages, "min_episode_messages")
        self.drift_threshold = _cosine(drift_threshold, "drift_threshold")
        self.time_gap_minutes = check_finite(time_gap_minutes, "time_gap_minutes")
        if self.time_gap_minutes <= 0:
            raise InvalidInputError("time_gap_minutes must be > 0.")
        self.max_facts = _pos_int(max_facts, "max_facts")
        self.dedup_threshold = _cosine(dedup_threshold, "dedup_threshold")
        self.attach_threshold = _cosine(attach_threshold, "attach_threshold")
        self.merge_threshold = _cosine(merge_threshold, "merge_threshold")
        self.theme_size_cap = _pos_int(theme_size_cap, "theme_size_cap", minimum=2)
        self.tiny_theme_size = _pos_int(tiny_theme_size, "tiny_theme_size")
        self.merge_candidates = _pos_int(merge_candidates, "merge_candidates")
        self.split = bool(split)
        self.merge = bool(merge)
        self.knn_k = _pos_int(knn_k, "knn_k")
        self.eps = check_finite(eps, "eps")
        if self.eps <= 0:
            raise InvalidInputError("eps must be > 0.")
        self.alpha = _unit_interval(alpha, "alpha")
        self.coverage = _unit_interval(coverage, "coverage")
        if self.coverage == 0:
            raise InvalidInputError("coverage must be in (0, 1].")
        self.semantic_pool = _pos_int(semantic_pool, "semantic_pool")
        self.theme_budget = _pos_int(theme_budget, "theme_budget")
        self.semantic_budget = _pos_int(semantic_budget, "semantic_budget")
        self.episode_budget = _pos_int(episode_budget, "episode_budget")
        self.patience = _pos_int(patience, "patience")
        self.min_gain = check_finite(min_gain, "min_gain")
        self.expand_messages = bool(expand_messages)
        self.support_weight = _unit_interval(support_weight, "support_weight")
        self.answer_tokens = _pos_int(answer_tokens, "answer_tokens")
        self.reader = reader
        self._open: int | None = None
        self._counts: dict[str, int] = {}
        self._cache: _Derived | None = None
        self._prefetch: list[str] | None = None
        self._custom_summarizer = summarizer is not None
        #: diagnostics of the last adaptive/representative retrieval (selected ids, Stage II probes)
        self.last_trace: dict[str, Any] = {}
        super().__init__(embedder, llm, summarizer=summarizer, summary_chars=summary_chars, store=store)

    # ------------------------------------------------------------------ configuration and state
    def _default_summarizer(self) -> Summarizer:
        if self.llm is not None:
            from .models.llm_summarizer import LLMSummarizer

            return LLMSummarizer(self.llm, template=P.THEME_USER, system=P.THEME_SYSTEM)
        return super()._default_summarizer()

    def _config(self) -> dict[str, Any]:
        return {
            "boundary": self.boundary,
            "max_episode_messages": self.max_episode_messages,
            "min_episode_messages": self.min_episode_messages,
            "drift_threshold": self.drift_threshold,
            "time_gap_minutes": self.time_gap_minutes,
            "max_facts": self.max_facts,
            "dedup_threshold": self.dedup_threshold,
            "attach_threshold": self.attach_threshold,
            "merge_threshold": self.merge_threshold,
            "theme_size_cap": self.theme_size_cap,
            "tiny_theme_size": self.tiny_theme_size,
            "merge_candidates": self.merge_candidates,
            "split": self.split,
            "merge": self.merge,
            "knn_k": self.knn_k,
            "eps": self.eps,
            "alpha": self.alpha,
            "coverage": self.coverage,
            "semantic_pool": self.semantic_pool,
            "theme_budget": self.theme_budget,
            "semantic_budget": self.semantic_budget,
            "episode_budget": self.episode_budget,
            "patience": self.patience,
            "min_gain": self.min_gain,
            "expand_messages": self.expand_messages,
            "support_weight": self.support_weight,
            "answer_tokens": self.answer_tokens,
            "summary_chars": self.summary_chars,
        }

    def _get_state(self) -> dict[str, Any]:
        # Small on purpose (deep-copied at every transaction): the open episode and counters. The kNN
        # graphs, centroids and vector caches are derived from the store and rebuilt after a rollback.
        return {"open": self._open, "counts": dict(self._counts)}

    def _set_state(self, state: dict[str, Any]) -> None:
        op = state.get("open")
        self._open = None if op is None else int(op)
        self._counts = {str(k): int(v) for k, v in (state.get("counts") or {}).items()}
        self._cache = None

    def _initial_state(self) -> dict[str, Any]:
        return {"open": None, "counts": {}}

    def _count(self, key: str, n: int = 1) -> None:
        self._counts[key] = self._counts.get(key, 0) + n

    @property
    def boundary_mode(self) -> str:
        """The boundary detector in use: ``"llm"`` or ``"rule"``."""
        if self.boundary == "auto":
            return "llm" if self.llm is not None else "rule"
        return self.boundary

    # ------------------------------------------------------------------ store helpers
    def _ids_at(self, level: int) -> list[int]:
        return sorted(i for i, n in self._store.nodes.items() if n.level == level and not n.is_leaf)

    def _messages(self, ep: int) -> list[Message]:
        st = self._store
        return [st.nodes[c].message for c in st.nodes[ep].children if st.nodes[c].message is not None]

    def _links(self, nid: int, key: str) -> list[int]:
        return [int(x) for x in self._store.nodes[nid].data.get(key, [])]

    def _derived(self) -> _Derived:
        if self._cache is not None:
            return self._cache
        st = self._store
        sem_ids = self._ids_at(SEMANTIC)
        sem_vec: dict[int, np.ndarray] = {}
        fresh = [i for i in sem_ids if i in self._pending or i in st.changed]
        stored = [i for i in sem_ids if i not in self._pending and i not in st.changed]
        if stored:
            assert self._index is not None
            sem_vec.update(zip(stored, np.asarray(self._index.get(stored), dtype=np.float32)))
        for i in fresh:
            sem_vec[i] = np.asarray(self._vector(i), dtype=np.float32)
        d = _Derived(sem_ids, sem_vec, {}, KNNGraph(self.knn_k), KNNGraph(self.knn_k))
        for t in self._ids_at(THEME):
            members = [c for c in st.nodes[t].children if c in sem_vec]
            if members:
                d.theme_stats[t] = self._stats_of(d, members)
        if sem_ids:
            d.sem_graph.rebuild(sem_ids, d.sem_matrix())
        tids, tmat = d.theme_matrix()
        if tids:
            d.theme_graph.rebuild(tids, tmat)
        self._cache = d
        return d

    @staticmethod
    def _stats_of(d: _Derived, members: Sequence[int]) -> tuple[int, float, np.ndarray]:
        coh, mu = theme_cohesion(np.stack([d.sem_vec[m] for m in members]))
        return len(members), coh, mu

    def _ensure_root(self) -> int:
        st = self._store
        if st.root is None:
            root = st.new_node(level=ROOT)
            st.set_root(root.id)
        assert st.root is not None
        return st.root

    # ------------------------------------------------------------------ construction
    def add(self, items: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages in order (see :meth:`HierarchicalMemory.add`).

        The texts of all given messages are embedded in one batched call before they are inserted one
        by one (online: each boundary decision only sees the messages before it).

        Args:
            items: a string, a :class:`Message`, or an iterable of them (inserted in order).

        Returns:
            :class:`AddReport`; ``details[i]`` says whether message i closed an episode (``boundary``,
            ``boundary_by``: ``llm`` / ``gap`` / ``drift`` / ``cap`` / ``rule``) and what the closed
            episode produced (``semantics_created``, ``semantics_merged``, ``facts``).

        Raises:
            InvalidInputError, EmbeddingError, ModelError: as :meth:`HierarchicalMemory.add`; the memory is
                then unchanged.
        """
        messages = as_messages(items)
        self._prefetch = [m.render() for m in messages]
        try:
            return super().add(messages)
        finally:
            self._prefetch = None

    def _insert(self, message: Message, usage: Usage) -> dict[str, Any]:
        st = self._store
        if self._prefetch:
            self._embed(self._prefetch, usage)  # one batched call; _embed reuses these vectors
            self._prefetch = None
        root = self._ensure_root()
        text = message.render()  # "speaker: text", as every hiermem memory indexes a message
        leaf = st.new_node(text=text, is_leaf=True, message=message, level=MESSAGE)
        vec = self._embed([text], usage)[0]
        self._set_vector(leaf.id, vec)
        detail: dict[str, Any] = {"boundary": False}
        ep = self._open
        if ep is not None and st.nodes[ep].children:
            cut, reason, how = self._detect_boundary(ep, message, vec, usage)
            detail.update(boundary=cut, boundary_by=how)
            if cut:
                self._count(f"boundary_{how}")
                detail["closed_episode"] = ep
                detail.update(self._close_episode(ep, reason, usage))
                ep = None
        if ep is None:
            ep = st.new_node(level=EPISODE, data={"open": True, "raw": True}).id
            st.add_child(root, ep)
            self._open = ep
            self._count("episodes_opened")
        st.add_child(ep, leaf.id)
        st.refresh_span(ep)
        st.set_text(ep, render_messages(self._messages(ep)))
        st.refresh_span(root)
        detail["episode"] = ep
        return detail

    def flush(self) -> AddReport:
        """Close the open episode now: write its record, distil its semantics, update the themes.

        Atomic like :meth:`add` (any error leaves the memory unchanged). Does nothing when no episode is
        open.

        Returns:
            :class:`AddReport` (no new leaves; ``details`` has one entry describing the closed episode).

        References:
            xMemory Sec. 3.2 (episode -> semantic -> theme construction).
        """
        report = AddReport()
        with self._lock:
            if self._open is None or self._open not in self._store.nodes:
                return report
            t0 = time.perf_counter()
            self._begin(report.usage)
            try:
                ep = self._open
                details = {"closed_episode": ep, **self._close_episode(ep, "end of the stream", report.usage)}
                report.details.append(details)
                self._embed_pending(report.usage)
                self._commit()
            except BaseException:
                self._rollback()
                raise
            self._record_seconds(report.usage, time.perf_counter() - t0)
        return report

    # ---- boundary detection
    def _detect_boundary(
        self, ep: int, message: Message, vec: np.ndarray, usage: Usage
    ) -> tuple[bool, str, str]:
        st = self._store
        children = list(st.nodes[ep].children)
        if len(children) >= self.max_episode_messages:
            return True, f"the episode reached {self.max_episode_messages} messages", "cap"
        if self.boundary_mode == "llm":
            assert self.llm is not None
            prompt = P.BOUNDARY_USER.format(
                history=render_messages(self._messages(ep)),
                new_messages=render_messages([message]),
                max_messages=self.max_episode_messages,
            )
            res = complete_parsed(
                self.llm,
                prompt,
                _parse_boundary,
                system=P.BOUNDARY_SYSTEM,
                max_tokens=128,
                fallback=None,
            )
            usage += res.usage
            if res.ok and res.value is not None:
                cut, reason = res.value
                return cut, reason or "topic change", "llm"
            self._count("boundary_parse_fallbacks")
        prev = st.nodes[children[-1]].message
        t_prev = parse_timestamp(prev.timestamp if prev is not None else None)
        t_new = parse_timestamp(message.timestamp)
        if t_prev is not None and t_new is not None:
            gap = abs((t_new - t_prev).total_seconds()) / 60.0
            if gap > self.time_gap_minutes:
                return True, f"{gap:.0f} minutes passed since the previous message", "gap"
        if len(children) >= self.min_episode_messages:
            centroid = normalize_rows(np.mean(self._vectors(children), axis=0, keepdims=True))[0]
            cos = float(centroid @ vec)
            if cos < self.drift_threshold:
                return True, f"topic drift (cosine {cos:.2f} to the episode)", "drift"
        return False, "", "rule"

    # ---- closing an episode
    def _close_episode(self, ep: int, reason: str, usage: Usage) -> dict[str, Any]:
        st = self._store
        msgs = self._messages(ep)
        st.set_data(ep, "open", False)
        if self._open == ep:
            self._open = None
        self._count("episodes")
        # 1. the episode record
        record = None
        if self.llm is not None:
            prompt = P.EPISODE_USER.format(
                conversation=render_messages(msgs), boundary_reason=reason or "not given"
            )
            res = complete_parsed(
                self.llm, prompt, _parse_episode, system=P.EPISODE_SYSTEM, max_tokens=1024, fallback=None
            )
            usage += res.usage
            record = res.value if res.ok else None
            if record is None:
                self._count("episode_parse_fallbacks")
        if record is not None:
            st.set_text(ep, f"{record['title']}\n{record['content']}")
            st.set_data(ep, "raw", False)
            st.set_data(ep, "title", record["title"])
            if record.get("timestamp"):
                st.set_data(ep, "timestamp", record["timestamp"])
        else:
            st.set_text(ep, render_messages(msgs))
            st.set_data(ep, "raw", True)
            if msgs and msgs[0].timestamp:
                st.set_data(ep, "timestamp", msgs[0].timestamp)
        # 2. semantic facts
        facts: list[tuple[str, str]] | None = None
        if self.llm is not None:
            prompt = P.SEMANTIC_USER.format(episodes=st.nodes[ep].text, max_facts=self.max_facts)
            parse = _facts_parser(self.max_facts)
            res2 = complete_parsed(
                self.llm, prompt, parse, system=P.SEMANTIC_SYSTEM, max_tokens=1024, fallback=None
            )
            usage += res2.usage
            if res2.ok and res2.value is not None:
                facts = [(f, f) for f in res2.value]
            else:
                self._count("semantic_parse_fallbacks")
        if facts is None:
            facts = extract_facts_rule(msgs, self.max_facts)
        linked, created, merged = self._add_semantics(ep, facts, usage)
        # 3. place the episode under its primary semantic
        if linked:
            st.detach(ep)
            st.add_child(linked[0], ep)
        else:
            self._count("unfiled_episodes")
        st.set_data(ep, "semantics", list(linked))
        themes_touched = {st.nodes[s].parent for s in created if st.nodes[s].parent is not None}
        for s in linked:
            self._refresh_semantic_span(s)
        # 4. theme maintenance
        themes_touched = self._restructure({t for t in themes_touched if t is not None}, usage)
        self._finish_themes(themes_touched, usage)
        for t in {st.nodes[s].parent for s in linked} - themes_touched:  # spans grown by a merged fact
            if t is not None:
                st.refresh_span(t)
        st.refresh_span(self._ensure_root())
        return {"semantics_created": len(created), "semantics_merged": merged, "facts": len(facts)}

    def _add_semantics(
        self, ep: int, facts: list[tuple[str, str]], usage: Usage
    ) -> tuple[list[int], list[int], int]:
        """Deduplicate facts against existing semantics, create the new ones and attach them to themes."""
        st = self._store
        facts = [(t.strip(), k.strip()) for t, k in facts if t.strip() and k.strip()]
        if not facts:
            return [], [], 0
        d = self._derived()
        vecs = self._embed([k for _, k in facts], usage)
        linked: list[int] = []
        created: list[int] = []
        merged = 0
        for (text, _), v in zip(facts, vecs):
            target = None
            if d.sem_ids:
                sims = d.sem_matrix() @ v
                j = int(np.argmax(sims))
                if float(sims[j]) >= self.dedup_threshold:
                    target = d.sem_ids[j]
            if target is not None:
                eps_ = self._links(target, "episodes")
                if ep not in eps_:
                    st.set_data(target, "episodes", [*eps_, ep])
                merged += 1
                self._count("semantic_merges")
                if target not in linked:
                    linked.append(target)
                continue
            node = st.new_node(text=text, level=SEMANTIC, data={"episodes": [ep], "moves": 0})
            self._set_vector(node.id, v)
            d.sem_ids.append(node.id)
            d.sem_vec[node.id] = np.asarray(v, dtype=np.float32)
            self._attach_to_theme(node.id, d)
            created.append(node.id)
            linked.append(node.id)
            self._count("semantics_created")
        if created:
            d.sem_graph.upsert(d.sem_ids, d.sem_matrix(), created)
        return linked, created, merged

    def _attach_to_theme(self, sid: int, d: _Derived) -> int:
        st = self._store
        v = d.sem_vec[sid]
        tids, tmat = d.theme_matrix()
        target = None
        if tids:
            sims = tmat @ v
            j = int(np.argmax(sims))
            if float(sims[j]) >= self.attach_threshold:
                target = tids[j]
        if target is None:
            target = st.new_node(level=THEME).id
            st.add_child(self._ensure_root(), target)
            self._count("themes_created")
        st.add_child(target, sid)
        d.theme_stats[target] = self._stats_of(d, st.nodes[target].children)
        return target

    def _objective_with(self, d: _Derived, replace: Mapping[int, list[list[int]]]) -> float:
        """``f(P)`` of the current partition with some themes replaced by lists of member groups."""
        sizes, cohs, cents = [], [], []
        for t, (n, c, mu) in d.theme_stats.items():
            if t in replace:
                continue
            sizes.append(n)
            cohs.append(c)
            cents.append(mu)
        for groups in replace.values():
            for g in groups:
                if not g:
                    continue
                n, c, mu = self._stats_of(d, g)
                sizes.append(n)
                cohs.append(c)
                cents.append(mu)
        return _objective_from_stats(sizes, cohs, np.stack(cents), self.eps)

    def _restructure(self, touched: set[int], usage: Usage) -> set[int]:
        """Split overcrowded and merge tiny themes among ``touched``; return every theme left touched."""
        st = self._store
        d = self._derived()
        touched = {t for t in touched if t in st.nodes}
        work = sorted(t for t in touched if len(st.nodes[t].children) > self.theme_size_cap)
        while self.split and work:
            t = work.pop(0)
            members = list(st.nodes[t].children)
            if len(members) <= self.theme_size_cap:
                continue
            X = np.stack([d.sem_vec[m] for m in members])
            best, best_f = None, -math.inf
            for labels in candidate_splits(X):
                groups = [[m for m, lab in zip(members, labels) if lab == g] for g in range(labels.max() + 1)]
                f = self._objective_with(d, {t: groups})
                if f > best_f:
                    best, best_f = groups, f
            assert best is not None
            new_themes = self._apply_split(t, best, d)
            self._count("theme_splits")
            touched.update(new_themes)
            work.extend(x for x in new_themes if len(st.nodes[x].children) > self.theme_size_cap)
        if self.merge:
            for t in sorted(touched):
                if t not in st.nodes or t not in d.theme_stats:
                    continue
                if len(st.nodes[t].children) > self.tiny_theme_size:
                    continue
                target = self._choose_merge(t, d)
                if target is not None:
                    self._apply_merge(t, target, d)
                    self._count("theme_merges")
                    touched.add(target)
        return {t for t in touched if t in st.nodes}

    def _apply_split(self, t: int, groups: list[list[int]], d: _Derived) -> list[int]:
        st = self._store
        groups = sorted(groups, key=lambda g: (-len(g), min(g)))  # the largest part keeps the theme node
        out = [t]
        for g in groups[1:]:
            nt = st.new_node(level=THEME).id
            st.add_child(self._ensure_root(), nt)
            for s in g:
                self._move_semantic(s, nt)
            d.theme_stats[nt] = self._stats_of(d, g)
            out.append(nt)
        d.theme_stats[t] = self._stats_of(d, groups[0])
        return out

    def _choose_merge(self, t: int, d: _Derived) -> int | None:
        st = self._store
        tids, tmat = d.theme_matrix()
        if len(tids) < 2:
            return None
        me = tids.index(t)
        sims = tmat @ tmat[me]
        sims[me] = -np.inf
        order = [int(j) for j in np.argsort(-sims, kind="stable")[: self.merge_candidates]]
        n_t = len(st.nodes[t].children)
        best, best_f = None, -math.inf
        for j in order:
            u = tids[j]
            if float(sims[j]) < self.merge_threshold:
                continue
            if n_t + len(st.nodes[u].children) > self.theme_size_cap:
                continue
            groups = [list(st.nodes[u].children) + list(st.nodes[t].children)]
            f = self._objective_with(d, {t: [], u: groups})
            if f > best_f:
                best, best_f = u, f
        return best

    def _apply_merge(self, t: int, target: int, d: _Derived) -> None:
        st = self._store
        for s in list(st.nodes[t].children):
            self._move_semantic(s, target)
        st.detach(t)
        st.delete_node(t)
        d.theme_stats.pop(t, None)
        d.theme_stats[target] = self._stats_of(d, st.nodes[target].children)

    def _move_semantic(self, s: int, theme: int) -> None:
        st = self._store
        st.detach(s)
        st.add_child(theme, s)
        st.set_data(s, "moves", int(st.nodes[s].data.get("moves", 0)) + 1)

    def _finish_themes(self, touched: set[int], usage: Usage) -> None:
        """Re-summarise touched themes, refresh their spans and update the theme kNN graph."""
        st = self._store
        d = self._derived()
        live = sorted(t for t in touched if t in st.nodes)
        for t in live:
            self._summarize_theme(t, usage)
            st.refresh_span(t)
        tids, tmat = d.theme_matrix()
        gone = [t for t in list(d.theme_graph.rows) if t not in d.theme_stats]
        if gone:
            d.theme_graph.remove(gone, tids, tmat)
        if live:
            d.theme_graph.upsert(tids, tmat, live)

    def _summarize_theme(self, t: int, usage: Usage) -> None:
        st = self._store
        texts = [st.nodes[s].text for s in st.nodes[t].children if st.nodes[s].text]
        if not texts:
            return
        if len(texts) == 1:
            st.set_text(t, texts[0])
            return
        if self.llm is None and not self._custom_summarizer:
            d = self._derived()
            members = [s for s in st.nodes[t].children if st.nodes[s].text]
            vecs = np.stack([d.sem_vec[s] for s in members])
            st.set_text(t, central_facts(texts, vecs, self.summary_chars))
            return
        text, u = self.summarizer.summarize(texts)
        usage += u
        st.set_text(t, text)

    def _refresh_semantic_span(self, s: int) -> None:
        st = self._store
        spans = [st.nodes[e].span for e in self._links(s, "episodes") if e in st.nodes]
        if spans:
            st.set_span(s, (min(a for a, _ in spans), max(b for _, b in spans)))

    # ------------------------------------------------------------------ deletion
    def _delete_leaves(self, leaves: Sequence[int], usage: Usage) -> None:
        st = self._store
        episodes: set[int] = set()
        for lid in leaves:
            if lid not in st.nodes:
                continue
            ep = st.nodes[lid].parent
            st.detach(lid)
            st.delete_node(lid)
            if ep is not None:
                episodes.add(ep)
        themes: set[int] = set()
        semantics: set[int] = set()
        for ep in sorted(episodes):
            if ep not in st.nodes:
                continue
            sems = self._links(ep, "semantics")
            semantics.update(sems)
            if st.nodes[ep].children:
                msgs = self._messages(ep)
                if st.nodes[ep].data.get("raw", True) or self.llm is None:
                    st.set_text(ep, render_messages(msgs))
                    st.set_data(ep, "raw", True)
                else:
                    prompt = P.EPISODE_USER.format(
                        conversation=render_messages(msgs), boundary_reason="rewritten after a deletion"
                    )
                    res = complete_parsed(
                        self.llm,
                        prompt,
                        _parse_episode,
                        system=P.EPISODE_SYSTEM,
                        max_tokens=1024,
                        fallback=None,
                    )
                    usage += res.usage
                    if res.ok and res.value is not None:
                        st.set_text(ep, f"{res.value['title']}\n{res.value['content']}")
                    else:
                        st.set_text(ep, render_messages(msgs))
                        st.set_data(ep, "raw", True)
                st.refresh_span(ep)
                continue
            for s in sems:
                if s in st.nodes:
                    st.set_data(s, "episodes", [e for e in self._links(s, "episodes") if e != ep])
            st.detach(ep)
            st.delete_node(ep)
            if self._open == ep:
                self._open = None
        for s in sorted(semantics):
            if s not in st.nodes:
                continue
            if not self._links(s, "episodes"):
                parent = st.nodes[s].parent
                st.detach(s)
                st.delete_node(s)
                if parent is not None:
                    themes.add(parent)
            else:
                # episodes whose primary semantic survives keep their place; refresh the span
                self._refresh_semantic_span(s)
                if st.nodes[s].parent is not None:
                    themes.add(st.nodes[s].parent)
        for t in sorted(themes):
            if t not in st.nodes:
                continue
            if not st.nodes[t].children:
                st.detach(t)
                st.delete_node(t)
            else:
                self._summarize_theme(t, usage)
                st.refresh_span(t)
        root = st.root
        if root is not None and root in st.nodes:
            if not st.nodes[root].children:
                st.delete_node(root)
            else:
                st.refresh_span(root)
        self._cache = None

    # ------------------------------------------------------------------ retrieval
    def retrieve(
        self,
        query: str,
        k: int | None = None,
        policy: str | None = None,
        *,
        max_tokens: int | None = None,
        **params: Any,
    ) -> list[Hit]:
        """Retrieve for a query.

        Args:
            query: the query text (non-empty).
            k: at most this many hits. Default: 10 for ``collapsed``; for ``adaptive`` and
                ``representative`` no count cap (the policy's budgets decide).
            policy: ``"adaptive"`` (default), ``"representative"`` or ``"collapsed"``.
            max_tokens: optional budget of returned text in tokens; hits that would exceed it are skipped.
            **params: per-call overrides of ``alpha``, ``coverage``, ``semantic_pool``, ``theme_budget``,
                ``semantic_budget``, ``episode_budget``, ``patience``, ``min_gain``,
                ``expand_messages``, ``support_weight`` (see the class).

        Returns:
            Hits. ``adaptive`` / ``representative``: selected themes, then semantics (Stage I, in
            selection order), then included episodes and messages (Stage II, in probing order);
            ``collapsed``: best first. ``metadata`` has ``level``, ``tokens``, ``policy`` and ``stage``.

        Raises:
            InvalidInputError: empty query, bad ``k`` / ``max_tokens`` or an unknown / out-of-range param.
            UnknownPolicyError: another policy.

        References:
            xMemory Sec. 3.3 (Stage I, Eq. 4; Stage II).
        """
        name = policy or self.default_policy
        if k is None and name in ("adaptive", "representative"):
            k = 1_000_000
        return super().retrieve(query, k, policy, max_tokens=max_tokens, **params)

    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(set(params) - _RETRIEVE_PARAMS)
        if bad:
            raise InvalidInputError(
                f"Unknown retrieval parameter(s) {', '.join(bad)}; XMemory accepts "
                f"{', '.join(sorted(_RETRIEVE_PARAMS))}."
            )
        p = {name: getattr(self, name) for name in _RETRIEVE_PARAMS}
        p.update(params)
        p["alpha"] = _unit_interval(p["alpha"], "alpha")
        p["coverage"] = _unit_interval(p["coverage"], "coverage")
        if p["coverage"] == 0:
            raise InvalidInputError("coverage must be in (0, 1].")
        p["support_weight"] = _unit_interval(p["support_weight"], "support_weight")
        for name in ("semantic_pool", "theme_budget", "semantic_budget", "episode_budget", "patience"):
            p[name] = _pos_int(p[name], name)
        p["min_gain"] = check_finite(p["min_gain"], "min_gain")
        p["expand_messages"] = bool(p["expand_messages"])
        return p

    def _meta(self, nid: int, policy: str, stage: str, **extra: Any) -> dict[str, Any]:
        return {"policy": policy, "stage": stage, **extra}

    def _retrieve(
        self, query: str, policy: str, k: int, **params: Any
    ) -> list[tuple[int, float, dict[str, Any]]]:
        p = self._params(params)
        if self._index is None or len(self._index) == 0:
            return []
        qvec = self._embed_query(query)
        ids, r = self.relevance(query, "dense", qvec=qvec)
        if policy == "collapsed":
            want = min(len(ids), 3 * k + 8)
            top = np.lexsort((ids, -r))[:want]
            return [(int(ids[j]), float(r[j]), self._meta(int(ids[j]), policy, "flat")) for j in top]
        sim = {int(i): float(s) for i, s in zip(ids.tolist(), r.tolist())}
        themes, sems = self._stage_one(sim, p)
        out: list[tuple[int, float, dict[str, Any]]] = []
        for t, val in themes:
            out.append((t, sim.get(t, 0.0), self._meta(t, policy, "I", eq4=val)))
        for s, val in sems:
            out.append((s, sim.get(s, 0.0), self._meta(s, policy, "I", eq4=val)))
        self.last_trace = {
            "policy": policy,
            "themes": [t for t, _ in themes],
            "semantics": [s for s, _ in sems],
        }
        if policy == "representative":
            return out
        out += self._stage_two(query, qvec, sim, themes, sems, p, policy)
        return out

    def _stage_one(
        self, sim: dict[int, float], p: dict[str, Any]
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        st = self._store
        d = self._derived()
        if not d.sem_ids:
            return [], []
        pool = sorted(d.sem_ids, key=lambda s: (-sim.get(s, 0.0), s))[: p["semantic_pool"]]
        theme_cands = list(dict.fromkeys(st.nodes[s].parent for s in pool if st.nodes[s].parent is not None))
        themes = greedy_representatives(
            theme_cands,
            sim,
            d.theme_graph.rows,
            alpha=p["alpha"],
            coverage=p["coverage"],
            budget=p["theme_budget"],
        )
        sem_cands = [s for t, _ in themes for s in st.nodes[t].children]
        sem_cands.sort(key=lambda s: (-sim.get(s, 0.0), s))
        sems = greedy_representatives(
            sem_cands,
            sim,
            d.sem_graph.rows,
            alpha=p["alpha"],
            coverage=p["coverage"],
            budget=p["semantic_budget"],
        )
        return themes, sems

    def _episode_candidates(
        self, sim: dict[int, float], sems: list[tuple[int, float]], p: dict[str, Any]
    ) -> list[tuple[int, float, float]]:
        """Linked episodes of the selected semantics (plus open / unfiled ones) by priority.

        priority = (1 - w) * cos(q, e) + w * support(e) / max support, where support(e) is the sum of the
        query similarities of the selected semantics linked to e and w = ``support_weight``.
        """
        st = self._store
        support: dict[int, float] = {}
        for s, _ in sems:
            for e in self._links(s, "episodes"):
                if e in st.nodes:
                    support[e] = support.get(e, 0.0) + max(sim.get(s, 0.0), 0.0)
        for e in self._ids_at(EPISODE):
            node = st.nodes[e]
            if node.data.get("open") or not node.data.get("semantics"):
                support.setdefault(e, 0.0)
        if not support:
            return []
        smax = max(support.values())
        w = p["support_weight"]
        scored = [
            (e, (1.0 - w) * sim.get(e, 0.0) + w * (support[e] / smax if smax > 0 else 0.0), support[e])
            for e in support
        ]
        scored.sort(key=lambda x: (-x[1], x[0]))
        return scored[: p["episode_budget"]]

    def _stage_two(
        self,
        query: str,
        qvec: np.ndarray,
        sim: dict[int, float],
        themes: list[tuple[int, float]],
        sems: list[tuple[int, float]],
        p: dict[str, Any],
        policy: str,
    ) -> list[tuple[int, float, dict[str, Any]]]:
        st = self._store
        cands = self._episode_candidates(sim, sems, p)
        semantic_ctx = [t for t, _ in themes] + [s for s, _ in sems]
        episodic_ctx: list[int] = []
        unc = _Uncertainty(self, query, qvec)
        u = unc(semantic_ctx, episodic_ctx)
        probes: list[dict[str, Any]] = []
        out: list[tuple[int, float, dict[str, Any]]] = []
        misses = 0
        stopped_early = False
        for e, prio, sup in cands:
            u_e = unc(semantic_ctx, [*episodic_ctx, e])
            probe = {"episode": e, "priority": prio, "u_before": u, "u_after": u_e, "included": False}
            probes.append(probe)
            if u_e < u - p["min_gain"]:
                probe["included"] = True
                episodic_ctx.append(e)
                u = u_e
                misses = 0
                out.append((e, prio, self._meta(e, policy, "II", support=sup, uncertainty=u_e)))
                node = st.nodes[e]
                if p["expand_messages"] and not node.data.get("raw", True):
                    msgs = list(node.children)
                    u_m = unc(semantic_ctx, [*episodic_ctx, *msgs])
                    probe["u_messages"] = u_m
                    if u_m < u - p["min_gain"]:
                        probe["expanded"] = True
                        episodic_ctx.extend(msgs)
                        u = u_m
                        out.extend(
                            (m, sim.get(m, 0.0), self._meta(m, policy, "II", episode=e, uncertainty=u_m))
                            for m in msgs
                        )
            else:
                misses += 1
                if misses >= p["patience"]:
                    stopped_early = True
                    break
        self.last_trace.update(
            probes=probes,
            candidates=[e for e, _, _ in cands],
            uncertainty=unc.mode,
            u_final=u,
            stopped_early=stopped_early,
        )
        return out

    def uncertainty(
        self, query: str, semantic_ids: Sequence[int] = (), episodic_ids: Sequence[int] = ()
    ) -> tuple[float, str]:
        """The reader's uncertainty about the answer to ``query`` given a context of nodes.

        With a reader LLM that returns log-probabilities: the mean negative log-likelihood of the answer
        tokens (:func:`mean_nll`) of the App. C answer prompt (semantic memories = themes and semantics,
        episodic memories = episodes and messages). Otherwise the proxy ``1 - (cov + maxsim) / 2``:
        ``cov`` is the share of the query's content words (:func:`query_terms`, stemmed) found in the
        context and ``maxsim`` the highest ``max(cos(q, node), 0)`` over the context's nodes; both lie in
        [0, 1], so the proxy does too, and adding a node never raises it.

        Args:
            query: the question.
            semantic_ids: theme / semantic node ids of the context.
            episodic_ids: episode / message node ids of the context.

        Returns:
            ``(uncertainty, mode)`` with mode ``"logprobs"`` or ``"proxy"``.

        References:
            xMemory Sec. 3.3, Stage II.
        """
        with self._lock:
            unc = _Uncertainty(self, query, self._embed_query(query))
            value = unc(list(semantic_ids), list(episodic_ids))
            return value, unc.mode

    # ------------------------------------------------------------------ hits and statistics
    def hit(self, nid: int, score: float = 0.0, meta: dict[str, Any] | None = None) -> Hit:
        """Build the :class:`Hit` of node ``nid``.

        ``metadata["level"]`` is the level name (``theme``, ``semantic``, ``episode``, ``message``),
        ``metadata["tokens"]`` the token count of the text; a semantic's or theme's ``source_ids`` are
        those of every episode it is linked to (not only the episodes under it in the tree).
        """
        h = super().hit(nid, score, meta)
        st = self._store
        node = st.nodes[nid]
        md = dict(h.metadata)
        md["level"] = LEVEL_NAMES.get(node.level, str(node.level))
        md["tokens"] = count_tokens(node.text)
        src = h.source_ids
        if node.level in (SEMANTIC, THEME):
            sems = [nid] if node.level == SEMANTIC else list(node.children)
            eps = sorted(
                {e for s in sems for e in self._links(s, "episodes") if e in st.nodes},
                key=lambda e: st.nodes[e].span,
            )
            seen: dict[str, None] = {}
            for e in eps:
                for sid in st.source_ids_under(e):
                    seen.setdefault(sid, None)
            src = list(seen)
            md["episodes"] = eps
        if node.level == EPISODE:
            md["open"] = bool(node.data.get("open", False))
            if node.data.get("title"):
                md["title"] = node.data["title"]
        return dataclasses.replace(h, source_ids=src, metadata=md)

    def reassignment_ratio(self) -> float:
        """Share of semantics whose theme changed at least once during construction (Sec. 5.3, Fig. 5).

        Returns:
            A float in [0, 1] (0 when there are no semantics).
        """
        sems = [n for n in self._store.nodes.values() if n.level == SEMANTIC and not n.is_leaf]
        if not sems:
            return 0.0
        return sum(1 for n in sems if int(n.data.get("moves", 0)) > 0) / len(sems)

    def objective(self) -> float | None:
        """``f(P)`` of the current theme partition, or ``None`` without semantics.

        Returns:
            ``SparsityScore + SemScore`` (float) over the themes' semantic vectors.

        References:
            xMemory Sec. 3.2, Eq. (1)-(3).
        """
        with self._lock:
            d = self._derived()
            if not d.theme_stats:
                return None
            return self._objective_with(d, {})

    def _extra_stats(self) -> dict[str, Any]:
        st = self._store
        d = self._derived()
        themes = self._ids_at(THEME)
        sizes = sorted((len(st.nodes[t].children) for t in themes), reverse=True)
        episodes = [e for e in self._ids_at(EPISODE) if not st.nodes[e].data.get("open")]
        open_msgs = len(st.nodes[self._open].children) if self._open in st.nodes else 0
        ep_sizes = [len(st.nodes[e].children) for e in episodes]
        return {
            "episodes": len(episodes),
            "open_episode_messages": open_msgs,
            "mean_episode_messages": float(np.mean(ep_sizes)) if ep_sizes else 0.0,
            "semantics": len(d.sem_ids),
            "themes": len(themes),
            "theme_sizes": sizes,
            "mean_theme_size": float(np.mean(sizes)) if sizes else 0.0,
            "max_theme_size": max(sizes, default=0),
            "reassignment_ratio": self.reassignment_ratio(),
            "objective": self._objective_with(d, {}) if d.theme_stats else None,
            "unfiled_episodes": sum(1 for e in episodes if not st.nodes[e].data.get("semantics")),
            "counts": dict(self._counts),
        }


# =========================================================================== uncertainty
class _Uncertainty:
    """Uncertainty of the reader for one query (LLM log-probabilities or the documented proxy)."""

    def __init__(self, mem: XMemory, query: str, qvec: np.ndarray) -> None:
        self.mem = mem
        self.query = query
        self.qvec = qvec
        self.reader = mem.reader if mem.reader is not None else mem.llm
        self.mode = "logprobs" if self.reader is not None else "proxy"
        self.qwords = query_terms(query)

    def __call__(self, semantic: Sequence[int], episodic: Sequence[int]) -> float:
        if self.mode == "logprobs":
            value = self._llm(semantic, episodic)
            if value is not None:
                return value
            self.mode = "proxy"  # the reader gives no log-probabilities: use the proxy for this query
        return self._proxy([*semantic, *episodic])

    def _llm(self, semantic: Sequence[int], episodic: Sequence[int]) -> float | None:
        st = self.mem._store
        sem_txt = "\n".join(f"- {st.nodes[i].text}" for i in semantic) or "(none)"
        epi_txt = "\n\n".join(st.nodes[i].text for i in episodic) or "(none)"
        prompt = P.READER_USER.format(semantic=sem_txt, episodic=epi_txt, question=self.query)
        assert self.reader is not None
        c = self.reader.complete(
            prompt, system=P.READER_SYSTEM, max_tokens=self.mem.answer_tokens, logprobs=True
        )
        self.mem._query_usage += c.usage
        if not c.logprobs:
            return None
        return mean_nll(c.logprobs)

    def _proxy(self, nodes: Sequence[int]) -> float:
        if not nodes:
            return 1.0
        st = self.mem._store
        text = " ".join(st.nodes[i].text for i in nodes)
        cov = len(self.qwords & query_terms(text)) / len(self.qwords) if self.qwords else 0.0
        idx = self.mem._index
        assert idx is not None
        vecs = idx.get([i for i in nodes])
        maxsim = max(0.0, float((vecs @ self.qvec).max()))
        return 1.0 - 0.5 * (cov + maxsim)


# =========================================================================== parsers and checks
def _parse_boundary(text: str) -> tuple[bool, str]:
    obj = parse_json_object(text)
    b = obj.get("boundary")
    if not isinstance(b, bool):
        raise ValueError('The field "boundary" must be true or false (a JSON boolean).')
    reason = obj.get("reason", "")
    if not isinstance(reason, str):
        raise ValueError('The field "reason" must be a string.')
    return b, reason.strip()


def _parse_episode(text: str) -> dict[str, str]:
    obj = parse_json_object(text)
    out: dict[str, str] = {}
    for key in ("title", "content"):
        v = obj.get(key)
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f'The field "{key}" must be a non-empty string.')
        out[key] = v.strip()
    ts = obj.get("timestamp")
    if ts is not None:
        if not isinstance(ts, str):
            raise ValueError('The field "timestamp" must be a string in YYYY-MM-DDTHH:MM:SS format.')
        out["timestamp"] = ts.strip()
    return out


def _facts_parser(max_facts: int) -> Any:
    def parse(text: str) -> list[str]:
        obj = parse_json_object(text)
        facts = obj.get("facts")
        if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
            raise ValueError('The field "facts" must be a JSON list of strings.')
        clean = list(dict.fromkeys(f.strip() for f in facts if f.strip()))
        return clean[:max_facts]

    return parse


def _pos_int(x: Any, name: str, minimum: int = 1) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or int(x) < minimum:
        raise InvalidInputError(f"{name} must be an integer >= {minimum}, got {x!r}.")
    return int(x)


def _cosine(x: Any, name: str) -> float:
    v = check_finite(x, name)
    if not -1.0 <= v <= 1.0:
        raise InvalidInputError(f"{name} is a cosine and must be in [-1, 1], got {v}.")
    return v


def _unit_interval(x: Any, name: str) -> float:
    v = check_finite(x, name)
    if not 0.0 <= v <= 1.0:
        raise InvalidInputError(f"{name} must be in [0, 1], got {v}.")
    return v
