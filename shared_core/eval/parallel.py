"""Conversations of ``hiermem eval`` spread over worker processes (``--workers``).

Each conversation (a LongMemEval question, a LoCoMo conversation) is evaluated whole by one process with
:func:`~shared_core.eval.runner.evaluate_conversation`, its embeddings shared by every method through a
:class:`~shared_core.eval.embed_cache.CachingEmbedder` cleared between conversations (and, with a cache
directory, read from and written to :class:`~shared_core.eval.embed_store.EmbeddingStore`). Results come
back in input order, so a run's report is the same for any number of workers. Workers are started with
``spawn`` (:class:`concurrent.futures.ProcessPoolExecutor`); with more than one, each pins its BLAS, OpenMP,
FAISS, torch and ONNX Runtime pools to one thread so the processes do not oversubscribe the cores (the
vectors and scores do not depend on the thread count).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from ..types import InvalidInputError
from .data import Conversation
from .embed_cache import CachingEmbedder
from .embed_store import EmbeddingStore, conversation_key, embedder_identity

__all__ = [
    "MAX_DEFAULT_WORKERS",
    "EvalJob",
    "default_workers",
    "evaluate_all",
    "longest_first",
    "pin_threads",
]

MAX_DEFAULT_WORKERS = 8
"""The most worker processes :func:`default_workers` gives (each holds a model and a conversation's
memories)."""

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def default_workers(n_tasks: int | None = None) -> int:
    """``os.cpu_count()`` capped at :data:`MAX_DEFAULT_WORKERS` (and at ``n_tasks`` when given), at least
    1."""
    n = min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS)
    if n_tasks is not None:
        n = min(n, n_tasks)
    return max(1, n)


def pin_threads() -> None:
    """One thread for BLAS/OpenMP (threadpoolctl and, for libraries loaded later, ``OMP_NUM_THREADS`` and
    kin), FAISS and torch in this process."""
    for v in _THREAD_VARS:
        os.environ[v] = "1"
    with contextlib.suppress(Exception):
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)
    with contextlib.suppress(Exception):
        import faiss

        faiss.omp_set_num_threads(1)
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


@dataclass
class EvalJob:
    """What every conversation of a run is evaluated with (sent to each worker once).

    Attributes:
        evaluate: :func:`~shared_core.eval.runner.evaluate_conversation` (given, not imported: the runner
            imports this module).
        specs: the methods.
        options: keyword arguments of ``evaluate`` (``k``, ``max_tokens``, ``max_queries``, ``add_batch``,
            ``render``).
        embedder: the base embedder, or ``None`` for a :class:`~shared_core.models.local.LocalEmbedder`
            made from ``local`` (its constructor options).
        embed_cache: share embeddings between methods.
        cache_dir: the on-disk cache, or ``None``.
        memory_llm, judge: as ``evaluate`` takes them.
    """

    evaluate: Callable[..., dict[str, Any]]
    specs: Sequence[Any]
    options: dict[str, Any]
    embedder: Any = None
    local: dict[str, Any] = field(default_factory=dict)
    embed_cache: bool = True
    cache_dir: str | None = None
    memory_llm: Any = None
    judge: Any = None

    def for_workers(self) -> EvalJob:
        """This job with its objects checked to be sendable to another process.

        Raises:
            InvalidInputError: an embedder, LLM or judge that cannot be pickled (run with one worker).
        """
        from ..models.local import LocalEmbedder

        if type(self.embedder) is LocalEmbedder:  # rebuilt in each worker (it holds a lock and a model)
            e = self.embedder
            local = {"batch_size": e.batch_size, "device": e.device, "normalize": e.normalize}
            local.update(backend=e.backend, cache_dir=e.cache_dir)
            return replace(self, embedder=None, local=local).for_workers()
        for what, obj in (("embedder", self.embedder), ("LLM", self.memory_llm), ("judge", self.judge)):
            if obj is None:
                continue
            try:
                pickle.dumps(obj)
            except Exception as e:
                raise InvalidInputError(
                    f"workers > 1 sends the {what} to worker processes, but {type(obj).__name__} cannot be "
                    f"pickled ({type(e).__name__}); run with workers=1 (--workers 1)."
                ) from None
        return self


class _Worker:
    """A process's (or the in-process run's) embedder, cache and store."""

    def __init__(self, job: EvalJob, threads: int | None = None) -> None:
        self.job = job
        base = job.embedder
        if base is None:
            from ..models.local import LocalEmbedder

            base = LocalEmbedder(**{**job.local, **({"num_threads": threads} if threads else {})})
        self.embedder = CachingEmbedder(base) if job.embed_cache else base
        self._store: EmbeddingStore | None = None

    @property
    def store(self) -> EmbeddingStore | None:
        if self._store is None and self.job.cache_dir and isinstance(self.embedder, CachingEmbedder):
            self._store = EmbeddingStore(self.job.cache_dir, embedder_identity(self.embedder))
        return self._store

    def evaluate(self, label: str, conv: Conversation, progress: Any) -> dict[str, Any]:
        emb, store = self.embedder, self.store
        key, loaded = None, 0
        if isinstance(emb, CachingEmbedder):
            emb.clear()
            if store is not None:
                texts = [m.render() for m in conv.messages] + [q.question for q in conv.queries]
                key = conversation_key(conv.id, texts)
                arrays = store.read(key)
                if arrays is not None:
                    with contextlib.suppress(ValueError):  # another layout: recomputed and rewritten
                        loaded = emb.load(arrays)
        misses = emb.misses if isinstance(emb, CachingEmbedder) else 0
        res = self.job.evaluate(
            conv,
            self.job.specs,
            embedder=emb,
            memory_llm=self.job.memory_llm,
            judge=self.job.judge,
            dataset=label,
            progress=progress,
            **self.job.options,
        )
        if isinstance(emb, CachingEmbedder):
            if store is not None and key is not None:
                if emb.misses > misses or not loaded:
                    store.write(key, emb.export())
                res["data"].setdefault("embed_cache", {})["from_disk"] = loaded
            emb.clear()
        return res


_WORKER: _Worker | None = None
_QUEUE: Any = None


def _init(job: EvalJob, q: Any, pin: bool) -> None:
    global _WORKER, _QUEUE
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if pin:
        pin_threads()
    _WORKER, _QUEUE = _Worker(job, 1 if pin else None), q


def _run(label: str, conv: Conversation) -> dict[str, Any]:
    assert _WORKER is not None
    return _WORKER.evaluate(label, conv, _Callback(_QUEUE.put) if _QUEUE is not None else None)


def longest_first(items: Sequence[tuple[str, Conversation]]) -> list[int]:
    """Indices of ``items`` by number of messages, most first; ties in input order.

    Handing a pool of workers the longest conversations first (longest-processing-time-first scheduling)
    keeps a long one from starting last while the other workers sit idle.
    """
    return sorted(range(len(items)), key=lambda i: (-len(items[i][1].messages), i))


def evaluate_all(
    items: Sequence[tuple[str, Conversation]],
    job: EvalJob,
    *,
    workers: int = 1,
    on_query: Callable[[int], None] | None = None,
    on_result: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate ``(dataset label, conversation)`` items with ``job``, over ``workers`` processes.

    Args:
        items: the conversations, in report order.
        job: the methods and models (:class:`EvalJob`).
        workers: processes; 1 (default) evaluates in this process, more start that many ``spawn`` workers
            (at most one per item) with their thread pools pinned to one thread, given the items in
            :func:`longest_first` order (the last to finish is then a short one).
        on_query: called with ``n`` after ``n`` more queries are answered (in any worker).
        on_result: called with ``(index, result)`` as each conversation finishes (in finishing order).

    Returns:
        The results of ``evaluate_conversation``, in the order of ``items``.

    Raises:
        InvalidInputError: ``workers`` < 1, or (with more than one) an object of ``job`` that cannot be
            sent to a process. Whatever a conversation's evaluation raises (the other workers are stopped).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidInputError(f"workers must be a positive integer, got {workers!r}.")
    out: list[dict[str, Any] | None] = [None] * len(items)
    done_cb = on_result or (lambda i, r: None)
    n = min(workers, len(items))
    if n <= 1:
        local = _Worker(job)
        prog = _Callback(on_query) if on_query is not None else None
        for i, (label, conv) in enumerate(items):
            out[i] = local.evaluate(label, conv, prog)
            done_cb(i, out[i])
        return [r for r in out if r is not None]
    job = job.for_workers()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_init, initargs=(job, q, True)) as ex:
        futs: dict[Future[dict[str, Any]], int] = {
            ex.submit(_run, *items[i]): i for i in longest_first(items)
        }
        pending = set(futs)
        try:
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(q, on_query)
                for f in sorted(finished, key=futs.__getitem__):
                    out[futs[f]] = f.result()
                    done_cb(futs[f], out[futs[f]])
        except BaseException:
            for f in pending:
                f.cancel()
            raise
        _drain(q, on_query)
    return [r for r in out if r is not None]


class _Callback:
    def __init__(self, fn: Callable[[int], None]) -> None:
        self.fn = fn

    def update(self, n: int = 1) -> None:
        self.fn(int(n))


def _drain(q: Any, on_query: Callable[[int], None] | None) -> None:
    while True:
        try:
            n = q.get_nowait()
        except (queue.Empty, OSError, ValueError):
            return
        if on_query is not None:
            on_query(n)
