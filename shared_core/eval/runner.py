"""Evaluation orchestration behind ``hiermem eval``: every method on the same conversations, online.

For each conversation one object is built per *build* (a memory with its options, or a flat baseline)
and fed the messages in arrival order; every retrieval policy of that build is asked each query at the
query's position, so ``segtree:top_down`` and ``segtree:bottom_up`` share one ``segtree`` tree. Per query:
leaf-level evidence recall@k, span recall, answer-token recall, returned tokens and retrieval latency
(wall and CPU); per build: construction cost (embedding calls, LLM calls, tokens, seconds) per message.
With an LLM, an :class:`~shared_core.eval.judge.AnswerJudge` writes an answer from the hits and grades
it. Results are written per conversation (so a run can resume) and aggregated into one JSON document,
a Markdown table and a PNG chart (:mod:`shared_core.eval.report`).

This module holds the online loop (:func:`evaluate_conversation`) and the run (:func:`run_eval`). The
embedding cache shared by every method of a conversation (:class:`CachingEmbedder`) lives in
:mod:`shared_core.eval.embed_cache`, LongMemEval's loader and metrics in :mod:`shared_core.eval.longmemeval`,
the inputs (:class:`Dataset`, :func:`load_datasets`) in :mod:`shared_core.eval.inputs`, the aggregation
(:func:`aggregate_results`) in :mod:`shared_core.eval.aggregate`; method specs (``--methods``:
:class:`MethodSpec`, :func:`parse_methods`, the flat baselines, :func:`reference_spec`, :func:`memory_facts`,
:func:`with_references`) in :mod:`shared_core.eval.methods`; the comparison of the memories with the
flat baselines (:func:`compare_methods`: margin over the best counted flat baseline, tree share =
the tree policy (e.g. ``top_down``) minus ``collapsed``, corpus share = ``collapsed`` minus the flat
reference) in :mod:`shared_core.eval.compare`; the named splits, the per-query JSON lines and the paired
bootstrap in :mod:`shared_core.eval.protocol`. Their public names are re-exported here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import platform
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from datetime import time as dt_time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..search.relevance import check_weight
from ..types import InvalidInputError, Usage, parse_timestamp
from .aggregate import LLM_METRICS, QUERY_METRICS, aggregate_results, pooled
from .compare import COMPARED_METRICS, _build_facts, _nan_to_none, compare_methods
from .data import Conversation, add_turns
from .embed_cache import CachingEmbedder
from .inputs import Dataset, load_datasets
from .longmemeval import LME_METRICS, question_metrics
from .methods import (
    BASELINES,
    COUNTED_BASELINES,
    DEFAULT_BASELINES,
    MethodSpec,
    _instance_facts,
    _make_build,
    available_memories,
    memory_facts,
    parse_methods,
    reference_spec,
    with_references,
)
from .metrics import (
    RENDERS,
    answer_token_recall,
    contained_recall,
    count_tokens,
    evidence_recall,
    message_sentences,
    render_returned,
)
from .parallel import EvalJob, default_workers, evaluate_all
from .progress_bars import question_progress
from .protocol import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    DEV_FUSION_WEIGHT,
    QUERY_ROWS_JSONL,
    SPLITS,
    SplitDataMissingError,
    paired_bootstrap,
    resolve_split,
    write_query_rows,
)

__all__ = [
    "ADD_BATCH_MODES",
    "BASELINES",
    "COMPARED_METRICS",
    "COUNTED_BASELINES",
    "DEFAULT_BASELINES",
    "LLM_METRICS",
    "QUERY_METRICS",
    "SCHEMA",
    "SPLITS",
    "CachingEmbedder",
    "Dataset",
    "MethodSpec",
    "SplitDataMissingError",
    "aggregate_results",
    "available_memories",
    "compare_methods",
    "evaluate_conversation",
    "load_datasets",
    "memory_facts",
    "paired_bootstrap",
    "parse_methods",
    "reference_spec",
    "resolve_split",
    "run_eval",
    "with_references",
]

SCHEMA = "hiermem.eval/3"
"""Identifier of the results document's layout (``results["schema"]``). Version 3: ``tree_share`` is the
memory's tree policy (``tree``, e.g. ``top_down``) minus its ``collapsed`` policy, whatever the default
(version 2: the default minus ``collapsed``; version 1: the default minus the flat reference); version 2
added ``corpus_share``, ``ci95`` intervals, ``fusion_weights`` and the ``split`` in the configuration."""

WARMUP_QUERY = "what was said"
"""Query asked (untimed as latency) by every build after new messages, so that index maintenance a method
defers to its next query (e.g. a BM25 rebuild) is counted as construction, not as the latency of
whichever method happens to be asked first."""

ADD_BATCH_MODES = ("session", "query", "message")
"""How messages are grouped into ``add`` calls: one call per session (never across a query), one per
stretch between queries, or one per message."""


# --------------------------------------------------------------------------- data
# --------------------------------------------------------------------------- one conversation
def _batches(conv: Conversation, end: int, mode: str) -> list[tuple[int, int]]:
    """Consecutive ``[start, stop)`` add batches covering messages ``0..end`` without crossing a query; a
    conversation marked ``meta["bulk"]`` (a LongMemEval question's haystack) is cut at queries only in the
    ``session`` mode (one bulk ``add`` per method)."""
    cuts = {0, end}
    cuts.update(q.position for q in conv.queries if 0 < q.position < end)
    if mode == "message":
        cuts.update(range(end))
    elif mode == "session" and not conv.meta.get("bulk"):
        prev = None
        for i, m in enumerate(conv.messages[:end]):
            key = m.metadata.get("session", m.timestamp)
            if i and key != prev:
                cuts.add(i)
            prev = key
    edges = sorted(cuts)
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _usage_of(obj: Any) -> Usage:
    u = getattr(obj, "usage", None)
    return u.copy() if isinstance(u, Usage) else Usage()


_STAT_KEYS = ("nodes", "leaves", "internal_nodes", "max_depth", "mean_depth", "mean_branching", "height")


def evaluate_conversation(
    conv: Conversation,
    specs: Sequence[MethodSpec],
    *,
    embedder: Any,
    k: int = 10,
    max_tokens: int | None = None,
    max_queries: int | None = None,
    add_batch: str = "session",
    memory_llm: Any = None,
    judge: Any = None,
    dataset: str = "",
    progress: Any = None,
    render: str = "plain",
) -> dict[str, Any]:
    """Evaluate every method on one conversation, online, one object per build.

    Messages are added in arrival order in batches (``add_batch``) that never cross a query position,
    to every build; after new messages each build answers one untimed :data:`WARMUP_QUERY` (with its
    ``collapsed`` policy when it has one), whose time is counted as construction ("refresh"), so that
    index work deferred to the next query is not charged to whichever policy is asked first; then at a
    query's position every method (build + policy) retrieves ``k`` hits (within ``max_tokens`` when
    given). Per query and method:

    * ``evidence_recall``: share of the evidence ids carried by the *leaf* hits (a summary node counts
      for nothing here) — recall@k at leaf level;
    * ``span_recall``: share of evidence ids whose message a hit's text shows
      (:func:`~shared_core.eval.metrics.contained_recall`: a leaf its own message, a summary the
      messages below it or drawn on that it quotes a sentence of, verbatim);
    * ``subtree_recall``: share of evidence ids carried by some leaf under some hit, whether or not its
      text shows them (a summary is credited with its whole span; reported, not compared);
    * ``answer_token_recall``: share of the gold answer's content words in the joined hit texts, as
      rendered by ``render``;
    * ``returned_tokens`` (:func:`~shared_core.eval.metrics.count_tokens`), ``n_hits``, ``leaf_hits``;
    * ``latency_ms`` / ``latency_cpu_ms``: wall-clock and process CPU milliseconds of ``retrieve``;
    * with ``judge``: ``answer``, ``llm_accuracy`` (the 0/1 verdict or None), ``rouge_l_recall``.

    Args:
        conv: the conversation.
        specs: the methods (from :func:`parse_methods`).
        embedder: the embedder shared by every method (a :class:`CachingEmbedder` is primed with the
            messages and questions).
        k: hits per query, default 10.
        max_tokens: optional returned-token budget per query.
        max_queries: evaluate only the first N queries (by position), default all.
        add_batch: one of :data:`ADD_BATCH_MODES`, default ``"session"``.
        memory_llm: LLM given to the memories (``None``: LLM-free memories).
        judge: an :class:`~shared_core.eval.judge.AnswerJudge`, or ``None``.
        dataset: the dataset label written into each row.
        progress: an object with ``update(n)`` (e.g. a tqdm bar), advanced by one after each query, or
            ``None``.
        render: one of :data:`~shared_core.eval.metrics.RENDERS` (how returned texts are scored, for
            every method alike; ``"dated"`` prefixes message leaves with their date), default
            ``"plain"``. The ``max_tokens`` budget applies to the texts as stored.

    Returns:
        ``{"conversation", "dataset", "data": {...}, "builds": {build: construction}, "methods":
        {name: {"queries": [rows]}}}`` (plain data, NaN as None); a memory build's construction also
        holds ``"memory"``: its ``default_policy``, ``relevance`` and ``hybrid_weight`` as built.

    Raises:
        InvalidInputError: bad ``k`` / ``max_tokens`` / ``add_batch``, or a query position outside the
            conversation.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
    if max_tokens is not None and (isinstance(max_tokens, bool) or int(max_tokens) < 1):
        raise InvalidInputError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    if add_batch not in ADD_BATCH_MODES:
        raise InvalidInputError(f"add_batch must be one of {ADD_BATCH_MODES}, got {add_batch!r}.")
    if not specs:
        raise InvalidInputError("No methods to evaluate.")
    if render not in RENDERS:
        raise InvalidInputError(f"render must be one of {', '.join(RENDERS)}, got {render!r}.")
    queries = sorted(conv.queries, key=lambda q: q.position)
    if max_queries is not None:
        queries = queries[: int(max_queries)]
    for q in queries:
        if not 0 <= q.position <= len(conv.messages):
            raise InvalidInputError(
                f"Query {q.id} is asked at position {q.position}, outside 0..{len(conv.messages)}."
            )
    end = max((q.position for q in queries), default=0)
    cache0 = embedder.counts() if isinstance(embedder, CachingEmbedder) else None
    if isinstance(embedder, CachingEmbedder):
        embedder.prime([m.render() for m in conv.messages[:end]] + [q.question for q in queries])

    builds: dict[str, Any] = {}
    cost: dict[str, dict[str, Any]] = {}
    for s in specs:
        if s.build not in builds:
            builds[s.build] = _make_build(s, embedder, memory_llm if s.is_memory else None)
            cost[s.build] = {
                "kind": s.kind,
                "messages": 0,
                "add_calls": 0,
                "wall_seconds": 0.0,
                "cpu_seconds": 0.0,
                "refresh_wall_seconds": 0.0,
                "refresh_cpu_seconds": 0.0,
            }
            if s.is_memory:
                cost[s.build]["memory"] = _instance_facts(builds[s.build])
    warm = {}
    for s in specs:
        if s.build not in warm:
            pols = getattr(builds[s.build], "policies", ())
            warm[s.build] = {
                "k": k,
                **(
                    {"policy": "collapsed" if "collapsed" in pols else s.policy}
                    if s.policy is not None
                    else {}
                ),
            }
    rows: dict[str, list[dict[str, Any]]] = {s.name: [] for s in specs}
    ctx = _ScoreContext(conv, dataset, judge, render, k)
    batches = _batches(conv, end, add_batch)
    bi = 0
    for q in queries:
        dirty = False
        while bi < len(batches) and batches[bi][1] <= q.position:
            dirty = True
            a, b = batches[bi]
            chunk = conv.messages[a:b]
            for key, obj in builds.items():
                w0, c0 = time.perf_counter(), time.process_time()
                add_turns(obj, chunk)
                c = cost[key]
                c["wall_seconds"] += time.perf_counter() - w0
                c["cpu_seconds"] += time.process_time() - c0
                c["messages"] += len(chunk)
                c["add_calls"] += 1
            bi += 1
        if dirty:  # indexes refreshed lazily at the next query are construction work, not query latency
            for key, obj in builds.items():
                w0, c0 = time.perf_counter(), time.process_time()
                obj.retrieve(WARMUP_QUERY, **warm[key])
                cost[key]["refresh_wall_seconds"] += time.perf_counter() - w0
                cost[key]["refresh_cpu_seconds"] += time.process_time() - c0
        # a memory is asked as of the question's date (LongMemEval's question_date, to the end of its
        # day: the data's sessions of that day are not ordered by time), else as of the last message
        # before it; its time expressions never resolve against the clock of the machine running this
        asked = _asked_at(q, conv)
        for s in specs:
            obj = builds[s.build]
            kw: dict[str, Any] = {"k": k}
            if max_tokens is not None:
                kw["max_tokens"] = int(max_tokens)
            if s.policy is not None:
                kw["policy"] = s.policy
            if s.is_memory and asked is not None:
                kw["as_of"] = asked
            w0, c0 = time.perf_counter(), time.process_time()
            hits = list(obj.retrieve(q.question, **kw))
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            rows[s.name].append(_score(ctx, q, hits, wall, cpu))
        if progress is not None:
            progress.update(1)
    cache = None
    if cache0 is not None:
        cache = {f: v - cache0[f] for f, v in embedder.counts().items()}
    for key, obj in builds.items():
        c = cost[key]
        c["usage"] = _usage_of(obj).to_dict()
        with contextlib.suppress(Exception):
            st = obj.stats()
            c["stats"] = {s: st[s] for s in _STAT_KEYS if s in st}
    return _nan_to_none(
        {
            "conversation": conv.id,
            "dataset": dataset,
            "data": {
                "messages": len(conv.messages),
                "messages_ingested": end,
                "queries": len(conv.queries),
                "queries_evaluated": len(queries),
                "skipped_evidence": conv.skipped_evidence,
                "skipped_queries": int(conv.meta.get("skipped_queries", 0)),
                "source": conv.meta.get("source"),
                **{
                    f: int(conv.meta[f])
                    for f in ("missing_evidence_sessions", "repeated_sessions", "skipped_messages")
                    if f in conv.meta
                },
                **({"embed_cache": cache} if cache is not None else {}),
            },
            "builds": cost,
            "methods": {name: {"queries": r} for name, r in rows.items()},
        }
    )


class _ScoreContext:
    """What scoring a conversation's hits needs once: the sentences and timestamps per source id."""

    def __init__(self, conv: Conversation, dataset: str, judge: Any, render: str, k: int = 10) -> None:
        self.conv, self.dataset, self.judge, self.render, self.k = conv, dataset, judge, render, k
        self.sentences = message_sentences(conv.messages)
        self.stamps: dict[str, str | None] = {}
        for m in conv.messages:
            if m.id is not None:
                self.stamps.setdefault(str(m.id), m.timestamp)

    def text(self, h: Any) -> str:
        """The hit's returned text under the run's render."""
        if self.render == "plain" or not h.is_leaf:
            return h.text
        ts = (h.metadata or {}).get("timestamp")
        if ts is None and h.source_ids:
            ts = self.stamps.get(str(h.source_ids[0]))
        return render_returned(h.text, True, ts, self.render)


def _score(ctx: _ScoreContext, q: Any, hits: list[Any], wall: float, cpu: float) -> dict[str, Any]:
    conv, judge = ctx.conv, ctx.judge
    texts = [ctx.text(h) for h in hits]
    leaf_ids = [sid for h in hits if h.is_leaf for sid in h.source_ids]
    all_ids = [sid for h in hits for sid in h.source_ids]
    has_ev = bool(q.evidence)
    shown = [(h.text, bool(h.is_leaf), h.source_ids) for h in hits]
    row: dict[str, Any] = {
        "dataset": ctx.dataset,
        "conversation": conv.id,
        "query_id": q.id,
        "category": q.category,
        "position": q.position,
        "n_evidence": len(q.evidence),
        "evidence_recall": evidence_recall(leaf_ids, q.evidence) if has_ev else math.nan,
        "span_recall": contained_recall(shown, q.evidence, ctx.sentences) if has_ev else math.nan,
        "subtree_recall": evidence_recall(all_ids, q.evidence) if has_ev else math.nan,
        "answer_token_recall": answer_token_recall(q.answer, texts) if q.answer.strip() else math.nan,
        **(
            question_metrics(q, hits, ctx.k, conv.meta.get("canonical_turns") or {})
            if conv.meta.get("source") == "longmemeval"
            else {}
        ),
        "returned_tokens": count_tokens(texts),
        "n_hits": len(hits),
        "leaf_hits": sum(1 for h in hits if h.is_leaf),
        "latency_ms": wall * 1e3,
        "latency_cpu_ms": cpu * 1e3,
        "hits": [
            {
                "node_id": int(h.node_id),
                "is_leaf": bool(h.is_leaf),
                "depth": int(h.depth),
                "span": [int(h.span[0]), int(h.span[1])],
                "n_sources": len(h.source_ids),
                **({"source_ids": list(h.source_ids)} if h.is_leaf else {}),
            }
            for h in hits
        ],
    }
    if judge is not None:
        if conv.meta.get("source") == "longmemeval" and callable(getattr(judge, "for_question", None)):
            ja = judge.for_question(q.question, q.answer, texts, q.meta)
        else:
            ja = judge(q.question, q.answer, texts)
        row["answer"] = ja.answer
        row["llm_accuracy"] = ja.verdict
        row["rouge_l_recall"] = ja.rouge_l_recall
        row["judge_raw"] = ja.judge_raw
        row["llm_usage"] = ja.usage.to_dict()
    return row


# --------------------------------------------------------------------------- aggregation
# --------------------------------------------------------------------------- the run
def _asked_at(q: Any, conv: Conversation) -> datetime | None:
    """When a query is asked, for ``retrieve(as_of=...)`` (see the call)."""
    day = parse_timestamp((q.meta or {}).get("question_date"))
    if day is not None:
        return datetime.combine(day.date(), dt_time.max)
    return parse_timestamp(conv.messages[q.position - 1].timestamp) if q.position > 0 else None


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("hiermem", "numpy", "faiss-cpu", "bm25s", "sentence-transformers", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "conversation"


def _fingerprint(cfg: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _resumable(path: Path, fp: str) -> dict[str, Any] | None:
    """A conversation's results file made with the same configuration (``None``: none, or cut short by an
    interrupted run).

    Raises:
        InvalidInputError: the file was made with another configuration.
    """
    if not path.is_file():
        return None
    try:
        prev = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None  # a file cut short by an interrupted run: recompute it
    if prev.get("fingerprint") != fp:
        raise InvalidInputError(
            f"{path.name} in {path.parent.parent} was made with another configuration (methods, k, budget, "
            "data or LLM); rerun without --resume or use another --out."
        )
    return dict(prev)


def run_eval(
    *,
    locomo: Sequence[str | Path] = (),
    realmem: Sequence[str | Path] = (),
    jsonl: Sequence[str | Path] = (),
    realmem_excerpt: bool = False,
    methods: str | Sequence[str] | None = None,
    k: int = 10,
    max_tokens: int | None = None,
    conversations: Iterable[str] | None = None,
    max_queries: int | None = None,
    categories: Iterable[int] | None = (1, 2, 3, 4),
    add_batch: str = "session",
    out: str | Path | None = None,
    llm: Any = None,
    llm_name: str | None = None,
    judge: Any = None,
    llm_memories: bool = False,
    embedder: Any = None,
    embed_cache: bool = True,
    resume: bool = False,
    progress: bool | Callable[[int, int], None] = False,
    command: str | None = None,
    split: str | None = None,
    data_root: str | Path | None = None,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    fusion_weight: float | None = None,
    render: str = "plain",
    longmemeval: Sequence[str | Path] = (),
    limit: int | None = None,
    workers: int | None = 1,
    cache_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run an evaluation end to end and (with ``out``) write its files.

    Files in ``out``: ``results.json`` (configuration, data facts, per-method aggregates, and
    ``comparison``: the best flat baseline per metric and, per memory, its default's margin over it and
    its tree and corpus shares, each with a paired bootstrap interval, see :func:`compare_methods`),
    ``queries.jsonl`` (one line per question and method, :func:`~shared_core.eval.protocol.query_rows`),
    ``results.md`` (Markdown tables), ``results.png`` (bar chart), and ``conversations/<dataset>__<id>.json``
    (per-query rows and construction cost of one conversation; with ``resume`` an existing file made
    with the same configuration is reused instead of recomputed).

    Args:
        locomo, realmem, jsonl: input files (any number of each).
        realmem_excerpt: also evaluate the RealMem excerpt bundled with the package.
        methods: method specs (see :mod:`shared_core.eval.methods`), default all. Every memory build
            also gets its default policy and its no-structure reference baseline (:func:`with_references`).
        k: hits per query, default 10.
        max_tokens: returned-token budget per query, default none.
        conversations: conversation ids to evaluate, default all.
        max_queries: first N queries per conversation (by position), default all.
        categories: LoCoMo categories, default 1-4.
        add_batch: one of :data:`ADD_BATCH_MODES`, default ``"session"``.
        out: output directory, default ``None`` (nothing written).
        llm: an LLM answering and judging (any :class:`~shared_core.models.base.LLM`), default none.
        llm_name: how to name the LLM in the configuration (e.g. ``"openai:gpt-4o-mini"``).
        judge: a ready :class:`~shared_core.eval.judge.AnswerJudge` (default: one built on ``llm``; with
            LongMemEval data a :class:`~shared_core.eval.longmemeval_judge.LongMemEvalJudge`, which answers
            those questions as of their date and grades them with LongMemEval's rubric per type).
        llm_memories: give ``llm`` to the memories too (LLM summaries and LLM-only policies).
        embedder: the embedder of every method, default :class:`~shared_core.models.local.LocalEmbedder`.
        embed_cache: share embeddings between methods through :class:`CachingEmbedder`, default ``True``.
        resume: reuse conversation files already in ``out`` (same configuration only).
        progress: ``True``: a progress bar over the questions (done, rate, time left) on stderr when it is
            a terminal; a callable: called with ``(done, total)`` questions as they are answered; default
            ``False`` (nothing shown).
        command: the command line, recorded in the configuration.
        split: a named split (``"dev"`` or ``"validate"``, :data:`~shared_core.eval.protocol.SPLITS`)
            whose files are added to ``locomo`` / ``realmem``, default ``None``.
        data_root: the directory the split's files are under, default
            :func:`~shared_core.eval.protocol.default_data_root` (``$HIERMEM_DATA``, else
            ``../shared/data``); only its relative file paths are recorded.
        n_resamples: bootstrap resamples per interval, default 10,000.
        seed: bootstrap seed, default 0.
        fusion_weight: the dense weight of the flat ``fusion`` that counts as a flat baseline
            (``fusion[weight=W]`` is added when not listed; other weights are reported, not counted),
            default ``None``: :data:`~shared_core.eval.protocol.DEV_FUSION_WEIGHT` (the weight chosen
            on dev) with ``split="validate"``, else every evaluated weight counts.
        render: how returned texts are scored, for every method alike
            (:data:`~shared_core.eval.metrics.RENDERS`: ``"plain"``, the default, or ``"dated"``).
        longmemeval: LongMemEval files (:func:`~shared_core.eval.longmemeval.load_longmemeval`): each
            question a conversation, its haystack added in one ``add`` per method, its rows holding the
            LongMemEval figures (:data:`~shared_core.eval.longmemeval.LME_METRICS`, compared with the flat
            baselines too); with any, the flat baselines evaluated include ``session_docs`` whenever
            another counted flat baseline is.
        limit: at most this many questions of each LongMemEval file, spread over the question types,
            default all.
        workers: processes evaluating conversations side by side (:func:`~shared_core.eval.parallel.
            evaluate_all`; each pins its thread pools to one thread), default 1 (this process); ``None``:
            :func:`~shared_core.eval.parallel.default_workers`. The results do not depend on it.
        cache_dir: keep each conversation's embeddings under this directory
            (:class:`~shared_core.eval.embed_store.EmbeddingStore`) and read them back on a re-run, default
            ``None`` (none kept); ignored without ``embed_cache``. The results do not depend on it.

    Returns:
        The results document (what ``results.json`` holds).

    Raises:
        InvalidInputError: bad arguments or inputs; ``resume`` over results made with another
            configuration; ``llm_memories`` without ``llm``; an unknown split.
        SplitDataMissingError: the split's files are not under ``data_root``.
        UnknownPolicyError, LLMRequiredError: see :func:`parse_methods`.

    References:
        hiermem DESIGN "Evaluation"; LoCoMo (Maharana et al., 2024) and RealMem (Bian et al., 2026)
        evidence; MemTree paper Sec. 4 and App. A.2.2 (answer generation and LLM judge).
    """
    t_start = time.perf_counter()
    if llm_memories and llm is None:
        raise InvalidInputError("llm_memories needs an LLM; pass --llm openai:MODEL.")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
    if max_tokens is not None and (isinstance(max_tokens, bool) or int(max_tokens) < 1):
        raise InvalidInputError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    if max_queries is not None and (isinstance(max_queries, bool) or int(max_queries) < 1):
        raise InvalidInputError(f"max_queries must be a positive integer, got {max_queries!r}.")
    if add_batch not in ADD_BATCH_MODES:
        raise InvalidInputError(f"add_batch must be one of {', '.join(ADD_BATCH_MODES)}, got {add_batch!r}.")
    if render not in RENDERS:
        raise InvalidInputError(f"render must be one of {', '.join(RENDERS)}, got {render!r}.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"limit must be a positive integer, got {limit!r}.")
    specs = with_references(parse_methods(methods, memory_llm=llm_memories), memory_llm=llm_memories)
    if fusion_weight is None and split == "validate":
        fusion_weight = DEV_FUSION_WEIGHT
    if fusion_weight is not None:
        fusion_weight = check_weight(fusion_weight)
        counted = reference_spec("hybrid", fusion_weight)
        if counted.name not in {s.name for s in specs}:
            specs.append(counted)
    split_files: list[str] | None = None
    if split is not None:
        files = resolve_split(split, data_root)
        locomo = [*locomo, *files["locomo"]]
        realmem = [*realmem, *files["realmem"]]
        longmemeval = [*longmemeval, *files.get("longmemeval", [])]
        split_files = [rel for rels in SPLITS[split].values() for rel in rels]
    datasets = load_datasets(
        locomo=locomo,
        realmem=realmem,
        jsonl=jsonl,
        realmem_excerpt=realmem_excerpt,
        categories=categories,
        conversations=conversations,
        longmemeval=longmemeval,
        limit=limit,
    )
    lme = any(d.source == "longmemeval" for d in datasets)
    if (
        lme
        and "session_docs" not in {s.kind for s in specs}
        and any(s.kind in COUNTED_BASELINES for s in specs)
    ):
        specs.append(parse_methods("session_docs")[0])
    if judge is None and llm is not None:
        from .judge import AnswerJudge
        from .longmemeval_judge import LongMemEvalJudge

        judge = LongMemEvalJudge(llm) if lme else AnswerJudge(llm)
    if embedder is None:
        from ..models.local import LocalEmbedder

        embedder = LocalEmbedder()
    emb_name = str(
        getattr(embedder, "name", None)
        or (f"openai:{embedder.model}" if isinstance(getattr(embedder, "model", None), str) else None)
        or type(embedder).__name__
    )
    config: dict[str, Any] = {
        "split": split,
        "split_files": split_files,
        "methods": [s.to_dict() for s in specs],
        "k": k,
        "max_tokens": max_tokens,
        "max_queries": max_queries,
        "categories": None if categories is None else sorted(int(c) for c in categories),
        "add_batch": add_batch,
        "fusion_weight": fusion_weight,
        "render": render,
        "limit": limit,
        "conversations": None if conversations is None else list(conversations),
        "embedder": emb_name,
        "embed_cache": bool(embed_cache),
        "llm": llm_name if llm is not None else None,
        "llm_memories": bool(llm_memories),
        "inputs": [d.describe() for d in datasets],
    }
    fp_cfg = {
        k_: v for k_, v in config.items() if k_ not in ("conversations", "inputs", "split", "split_files")
    }
    out_dir = Path(out) if out is not None else None
    conv_dir = out_dir / "conversations" if out_dir is not None else None
    if conv_dir is not None:
        conv_dir.mkdir(parents=True, exist_ok=True)
    todo = [(d, c) for d in datasets for c in d.conversations]
    results: list[dict[str, Any]] = []
    reused: list[str] = []
    fresh: list[tuple[int, Dataset, Conversation, str, Path | None]] = []
    n_reused = 0
    for d, c in todo:
        fp = _fingerprint({**fp_cfg, "input": d.describe(), "conversation": c.id})
        path = conv_dir / f"{_safe(d.label)}__{_safe(c.id)}.json" if conv_dir is not None else None
        prev = _resumable(path, fp) if resume and path is not None else None
        if prev is not None:
            reused.append(c.id)
            n_reused += min(len(c.queries), max_queries or len(c.queries))
        else:
            fresh.append((len(results), d, c, fp, path))
        results.append(prev or {})

    def done(i: int, res: dict[str, Any]) -> None:
        j, _, _, fp, path = fresh[i]
        res["fingerprint"] = fp
        if path is not None:
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(res, indent=1), encoding="utf-8")
            tmp.replace(path)
        results[j] = res

    job = EvalJob(
        evaluate=evaluate_conversation,
        specs=specs,
        options={"k": k, "max_tokens": max_tokens, "max_queries": max_queries, "add_batch": add_batch},
        embedder=embedder.base if isinstance(embedder, CachingEmbedder) else embedder,
        embed_cache=bool(embed_cache),
        cache_dir=None if cache_dir is None or not embed_cache else str(cache_dir),
        memory_llm=llm if llm_memories else None,
        judge=judge,
    )
    job.options["render"] = render
    total = sum(min(len(c.queries), max_queries or len(c.queries)) for _, c in todo)
    with question_progress(progress, total, "hiermem eval") as advance:
        advance(n_reused)
        evaluate_all(
            [(d.label, c) for _, d, c, _, _ in fresh],
            job,
            workers=default_workers(len(fresh)) if workers is None else workers,
            on_query=advance,
            on_result=done,
        )
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "config": config,
        "environment": {**_versions(), "platform": platform.platform(terse=True)},
        "command": command,
        "data": {
            d.label: {
                **d.describe(),
                "conversations": {r["conversation"]: r["data"] for r in results if r["dataset"] == d.label},
                "skipped_evidence": sum(
                    r["data"]["skipped_evidence"] for r in results if r["dataset"] == d.label
                ),
                "skipped_queries": sum(
                    r["data"]["skipped_queries"] for r in results if r["dataset"] == d.label
                ),
            }
            for d in datasets
        },
        "methods": aggregate_results(results, specs, with_llm=llm is not None),
        "resumed_conversations": reused,
        "seconds": time.perf_counter() - t_start,
    }
    doc["comparison"] = compare_methods(
        doc["methods"],
        _build_facts(results, specs, llm_memories),
        [*COMPARED_METRICS, *(LLM_METRICS if llm is not None else ()), *(LME_METRICS if lme else ())],
        rows={
            s.name: pooled(r for c in results for r in c["methods"].get(s.name, {}).get("queries", []))
            for s in specs
        },
        n_resamples=n_resamples,
        seed=seed,
        fusion_weight=fusion_weight,
    )
    if out_dir is not None:
        from .report import write_report

        write_query_rows(results, out_dir / QUERY_ROWS_JSONL)
        write_report(doc, out_dir)
    return doc
