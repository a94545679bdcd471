"""``hiermem bench --ingest`` and ``--conversation``: workloads timed beside a baseline of the same run.

Ingest (:func:`ingest_workload`): real turns (LoCoMo conv-26 when a LoCoMo file is given, and the bundled
RealMem excerpt) are added one ``add`` per message into each memory built with its default constructor on
the embedded :class:`~shared_core.models.local.LocalEmbedder` (no LLM), against embedding the same
messages one ``embed([text])`` each with the same embedder, in the same process. One torch thread.

Conversation (:func:`conversation_run`): no model. Stub vectors are replayed
(:class:`~shared_core.bench.core.ReplayEmbedder`) and every text carries words, so the default ``"hybrid"``
relevance (dense + BM25 over node texts) scores something. Each memory (default relevance and
policy; its default summariser, the extractive one, or with ``summariser="standin"`` a free stand-in
that leaves the algorithm alone in the timing) grows to each size, then runs turns of ONE
single-message ``add`` and ONE ``retrieve(k=10)``, beside a flat FAISS ``IndexFlatIP`` add + search at
the same size. Streams: ``"topical"`` (:func:`~shared_core.bench.core.topical_stream`), ``"random"``
(each message resembles nothing before it) and ``"speaker"`` (topical, with a speaker's name in every
message and every query, :func:`conversation_stream`). All times are process CPU time (``time.process_time``)
in milliseconds.
"""

from __future__ import annotations

import functools
import json
import math
import os
import queue
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..types import InvalidInputError, Usage
from .core import (
    DIM,
    FirstTextSummarizer,
    ReplayEmbedder,
    _check_sizes,
    _memory_classes,
    _peak_rss,
    _unit,
    machine_description,
    pin_threads,
    topical_stream,
)

__all__ = [
    "SPEAKER",
    "STREAMS",
    "SUMMARISERS",
    "WORKLOADS_SCHEMA",
    "WordySpanSummarizer",
    "conversation_memory",
    "conversation_query",
    "conversation_run",
    "conversation_stream",
    "ingest_workload",
    "render_workloads_markdown",
    "run_workloads",
    "synthetic_vocabulary",
    "write_workloads",
]

WORKLOADS_SCHEMA = "hiermem.bench_workloads/1"
STREAMS = ("topical", "random", "speaker")
#: the name rendered into every message of the ``"speaker"`` stream (as ``Message.render`` does) and
#: named by every one of its queries
SPEAKER = "Caroline"
#: ``summariser`` of the conversation workload: each memory's own default, or the free stand-ins.
SUMMARISERS = ("default", "standin")
K = 10
VOCABULARY = 2_000
WORDS_PER_MESSAGE = 8
QUERY_NOISE = 0.3
GROWTH_CHUNK = 500
ANNOTATION_MODES = ("default", "composed", "embedded")

Progress = Callable[[str, int, int], None]
"""``progress(label, done, total)``: how far one task is (messages added so far of those planned)."""


# --------------------------------------------------------------------------- texts with words
def synthetic_vocabulary(n: int = VOCABULARY, seed: int = 0) -> list[str]:
    """``n`` distinct made-up words of 2-4 consonant-vowel syllables (no English stop word), seeded order."""
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aiou"]
    words: dict[str, None] = {}
    while len(words) < n:
        words[
            "".join(syllables[int(i)] for i in rng.integers(0, len(syllables), size=rng.integers(2, 5)))
        ] = None
    return list(words)


def conversation_stream(stream: str, n: int, seed: int = 0) -> tuple[list[str], dict[str, np.ndarray]]:
    """``n`` messages ``"message <i> "`` + 8 words of a 2,000-word vocabulary, with their unit vectors.

    Words follow Zipf frequencies (rank r drawn with probability proportional to 1 / r), independent of
    the vectors: they give BM25 realistic posting lists to score, not meaning. Every message holds the
    word "message", which no query holds; the ``"speaker"`` stream renders a speaker's name into every
    message as :meth:`~shared_core.types.Message.render` does (``"Caroline: message <i> ..."``) and its
    queries name the speaker (:func:`conversation_query`): a word of every message that every query
    holds, as in a chat log whose questions name its speakers.

    Args:
        stream: ``"topical"`` (vectors of :func:`~shared_core.bench.core.topical_stream`), ``"random"``
            (independent random unit vectors) or ``"speaker"`` (the topical vectors, the speaker's name
            in every text). n: number of messages. seed: random seed, default 0.

    Returns:
        ``(texts, table)``: the texts in order and ``{text: float32 unit vector (384,)}``.

    Raises:
        InvalidInputError: an unknown stream.
    """
    if stream not in STREAMS:
        raise InvalidInputError(f"Unknown stream {stream!r}; choose from {', '.join(STREAMS)}.")
    rng = np.random.default_rng(seed + 7)
    if stream in ("topical", "speaker"):
        keys, base = topical_stream(n, seed)
        X = np.stack([base.pop(t) for t in keys]) if n else np.zeros((0, DIM), np.float32)
    else:
        X = rng.standard_normal((n, DIM)).astype(np.float32)
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    vocab = np.array(synthetic_vocabulary(VOCABULARY))  # fixed; the draws follow the seed
    p = 1.0 / np.arange(1, len(vocab) + 1)
    picks = rng.choice(len(vocab), size=(n, WORDS_PER_MESSAGE), p=p / p.sum())
    name = f"{SPEAKER}: " if stream == "speaker" else ""
    texts = [f"{name}message {i} " + " ".join(vocab[picks[i]]) for i in range(n)]
    return texts, dict(zip(texts, X))


@functools.lru_cache(maxsize=1)
def _vocabulary_rank() -> dict[str, int]:
    return {w: i for i, w in enumerate(synthetic_vocabulary(VOCABULARY))}


def _words(text: str) -> list[str]:
    parts = text.split()
    return parts[3:] if parts[:1] == [f"{SPEAKER}:"] else parts[2:]  # without "[<speaker>:] message <i>"


class WordySpanSummarizer:
    """A free aggregate with words: ``"summary <n> "`` + the first 8 words of the first and last child.

    Its vector is the normalised sum of the first and last child's vectors, registered in the embedder's
    table (as :class:`~shared_core.bench.core.SpanEndsSummarizer` does, whose texts have no words for BM25).
    Only the ``keep`` most recently used summaries (default 200,000) stay in the table.
    """

    def __init__(self, embedder: ReplayEmbedder, keep: int = 200_000) -> None:
        self.embedder = embedder
        self.keep = int(keep)
        self.n = 0
        self._recent: OrderedDict[str, None] = OrderedDict()

    def summarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """``("summary <n> <words>", Usage())``, the summary's vector registered in the table."""
        first, last = texts[0], texts[-1]
        v = self.embedder.vector(first) + self.embedder.vector(last)
        for t in (first, last):
            if t in self._recent:
                self._recent.move_to_end(t)
        self.n += 1
        key = f"summary {self.n} " + " ".join(_words(first)[:8] + _words(last)[:8])
        norm = float(np.linalg.norm(v))
        self.embedder.table[key] = (v / norm if norm > 0 else v).astype(np.float32)
        self._recent[key] = None
        while len(self._recent) > self.keep:
            self.embedder.table.pop(self._recent.popitem(last=False)[0], None)
        return key, Usage()

    async def asummarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """Async :meth:`summarize`."""
        return self.summarize(texts)


def _check_summariser(summariser: str) -> str:
    if summariser not in SUMMARISERS:
        raise InvalidInputError(f"summariser must be one of {', '.join(SUMMARISERS)}, got {summariser!r}.")
    return summariser


def conversation_memory(kind: str, embedder: ReplayEmbedder, summariser: str = "standin") -> Any:
    """A memory of ``kind`` on stub models with its DEFAULT relevance and policy (no LLM).

    Args:
        kind: the memory kind. embedder: the stub embedder.
        summariser: ``"standin"`` (default here, for callers of this helper): SegTreeMem, HAT and
            xMemory summarise with :class:`WordySpanSummarizer`, MemTree with
            :class:`~shared_core.bench.core.FirstTextSummarizer` (the algorithm's cost alone); ``"default"``:
            the memory's own default summariser (the extractive one without an LLM) on ``embedder``.

    Raises:
        InvalidInputError: an unknown kind or summariser.
    """
    classes = _memory_classes()
    if kind not in classes:
        raise InvalidInputError(f"Unknown memory {kind!r}; available: {', '.join(classes)}.")
    if _check_summariser(summariser) == "default":
        return classes[kind](embedder=embedder)
    summarizer = FirstTextSummarizer() if kind == "memtree" else WordySpanSummarizer(embedder)
    return classes[kind](embedder=embedder, summarizer=summarizer)


# --------------------------------------------------------------------------- conversation at scale
def _pct(ms: Sequence[float]) -> dict[str, float]:
    p50, p99 = np.percentile(np.asarray(ms, dtype=np.float64), [50, 99])
    return {"p50_ms": float(p50), "p99_ms": float(p99), "mean_ms": float(np.mean(ms))}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def _check_window(sizes: Sequence[int], window: int) -> tuple[list[int], int]:
    out = _check_sizes(sizes)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise InvalidInputError(f"window must be a positive integer, got {window!r}.")
    if any(b - a < window for a, b in zip(out, out[1:])):
        raise InvalidInputError(f"sizes must be at least window = {window} apart, got {out}.")
    return out, int(window)


def _kinds(memories: Sequence[str] | None) -> list[str]:
    available = _memory_classes()
    kinds = list(available) if memories is None else [str(m).strip().lower() for m in memories]
    unknown = [k for k in kinds if k not in available]
    if unknown or not kinds:
        msg = f"Unknown memory {', '.join(unknown) or '(none)'}; choose from {', '.join(available)}."
        raise InvalidInputError(msg)
    return kinds


def conversation_query(
    rng: np.random.Generator, table: dict[str, np.ndarray], texts: Sequence[str], stored: int, tag: str
) -> str:
    """A query near a random one of the first ``stored`` messages, registered in the table.

    Its vector is the message's + 0.3 x a random unit vector (normalised); its text
    ``"query <tag> "`` + 4 of the message's words + 2 words of another stored message. When the message
    names a speaker (the ``"speaker"`` stream) the query is a question about what the speaker said:
    ``"query <tag> <speaker> "`` + the message's 3 least frequent words (the Zipf ranks of the
    vocabulary), as "What did Caroline say about pottery?" names the speaker and a specific word.

    Returns:
        The query text (a key of ``table``).
    """
    target, other = texts[int(rng.integers(0, stored))], texts[int(rng.integers(0, stored))]
    v = table[target] + QUERY_NOISE * _unit(rng)
    words = _words(target)[:4] + [str(w) for w in rng.choice(_words(other), 2)]
    if target.startswith(f"{SPEAKER}: "):
        rank = _vocabulary_rank()
        words = [SPEAKER] + sorted(set(_words(target)), key=lambda w: (-rank.get(w, -1), w))[:3]
    text = f"query {tag} " + " ".join(words)
    table[text] = (v / np.linalg.norm(v)).astype(np.float32)
    return text


def conversation_run(
    kind: str,
    stream: str,
    sizes: Sequence[int],
    *,
    window: int = 100,
    seed: int = 0,
    summariser: str = "default",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """One memory on one stream: grow to each size, run ``window`` timed turns, then the flat baseline.

    Growth uses batched adds of 500 messages (untimed) but for the last ``window`` messages before each
    size, added one ``add`` each back to back and timed (``"insert"``: the insert overhead, as the
    overhead benchmark measures it, without a query between). A turn is ``add(one message)`` then
    ``retrieve(query, k=10)`` with the default policy and relevance, after one untimed retrieve per size.
    The flat baseline starts from the same ``S`` vectors and runs the same turns: embed + FAISS ``add`` of
    the message, embed + ``search`` of the query. BLAS/FAISS are pinned to one thread.

    Args:
        kind: the memory kind. stream: ``"topical"``, ``"random"`` or ``"speaker"``. sizes: leaves
            when a window starts (>= 20, at least ``window`` apart). window: timed turns per size,
            default 100. seed: stream seed. summariser: ``"default"`` (default: the memory's own) or
            ``"standin"`` (free stand-ins), see :func:`conversation_memory`. progress:
            ``progress(label, done, total)`` in messages added.

    Returns:
        ``{"memory", "stream", "summariser", "policy", "relevance", "peak_rss_bytes", "sizes": [{"leaves",
        "leaves_after", "nodes", "turns", "adds_grown_by_one", "grow_cpu_s", "insert", "mean_hits", "memory":
        {"turn", "add", "query"}, "flat": {"turn", "add", "query"}, "ratio_p50": {"turn", "add",
        "query"}, "ratio_p99": {...}}]}``; each timing is ``{"p50_ms", "p99_ms", "mean_ms"}`` of CPU ms per
        turn and each ratio is the memory's ``p50_ms`` (``p99_ms``) over the flat one's.

    Raises:
        InvalidInputError: bad sizes, window, kind, stream or summariser.
    """
    import faiss

    sizes, window = _check_window(sizes, window)
    _check_summariser(summariser)
    say = progress or (lambda label, done, total: None)
    label, total = f"conversation {kind} {stream}", sizes[-1] + window
    limiter = pin_threads()
    try:
        texts, table = conversation_stream(stream, total, seed)
        emb = ReplayEmbedder(table)
        mem = conversation_memory(kind, emb, summariser)
        rng = np.random.default_rng(seed + 1)
        out: dict[str, Any] = {"memory": kind, "stream": stream, "summariser": summariser}
        out["policy"] = mem.default_policy
        out.update(relevance=mem.relevance_kind, sizes=[])
        n = 0
        for S in sizes:
            c0 = time.process_time()
            while n < S - window:
                step = min(GROWTH_CHUNK, S - window - n)
                mem.add(texts[n : n + step], allow_duplicate_ids=True)
                n += step
                say(label, n, total)
            ins: list[float] = []
            while n < S:  # the last messages one add each, back to back: the insert overhead
                c1 = time.process_time()
                mem.add(texts[n], allow_duplicate_ids=True)
                ins.append((time.process_time() - c1) * 1e3)
                n += 1
            say(label, n, total)
            grow_cpu, start = time.process_time() - c0, len(mem)
            mem.retrieve(conversation_query(rng, table, texts, n, f"{S}:warm"), k=K)
            qs: list[str] = []
            m_add: list[float] = []
            m_q: list[float] = []
            hits = grown = 0
            for i in range(window):
                qs.append(conversation_query(rng, table, texts, n + 1, f"{S}:{i}"))
                before = len(mem)
                c0 = time.process_time()
                mem.add(texts[n], allow_duplicate_ids=True)
                c1 = time.process_time()
                hits += len(mem.retrieve(qs[-1], k=K))
                c2 = time.process_time()
                grown += int(len(mem) == before + 1)
                m_add.append((c1 - c0) * 1e3)
                m_q.append((c2 - c1) * 1e3)
                n += 1
            say(label, n, total)
            index = faiss.IndexFlatIP(DIM)
            index.add(np.stack([table[t] for t in texts[:S]]))
            f_add: list[float] = []
            f_q: list[float] = []
            for i, q in enumerate(qs):
                c0 = time.process_time()
                index.add(emb.embed([texts[S + i]]))
                c1 = time.process_time()
                index.search(emb.embed([q]), K)
                c2 = time.process_time()
                f_add.append((c1 - c0) * 1e3)
                f_q.append((c2 - c1) * 1e3)
            mine = {"turn": _pct(np.add(m_add, m_q)), "add": _pct(m_add), "query": _pct(m_q)}
            flat = {"turn": _pct(np.add(f_add, f_q)), "add": _pct(f_add), "query": _pct(f_q)}
            out["sizes"].append(
                {
                    "leaves": start,
                    "leaves_after": len(mem),
                    "nodes": mem.stats().get("nodes"),
                    "turns": len(m_add),
                    "adds_grown_by_one": grown,
                    "grow_cpu_s": grow_cpu,
                    "insert": _pct(ins),
                    "mean_hits": hits / window,
                    "memory": mine,
                    "flat": flat,
                    "ratio_p50": {p: _ratio(mine[p]["p50_ms"], flat[p]["p50_ms"]) for p in mine},
                    "ratio_p99": {p: _ratio(mine[p]["p99_ms"], flat[p]["p99_ms"]) for p in mine},
                }
            )
            del index
        out["peak_rss_bytes"] = _peak_rss()
        return out
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def _conversation_plan(
    sizes: Sequence[int],
    memories: Sequence[str] | None,
    streams: Sequence[str],
    window: int,
    seed: int,
    size_caps: dict[str, int] | None,
    summariser: str = "default",
) -> dict[str, Any]:
    """The checked settings of a conversation run and its empty results."""
    _check_summariser(summariser)
    sizes, window = _check_window(sizes, window)
    kinds = _kinds(memories)
    streams = [str(s).strip().lower() for s in streams]
    if not streams or [s for s in streams if s not in STREAMS]:
        raise InvalidInputError(f"Unknown stream in {streams!r}; choose from {', '.join(STREAMS)}.")
    caps = {str(k).lower(): int(v) for k, v in (size_caps or {}).items()}
    if [k for k in caps if k not in kinds]:
        raise InvalidInputError(f"size cap for {', '.join(k for k in caps if k not in kinds)}, not run here.")
    settings = {"sizes": sizes, "memories": kinds, "streams": streams, "window": window, "k": K, "dim": DIM}
    settings.update(seed=seed, size_caps=caps, growth_chunk=GROWTH_CHUNK)
    settings["text"] = f"'message <i> ' + {WORDS_PER_MESSAGE} words, {VOCABULARY}-word vocabulary, Zipf"
    settings["query"] = (
        f"stored message's vector + {QUERY_NOISE} x unit noise; 4 of its words + 2 others "
        f"(+ the speaker's name on the speaker stream, whose every message holds '{SPEAKER}:')"
    )
    settings["summariser"] = summariser
    settings["summaries"] = (
        "each memory's default (extractive, no LLM)"
        if summariser == "default"
        else "stand-ins, algorithm only: WordySpanSummarizer (segtree, hat, xmemory), "
        "FirstTextSummarizer (memtree)"
    )
    return {"settings": settings, "not_run": [], "results": {}}


# --------------------------------------------------------------------------- embedded ingest
def _cpu_each(fn: Callable[[Any], Any], items: Sequence[Any], tick: Callable[[int], None]) -> float:
    """Mean process-CPU ms of ``fn(item)`` over ``items``; ``tick(done)`` after each, outside the timing."""
    total = 0.0
    for i, x in enumerate(items):
        c0 = time.process_time()
        fn(x)
        total += time.process_time() - c0
        tick(i + 1)
    return total * 1e3 / len(items)


def _check_ingest(
    memories: Sequence[str] | None, turns: int, modes: Sequence[str]
) -> tuple[list[str], list[str]]:
    if isinstance(turns, bool) or not isinstance(turns, (int, np.integer)) or turns < 1:
        raise InvalidInputError(f"turns must be a positive integer, got {turns!r}.")
    out = [str(m).strip().lower() for m in modes]
    if not out or [m for m in out if m not in ANNOTATION_MODES]:
        raise InvalidInputError(f"modes must be among {', '.join(ANNOTATION_MODES)}, got {list(modes)!r}.")
    return _kinds(memories), out


def _datasets(turns: int, locomo: str | Path | None, excerpt: bool) -> list[tuple[str, str, list[Any]]]:
    from ..eval.data import load_locomo, load_realmem_excerpt

    out = []
    if locomo is not None:
        convs = load_locomo(locomo)
        if not convs:
            raise InvalidInputError(f"{locomo} holds no conversation.")
        conv = next((c for c in convs if c.id == "conv-26"), convs[0])
        out.append((f"locomo {conv.id}", conv.id, conv.messages[:turns]))
    if excerpt or not out:
        ex = load_realmem_excerpt()
        out.append(("realmem excerpt", ex.id, ex.messages[:turns]))
    return out


def ingest_workload(
    memories: Sequence[str] | None = None,
    *,
    turns: int = 200,
    locomo: str | Path | None = None,
    modes: Sequence[str] = ("default",),
    realmem_excerpt: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """CPU per message of one ``add`` per real message, as a multiple of embedding the message alone.

    Args:
        memories: kinds, default every available one. turns: first turns of each conversation (>= 1),
            default 200. locomo: a LoCoMo JSON file (conv-26 is used, else the first conversation);
            the bundled RealMem excerpt is measured too unless ``realmem_excerpt=False`` (or without
            ``locomo``). modes: ``annotation_vectors`` runs among ``"default"`` (the constructor without
            options), ``"composed"`` and ``"embedded"``; a mode equal to the class default runs once,
            flagged ``"default": true``.
        progress: ``progress(label, done, total)`` in messages.

    Returns:
        ``{"settings", "datasets": {name: {"conversation", "turns", "mean_chars", "results": {kind:
        {mode: {"default", "cpu_ms_per_message", "embed_cpu_ms_per_message", "ratio",
        "embedded_texts_per_message", "embed_calls_per_message", "leaves"}}}}}}`` with ``ratio =
        cpu_ms_per_message / embed_cpu_ms_per_message``, the embedding alone measured just before the run.

    Raises:
        InvalidInputError: ``turns`` < 1, an unknown memory or mode, an unreadable LoCoMo file.
    """
    kinds, modes = _check_ingest(memories, turns, modes)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from ..models.local import LocalEmbedder

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = _datasets(int(turns), locomo, realmem_excerpt)
        emb = LocalEmbedder()
        emb.embed(["warm-up"])
        classes = _memory_classes()
        say = progress or (lambda label, done, total: None)
        settings = {"turns": int(turns), "memories": kinds, "modes": modes, "embedder": emb.name}
        settings.update(torch_threads=torch.get_num_threads(), add="one add per message")
        settings["baseline"] = "embed([message.render()]) per message, same embedder, before each run"
        doc: dict[str, Any] = {"settings": settings, "datasets": {}}
        for name, conv_id, msgs in data:
            texts, n = [[m.render()] for m in msgs], len(msgs)
            ds: dict[str, Any] = {"conversation": conv_id, "turns": n, "results": {}}
            ds["mean_chars"] = sum(len(t[0]) for t in texts) / n
            doc["datasets"][name] = ds
            for kind in kinds:
                cls = classes[kind]
                default = str(cls.default_annotation_vectors)
                cls(embedder=emb).add(
                    msgs[:3], allow_duplicate_ids=True
                )  # untimed warm-up of the code paths and lazy imports
                for mode in dict.fromkeys(default if m == "default" else m for m in modes):
                    label = f"ingest {name}: {kind} ({mode})"
                    base = _cpu_each(emb.embed, texts, lambda i, lb=label, n=n: say(lb, i, 2 * n))
                    mem = cls(embedder=emb) if mode == default else cls(embedder=emb, annotation_vectors=mode)
                    cpu = _cpu_each(
                        partial(mem.add, allow_duplicate_ids=True),
                        msgs,
                        lambda i, lb=label, n=n: say(lb, n + i, 2 * n),
                    )
                    u = mem.usage
                    ds["results"].setdefault(kind, {})[mode] = {
                        "default": mode == default,
                        "cpu_ms_per_message": cpu,
                        "embed_cpu_ms_per_message": base,
                        "ratio": _ratio(cpu, base),
                        "embedded_texts_per_message": u.embedded_texts / n,
                        "embed_calls_per_message": u.embed_calls / n,
                        "leaves": len(mem),
                    }
        return doc
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- processes and the run
_CHILD_QUEUE: Any = None


def _child_init(q: Any) -> None:
    global _CHILD_QUEUE
    _CHILD_QUEUE = q


def _child_call(fn: Callable[..., Any], args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    q = _CHILD_QUEUE
    return fn(*args, progress=(lambda *ev: q.put(ev)) if q is not None else None, **kw)


def _call(fn: Callable[..., Any], isolate: bool, progress: Progress | None, *args: Any, **kw: Any) -> Any:
    """``fn(*args, progress=progress, **kw)``, in a fresh spawned process when ``isolate`` (its progress
    events come back through a queue)."""
    if not isolate:
        return fn(*args, progress=progress, **kw)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_child_init, initargs=(q,)) as ex:
        fut = ex.submit(_child_call, fn, args, kw)
        while True:
            try:
                ev = q.get(timeout=0.2)
            except queue.Empty:
                if fut.done():
                    break
                continue
            if progress is not None:
                progress(*ev)
        return fut.result()


def run_workloads(
    *,
    conversation: bool = False,
    ingest: bool = False,
    sizes: Sequence[int] = (1_000, 10_000),
    memories: Sequence[str] | None = None,
    streams: Sequence[str] = STREAMS,
    window: int = 100,
    seed: int = 0,
    size_caps: dict[str, int] | None = None,
    summariser: str = "default",
    turns: int = 200,
    locomo: str | Path | None = None,
    modes: Sequence[str] = ("default",),
    isolate: bool = True,
    out: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the requested workloads into one document, written to ``out`` when given.

    Conversation: :func:`conversation_run` for every memory and stream, each in a fresh process when
    ``isolate`` (clean peak RSS); sizes above a memory's ``size_caps`` entry are listed in ``not_run``.
    Ingest: :func:`ingest_workload`, in one fresh process when ``isolate``. Every option is checked
    before anything runs.

    Args:
        conversation, ingest: the workloads to run (at least one). sizes, memories, streams, window, seed,
            size_caps, summariser: of the conversation (``window`` = timed turns per size, default 100;
            ``summariser`` ``"default"`` or ``"standin"``, see :func:`conversation_memory`). turns,
            locomo, modes: of the ingest (see :func:`ingest_workload`). memories also selects the ingest's.
        isolate: fresh processes, default ``True``. out: directory for ``workloads.json`` and
            ``workloads.md``. progress: ``progress(label, done, total)``.

    Returns:
        ``{"schema", "machine": {"start", "end"}, "conversation": {"settings", "not_run", "results":
        {kind: {stream: conversation_run(...)}}}, "ingest": ingest_workload(...), "seconds"}`` (each
        workload only when run; ``seconds`` of wall time).

    Raises:
        InvalidInputError: no workload requested, or a bad option.
    """
    if not (conversation or ingest):
        raise InvalidInputError("Choose at least one workload: conversation and/or ingest.")
    conv = (
        _conversation_plan(sizes, memories, streams, window, seed, size_caps, summariser)
        if conversation
        else None
    )
    if ingest:
        _check_ingest(memories, turns, modes)
    t0 = time.perf_counter()
    doc: dict[str, Any] = {"schema": WORKLOADS_SCHEMA, "machine": {"start": machine_description()}}
    if conv is not None:
        doc["conversation"] = conv
        st = conv["settings"]
        for kind in st["memories"]:
            run_sizes = [s for s in st["sizes"] if s <= st["size_caps"].get(kind, s)]
            left_out = [s for s in st["sizes"] if s not in run_sizes]
            conv["not_run"] += [{"memory": kind, "leaves": s, "reason": "size cap"} for s in left_out]
            for stream in st["streams"] if run_sizes else ():
                kw = {"window": st["window"], "seed": seed, "summariser": summariser}
                r = _call(conversation_run, isolate, progress, kind, stream, run_sizes, **kw)
                conv["results"].setdefault(kind, {})[stream] = r
                if out is not None:  # partial results survive an interrupted run
                    doc["machine"]["end"] = machine_description()
                    write_workloads(doc, out)
    if ingest:
        kw = {"turns": turns, "locomo": locomo, "modes": modes}
        doc["ingest"] = _call(ingest_workload, isolate, progress, memories, **kw)
    doc["machine"]["end"] = machine_description()
    doc["seconds"] = time.perf_counter() - t0
    if out is not None:
        write_workloads(doc, out)
    return doc


# --------------------------------------------------------------------------- reports
CONVERSATION_HEADER = (
    "memory|stream|leaves|nodes|insert p50|insert p99|turn p50|turn p99|add p50|add p99|query p50|query p99|"
    "flat turn p50|flat turn p99|turn / flat (p50)|turn / flat (p99)|add / flat|query / flat"
)
INGEST_HEADER = (
    "data|memory|annotation vectors|CPU ms/msg|embedding alone ms/msg|x embedding|texts embedded/msg|"
    "embed calls/msg"
)


def _f(v: Any, d: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:,.{d}f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def conversation_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Rows under :data:`CONVERSATION_HEADER` (CPU ms; ratios of p50s, and of the turn's p99s)."""
    rows = []
    for kind, by_stream in doc.get("conversation", {}).get("results", {}).items():
        for stream, r in by_stream.items():
            for s in r["sizes"]:
                m, f, q = s["memory"], s["flat"], s["ratio_p50"]
                rows.append(
                    [kind, stream, _f(s["leaves"]), _f(s["nodes"])]
                    + [_f(s.get("insert", {}).get(x)) for x in ("p50_ms", "p99_ms")]
                    + [_f(m[p][x]) for p in ("turn", "add", "query") for x in ("p50_ms", "p99_ms")]
                    + [_f(f["turn"]["p50_ms"]), _f(f["turn"]["p99_ms"])]
                    + [_f(q["turn"], 1), _f(s.get("ratio_p99", {}).get("turn"), 1)]
                    + [_f(q[p], 1) for p in ("add", "query")]
                )
    return rows


def ingest_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Rows under :data:`INGEST_HEADER` (``*`` marks the memory's default annotation vectors)."""
    keys = ("cpu_ms_per_message", "embed_cpu_ms_per_message", "ratio")
    keys += ("embedded_texts_per_message", "embed_calls_per_message")
    rows = []
    for name, ds in doc.get("ingest", {}).get("datasets", {}).items():
        for kind, by_mode in ds["results"].items():
            for mode, v in by_mode.items():
                rows.append([name, kind, mode + (" *" if v["default"] else "")] + [_f(v[x], 2) for x in keys])
    return rows


def _md_table(header: str, rows: list[list[str]], left: int) -> list[str]:
    cols = header.split("|")
    rule = "|" + "|".join("---" if i < left else "---:" for i in range(len(cols))) + "|"
    return ["| " + " | ".join(cols) + " |", rule] + ["| " + " | ".join(r) + " |" for r in rows]


def render_workloads_markdown(doc: dict[str, Any]) -> str:
    """Markdown of a workloads document: the machine, then one table per workload run."""
    m0 = doc["machine"]["start"]
    m1 = doc["machine"].get("end", m0)
    lines = [
        "# hiermem bench workloads",
        "",
        f"Machine: {m0.get('cpu_model')}, {m0.get('logical_cpus')} logical CPUs, {m0.get('memory_gib')} GiB; "
        f"load average {m0.get('load_average_1_5_15')} at the start and {m1.get('load_average_1_5_15')} "
        "at the end (1/5/15 min). All times are process CPU time.",
    ]
    conv = doc.get("conversation")
    if conv:
        st = conv["settings"]
        lines += [
            "",
            f"## A conversation at scale (CPU ms per turn; {st['window']} turns per size, k = {st['k']})",
            "",
            "Each turn: one `add` of one message and one `retrieve` with the memory's default policy and "
            "relevance, on stub models (replayed vectors, texts with words). Flat: FAISS `IndexFlatIP` add + "
            "search at the same size. Ratios are p50 memory / p50 flat (and p99 / p99 for the turn). "
            "Insert: the last messages before "
            "each size, one `add` each back to back (no query between). Summaries: "
            f"{st.get('summaries', 'stand-ins')}.",
            "",
            *_md_table(CONVERSATION_HEADER, conversation_rows(doc), 2),
        ]
        if conv.get("not_run"):
            skipped = "; ".join(f"{x['memory']} at {x['leaves']} ({x['reason']})" for x in conv["not_run"])
            lines += ["", f"Not run: {skipped}."]
    ing = doc.get("ingest")
    if ing:
        st = ing["settings"]
        lines += [
            "",
            f"## Embedded ingest ({st['embedder']}, no LLM, one add per message, "
            f"{st['torch_threads']} torch thread)",
            "",
            "x embedding = CPU per message / CPU of `embed([message])` alone (measured just before the run). "
            "`*` = the memory's default (constructor without options).",
            "",
            *_md_table(INGEST_HEADER, ingest_rows(doc), 3),
        ]
    return "\n".join(lines) + "\n"


def write_workloads(doc: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write ``workloads.json`` and ``workloads.md`` into ``out_dir`` (created when missing).

    Returns:
        The file names written.
    """
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = {"json": "workloads.json", "markdown": "workloads.md"}
    doc["files"] = files
    (d / files["markdown"]).write_text(render_workloads_markdown(doc), encoding="utf-8")
    (d / files["json"]).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return files
