"""``hiermem bench``: algorithm overhead with model calls taken out, and embedded-default throughput.

Overhead: each memory is fed a synthetic conversation-like stream of 384-d unit vectors through a stub
embedder that replays precomputed vectors (:class:`ReplayEmbedder`) and a summariser that costs O(1)
(:class:`SpanEndsSummarizer`: a node's vector is the mean of its first and last child's; MemTree gets
:class:`FirstTextSummarizer`, ``Aggregate(existing, new) = existing``). One memory grows through the
requested sizes; before each size the last ``window`` messages are inserted one ``add`` at a time and
timed (wall-clock ``time.perf_counter`` and process CPU ``time.process_time``); at each size every
LLM-free policy answers ``queries`` queries (noisy copies of stored vectors), next to one flat FAISS
``IndexFlatIP`` search and one numpy brute-force scan over the same leaf vectors, in the same process and
moment. BLAS and FAISS are pinned to one thread (threadpoolctl, ``faiss.omp_set_num_threads(1)``): one
query is too little work to share, and on a busy machine idle worker threads only add noise. Memory:
peak RSS of the memory's own process (``resource.getrusage``; each memory runs in a fresh process with
``isolate=True``), its RSS after the stream was generated, and — in a separate pass for sizes up to
``trace_max`` — the Python/numpy allocations ``tracemalloc`` sees (FAISS's C++ buffers are not traced).

Evicted namespaces (:func:`namespace_profile`): a ``MemoryStore`` of durable SQLite namespaces on the
same stubs; the time to open an evicted namespace again (its rows and vectors read back, its index
rebuilt; the texts embedded meanwhile are counted and must be none) and the RSS each resident message
costs.

Throughput: messages per second added (one ``add`` per session) into each memory built on the embedded
defaults — the real :class:`~shared_core.models.local.LocalEmbedder`, no LLM — over the first turns of
the bundled RealMem excerpt, with flat dense retrieval beside it.

The stub classes and streams are also used by ``benchmarks/bench_*.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import resource
import statistics
import time
import tracemalloc
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .types import InvalidInputError, Usage

__all__ = [
    "DIM",
    "FirstTextSummarizer",
    "HashSummarizer",
    "PoolEmbedder",
    "ReplayEmbedder",
    "SpanEndsSummarizer",
    "bench_memory",
    "clustered_stream",
    "flat_search_timings",
    "machine_description",
    "memory_profile",
    "namespace_profile",
    "pin_threads",
    "render_markdown",
    "run_bench",
    "stub_memory",
    "throughput",
    "topical_stream",
]

DIM = 384
"""Vector dimension of the synthetic streams (all-MiniLM-L6-v2's)."""

BENCH_SCHEMA = "hiermem.bench/1"
K = 10


# --------------------------------------------------------------------------- stub models
def _hash_vector(text: str, dim: int) -> np.ndarray:
    v = np.random.default_rng(zlib.crc32(text.encode("utf-8"))).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class ReplayEmbedder:
    """Replays precomputed vectors: the table's vector for a known text, a stand-in otherwise.

    Args:
        table: ``{text: float32 vector (dim,)}``; shared with the summariser, which adds entries.
        dim: vector dimension, default 384.
        unknown: for a text not in the table, ``"hash"`` (default) gives a deterministic unit vector
            seeded by the text's CRC-32; ``"fixed"`` gives one constant unit vector for every unknown text.

    Raises:
        InvalidInputError: an unknown ``unknown`` mode.
    """

    def __init__(self, table: dict[str, np.ndarray], dim: int = DIM, unknown: str = "hash") -> None:
        if unknown not in ("hash", "fixed"):
            raise InvalidInputError(f"unknown must be 'hash' or 'fixed', got {unknown!r}.")
        self.table = table
        self.dim = dim
        self.unknown = unknown
        self._fixed = np.ones(dim, dtype=np.float32) / np.sqrt(dim)

    def vector(self, text: str) -> np.ndarray:
        """The vector of one text (float32, ``(dim,)``)."""
        v = self.table.get(text)
        if v is None:
            v = self._fixed if self.unknown == "fixed" else _hash_vector(text, self.dim)
        return v

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts``: float32 ``(len(texts), dim)``."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = self.vector(t)
        return out

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed`."""
        return self.embed(texts)


class SpanEndsSummarizer:
    """A free aggregate function whose vector is the mean of the first and last child's vectors.

    It costs O(1) per call and, like a real summary, drifts away from the newest message as the span
    grows to cover older topics. Each call registers a new text (``"summary <n>"``) in the embedder's
    table. Only the ``keep`` most recently used summaries stay in the table (a summary is used when it
    is made and whenever it is the first or last child of a node being summarised), so the stub's own
    memory stays bounded while a tree re-annotates its ancestors on every insert.

    Args:
        embedder_or_table: a :class:`ReplayEmbedder` (unknown child texts get its stand-in vectors) or
            a bare table (every child text must be in it).
        keep: summaries kept in the table, default 200,000 (about 300 MB at 384-d).
    """

    def __init__(
        self, embedder_or_table: ReplayEmbedder | dict[str, np.ndarray], keep: int = 200_000
    ) -> None:
        if isinstance(embedder_or_table, ReplayEmbedder):
            self.table = embedder_or_table.table
            self._lookup: Callable[[str], np.ndarray] = embedder_or_table.vector
        else:
            self.table = embedder_or_table
            self._lookup = self.table.__getitem__
        self.n = 0
        self.keep = int(keep)
        self._recent: OrderedDict[str, None] = OrderedDict()

    def summarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """``("summary <n>", Usage())`` with the summary's vector registered in the table."""
        first, last = texts[0], texts[-1]
        v = self._lookup(first) + self._lookup(last)
        for t in (first, last):
            if t in self._recent:
                self._recent.move_to_end(t)
        self.n += 1
        key = f"summary {self.n}"
        norm = float(np.linalg.norm(v))
        self.table[key] = (v / norm if norm > 0 else v).astype(np.float32)
        self._recent[key] = None
        while len(self._recent) > self.keep:
            old, _ = self._recent.popitem(last=False)
            self.table.pop(old, None)
        return key, Usage()

    async def asummarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """Async :meth:`summarize`."""
        return self.summarize(texts)


class FirstTextSummarizer:
    """A free aggregate function: ``Aggregate(existing, new) = existing`` (returns the first text)."""

    def summarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """``(texts[0], Usage())``."""
        return texts[0], Usage()

    async def asummarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """Async :meth:`summarize`."""
        return self.summarize(texts)


class PoolEmbedder:
    """Precomputed unit vectors: row ``crc32(text) % pool`` of a fixed random matrix; times itself.

    Args:
        dim: vector dimension, default 384.
        pool: number of distinct vectors, default 4096.
        seed: seed of the matrix, default 0.

    Attributes:
        seconds: wall-clock seconds spent in :meth:`embed`.
    """

    def __init__(self, dim: int = DIM, pool: int = 4096, seed: int = 0) -> None:
        v = np.random.default_rng(seed).standard_normal((pool, dim)).astype(np.float32)
        self.vectors = v / np.linalg.norm(v, axis=1, keepdims=True)
        self.dim = dim
        self.seconds = 0.0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts``: float32 ``(len(texts), dim)``."""
        t0 = time.perf_counter()
        rows = [zlib.crc32(t.encode("utf-8")) % len(self.vectors) for t in texts]
        out = self.vectors[rows]
        self.seconds += time.perf_counter() - t0
        return out

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed`."""
        return self.embed(texts)


class HashSummarizer:
    """A cheap aggregate that changes whenever the ordered children change; counts and times its calls.

    The text is ``"<n children>:<crc32 of the children> <first 24 chars of the last child>"``, so its
    cost does not grow with the tree while every changed child list forces a new aggregate.

    Attributes:
        calls: number of calls. seconds: wall-clock seconds spent in :meth:`summarize`.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def summarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """The aggregate text and an empty usage."""
        t0 = time.perf_counter()
        self.calls += 1
        text = f"{len(texts)}:{zlib.crc32(chr(31).join(texts).encode('utf-8')):08x} {texts[-1][:24]}"
        self.seconds += time.perf_counter() - t0
        return text, Usage()

    async def asummarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        """Async :meth:`summarize`."""
        return self.summarize(texts, **fields)


# --------------------------------------------------------------------------- synthetic streams
def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def topical_stream(n: int, seed: int = 0) -> tuple[list[str], dict[str, np.ndarray]]:
    """A conversation-like stream: themes of 500-3,000 messages made of topics of 5-40 messages.

    A message is a noisy copy (noise 0.06 per coordinate) of its topic vector, which leans towards its
    theme's vector (topic = theme + 0.8 x random unit vector, normalised).

    Args:
        n: number of messages (>= 0).
        seed: random seed, default 0.

    Returns:
        ``(texts, table)``: texts ``"message <i>"`` in order and their float32 unit vectors ``(384,)``.
    """
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    table: dict[str, np.ndarray] = {}
    while len(texts) < n:
        theme = _unit(rng)
        in_theme = int(rng.integers(500, 3001))
        while in_theme > 0 and len(texts) < n:
            topic = theme + 0.8 * _unit(rng)
            topic /= np.linalg.norm(topic)
            for _ in range(min(in_theme, int(rng.integers(5, 41)))):
                if len(texts) >= n:
                    break
                v = topic + 0.06 * rng.standard_normal(DIM).astype(np.float32)
                t = f"message {len(texts)}"
                table[t] = (v / np.linalg.norm(v)).astype(np.float32)
                texts.append(t)
                in_theme -= 1
    return texts, table


def clustered_stream(n: int, seed: int = 0) -> tuple[list[str], dict[str, np.ndarray], np.random.Generator]:
    """A two-level topical stream in random order: 40 topics x 25 subtopics.

    A message is topic + 0.7 x subtopic + 0.35 x noise (all unit vectors), normalised: cosine about 0.92
    within a subtopic, 0.62 within a topic, 0 across topics.

    Args:
        n: number of messages.
        seed: random seed, default 0.

    Returns:
        ``(texts, table, rng)`` — the generator, to draw further random numbers reproducibly.
    """
    rng = np.random.default_rng(seed)

    def units(m: int) -> np.ndarray:
        v = rng.standard_normal((m, DIM)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    topics = units(40)
    subs = units(40 * 25)
    table: dict[str, np.ndarray] = {}
    texts = []
    which = rng.integers(0, 40 * 25, size=n)
    noise = units(n)
    for i in range(n):
        s = int(which[i])
        v = topics[s // 25] + 0.7 * subs[s] + 0.35 * noise[i]
        t = f"message {i}"
        table[t] = (v / np.linalg.norm(v)).astype(np.float32)
        texts.append(t)
    return texts, table, rng


# --------------------------------------------------------------------------- environment
def pin_threads() -> Any:
    """Pin BLAS/OpenMP pools (threadpoolctl) and FAISS to one thread; returns the threadpoolctl limiter.

    Returns:
        The ``threadpool_limits`` object (call ``restore_original_limits()`` to undo), or ``None``.
    """
    limiter = None
    with contextlib.suppress(Exception):
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(limits=1)
    with contextlib.suppress(Exception):
        import faiss

        faiss.omp_set_num_threads(1)
    return limiter


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def machine_description() -> dict[str, Any]:
    """Facts of the machine at call time: cores, memory, CPU model, load average, versions.

    Returns:
        ``{"cpu_model", "logical_cpus", "physical_cores", "memory_gib", "memory_available_gib",
        "load_average_1_5_15", "platform", "python", "numpy", "faiss"}`` (values ``None`` when unknown).
    """
    out: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": None,
        "memory_gib": None,
        "memory_available_gib": None,
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "faiss": None,
    }
    with contextlib.suppress(Exception):
        import psutil

        out["physical_cores"] = psutil.cpu_count(logical=False)
        vm = psutil.virtual_memory()
        out["memory_gib"] = round(vm.total / 2**30, 1)
        out["memory_available_gib"] = round(vm.available / 2**30, 1)
    with contextlib.suppress(Exception):
        import faiss

        out["faiss"] = faiss.__version__
    return out


def _rss() -> int | None:
    with contextlib.suppress(Exception):
        import psutil

        return int(psutil.Process().memory_info().rss)
    return None


def _peak_rss() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if platform.system() == "Darwin" else int(r) * 1024


# --------------------------------------------------------------------------- memories with stubs
def _memory_classes() -> dict[str, type]:
    from .eval.runner import available_memories

    return available_memories()


def stub_memory(kind: str, embedder: ReplayEmbedder) -> Any:
    """A memory of ``kind`` on stub models (no LLM).

    SegTreeMem uses ``relevance="dense"`` (the BM25 half of its default hybrid relevance would score the
    stub texts, which carry no words); SegTreeMem, HAT and XMemory summarise with
    :class:`SpanEndsSummarizer`, MemTree with :class:`FirstTextSummarizer`.

    Args:
        kind: ``"segtree"``, ``"memtree"``, ``"hat"`` or ``"xmemory"``.
        embedder: the replaying embedder.

    Returns:
        The memory.

    Raises:
        InvalidInputError: an unknown or unavailable kind.
    """
    classes = _memory_classes()
    if kind not in classes:
        raise InvalidInputError(f"Unknown memory {kind!r}; available: {', '.join(classes)}.")
    cls = classes[kind]
    if kind == "segtree":
        return cls(embedder=embedder, summarizer=SpanEndsSummarizer(embedder), relevance="dense")
    if kind == "memtree":
        return cls(embedder=embedder, summarizer=FirstTextSummarizer())
    return cls(embedder=embedder, summarizer=SpanEndsSummarizer(embedder))


def _policies(mem: Any) -> list[str]:
    return [p for p in mem.policies if p not in getattr(mem, "llm_policies", ())]


def _stats(xs: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(xs, dtype=np.float64) * 1e3
    return {
        "median_ms": float(np.median(arr)),
        "p90_ms": float(np.percentile(arr, 90)),
        "mean_ms": float(arr.mean()),
    }


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def flat_search_timings(X: np.ndarray, Q: np.ndarray, k: int = K) -> dict[str, dict[str, dict[str, float]]]:
    """Per-query time of flat top-k search over ``X`` with FAISS ``IndexFlatIP`` and with numpy.

    Args:
        X: float32 ``(n, d)`` unit vectors. Q: float32 ``(q, d)`` queries. k: hits, default 10.

    Returns:
        ``{"faiss": {"wall": stats, "cpu": stats}, "numpy": {...}}`` with ``median_ms``, ``p90_ms``,
        ``mean_ms`` per query. numpy computes ``X @ q``, ``argpartition`` and sorts the top k.
    """
    import faiss

    index = faiss.IndexFlatIP(X.shape[1])
    index.add(X)
    kk = min(k, len(X))

    def np_search(q: np.ndarray) -> np.ndarray:
        s = X @ q
        top = np.argpartition(-s, kk - 1)[:kk]
        return top[np.argsort(-s[top])]

    for q in Q[:2]:  # warm-up
        index.search(q[None, :], kk)
        np_search(q)
    out: dict[str, dict[str, list[float]]] = {
        "faiss": {"wall": [], "cpu": []},
        "numpy": {"wall": [], "cpu": []},
    }
    for q in Q:
        w, c = _timed(lambda q=q: index.search(q[None, :], kk))
        out["faiss"]["wall"].append(w)
        out["faiss"]["cpu"].append(c)
        w, c = _timed(lambda q=q: np_search(q))
        out["numpy"]["wall"].append(w)
        out["numpy"]["cpu"].append(c)
    return {m: {t: _stats(v) for t, v in d.items()} for m, d in out.items()}


def bench_memory(
    kind: str, sizes: Sequence[int], *, window: int = 200, queries: int = 50, seed: int = 0, chunk: int = 500
) -> dict[str, Any]:
    """Grow one stub-model memory through ``sizes``, timing inserts and queries at each size.

    Before each size ``S`` the memory is filled up to ``S - window`` with batched adds of ``chunk``
    messages (untimed except in total), then the last ``window`` messages are added one ``add`` each and
    timed. At ``S`` every LLM-free policy answers ``queries`` queries (``k = 10``; each a noisy copy of a
    random stored leaf vector, embedded by the replaying stub), and flat FAISS and numpy search the
    ``S`` leaf vectors for the same query vectors. BLAS/FAISS are pinned to one thread.

    Args:
        kind: the memory kind. sizes: leaf counts (distinct, >= 2). window: timed inserts per size,
            default 200. queries: timed queries per policy, default 50. seed: stream seed, default 0.
        chunk: messages per untimed batched add, default 500.

    Returns:
        ``{"kind", "policies", "rss_before_bytes", "peak_rss_bytes", "sizes": [{"leaves", "nodes", "stats",
        "build_wall_s", "build_cpu_s", "insert": {"wall", "cpu", "measured"}, "retrieve": {policy: {"wall",
        "cpu"}}, "flat": {...}, "rss_bytes"}]}``; times as ``median_ms`` / ``p90_ms`` / ``mean_ms``.

    Raises:
        InvalidInputError: bad sizes or an unknown kind.

    References:
        Overhead targets of the SegTreeMem benchmark (insert median at 100k within 2x of 1k) and the
        MemTree benchmark (ratios to one flat FAISS search).
    """
    sizes = _check_sizes(sizes)
    limiter = pin_threads()
    try:
        texts, table = topical_stream(max(sizes), seed)
        emb = ReplayEmbedder(table)
        rss_before = _rss()
        mem = stub_memory(kind, emb)
        rng = np.random.default_rng(seed + 1)
        out: dict[str, Any] = {
            "kind": kind,
            "policies": _policies(mem),
            "rss_before_bytes": rss_before,
            "sizes": [],
        }
        n = 0
        build_w = build_c = 0.0
        for S in sizes:
            start = max(n, S - window)
            while n < start:
                step = min(chunk, start - n)
                w, c = _timed(lambda a=n, b=n + step: mem.add(texts[a:b]))
                build_w += w
                build_c += c
                n += step
            ins_w, ins_c = [], []
            while n < S:
                w, c = _timed(lambda i=n: mem.add(texts[i]))
                ins_w.append(w)
                ins_c.append(c)
                n += 1
            build_w += sum(ins_w)
            build_c += sum(ins_c)
            X = np.stack([table[t] for t in texts[:S]])
            picks = rng.integers(0, S, size=queries)
            Q = X[picks] + 0.3 * np.stack([_unit(rng) for _ in range(queries)])
            Q = (Q / np.linalg.norm(Q, axis=1, keepdims=True)).astype(np.float32)
            qtexts = []
            for j in range(queries):
                key = f"query {S}:{j}"
                table[key] = Q[j]
                qtexts.append(key)
            retr: dict[str, Any] = {}
            for p in out["policies"]:
                for qt in qtexts[:2]:  # warm caches (lexical/derived state built lazily)
                    mem.retrieve(qt, k=K, policy=p)
                ws, cs = [], []
                for qt in qtexts:
                    w, c = _timed(lambda qt=qt, p=p: mem.retrieve(qt, k=K, policy=p))
                    ws.append(w)
                    cs.append(c)
                retr[p] = {"wall": _stats(ws), "cpu": _stats(cs)}
            flat = flat_search_timings(X, Q)
            st = mem.stats()
            out["sizes"].append(
                {
                    "leaves": S,
                    "nodes": st.get("nodes"),
                    "stats": {
                        k: st[k]
                        for k in (
                            "internal_nodes",
                            "max_depth",
                            "mean_depth",
                            "mean_branching",
                            "height",
                            "tree_nodes",
                        )
                        if k in st
                    },
                    "build_wall_s": build_w,
                    "build_cpu_s": build_c,
                    "insert": {"wall": _stats(ins_w), "cpu": _stats(ins_c), "measured": len(ins_w)}
                    if ins_w
                    else None,
                    "retrieve": retr,
                    "flat": flat,
                    "rss_bytes": _rss(),
                }
            )
            del X
        out["peak_rss_bytes"] = _peak_rss()
        return out
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def memory_profile(kind: str, sizes: Sequence[int], *, seed: int = 0, chunk: int = 500) -> dict[str, Any]:
    """Python/numpy allocations of a stub-model memory grown through ``sizes``, traced by tracemalloc.

    The stream is generated before tracing starts, so only the memory's own allocations (nodes, index
    arrays, caches, summary vectors registered by the stub summariser) are counted; FAISS's C++ buffers
    are not visible to tracemalloc.

    Args:
        kind: the memory kind. sizes: leaf counts. seed: stream seed. chunk: messages per batched add.

    Returns:
        ``{"kind", "sizes": [{"leaves", "traced_bytes", "traced_peak_bytes", "bytes_per_leaf"}]}``.
    """
    sizes = _check_sizes(sizes)
    texts, table = topical_stream(max(sizes), seed)
    emb = ReplayEmbedder(table)
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        mem = stub_memory(kind, emb)
        out: dict[str, Any] = {"kind": kind, "sizes": []}
        n = 0
        for S in sizes:
            while n < S:
                step = min(chunk, S - n)
                mem.add(texts[n : n + step])
                n += step
            cur, peak = tracemalloc.get_traced_memory()
            out["sizes"].append(
                {
                    "leaves": S,
                    "traced_bytes": cur - base,
                    "traced_peak_bytes": peak - base,
                    "bytes_per_leaf": (cur - base) / S,
                }
            )
        del mem
        return out
    finally:
        if not was:
            tracemalloc.stop()


class _CountingReplay(ReplayEmbedder):
    """A :class:`ReplayEmbedder` that counts the texts it embeds."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        super().__init__(table)
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)


def _resident_bytes() -> int | None:
    """RSS now (psutil, else ``/proc/self/statm``), or ``None`` when neither is available."""
    r = _rss()
    if r is None:
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as f:
            r = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return r


_RESIDENT_RSS = r"""
import json, sys
from shared_core.bench import ReplayEmbedder, _resident_bytes, stub_memory
from shared_core.namespaces import MemoryStore
kind, root, names = sys.argv[1], sys.argv[2], [tuple(n) for n in json.loads(sys.argv[3])]
emb = ReplayEmbedder({})
st = MemoryStore(lambda: stub_memory(kind, emb), root, durable=True, max_resident=None)
st.get(names[0])  # libraries loaded, caches warm
r0 = _resident_bytes()
for ns in names[1:]:
    st.get(ns)
r1 = _resident_bytes()
print(json.dumps(None if r0 is None or r1 is None else r1 - r0))
"""


def _resident_rss(kind: str, root: str, names: list[tuple[str, ...]]) -> int | None:
    """RSS added by opening ``names[1:]`` after ``names[0]``, in a fresh interpreter (so that memory freed
    earlier in this process does not hide the growth); ``None`` when it cannot be measured."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        out = subprocess.run(
            [sys.executable, "-c", _RESIDENT_RSS, kind, root, json.dumps(names)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=True,
        )
        v = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return None if v is None else int(v)


def namespace_profile(
    kind: str, messages: int = 1_000, *, namespaces: int = 8, reopens: int = 8, seed: int = 0
) -> dict[str, Any]:
    """A :class:`~shared_core.namespaces.MemoryStore` of durable SQLite namespaces on stub models: the cold
    open of an evicted namespace, and RSS per resident message.

    ``namespaces`` namespaces of ``messages`` messages each (one ``add`` each) are written to SQLite stores
    in a temporary directory. Cold open: with ``max_resident=1`` the namespaces are opened in turn
    (``MemoryStore.get``), so each open reads an evicted namespace's rows and vectors back and rebuilds its
    index; nothing may be embedded again. RSS: in a fresh interpreter, one namespace is opened (libraries
    loaded), then all the others at once (``max_resident=None``); the RSS they added, divided by their
    messages.

    Args:
        kind: the memory kind.
        messages: messages per namespace (>= 1), default 1,000.
        namespaces: namespaces written (>= 2), default 8.
        reopens: timed cold opens, default 8.
        seed: stream seed, default 0.

    Returns:
        ``{"kind", "messages", "namespaces", "cold_open": {"wall", "cpu"} (median_ms, p90_ms, mean_ms),
        "embedded_texts_on_reopen", "rss_per_resident_message_bytes" (``None`` without a way to read
        RSS), "sqlite_bytes_per_message"}``.

    Raises:
        InvalidInputError: an unknown kind, or counts out of range.
    """
    import tempfile

    from .namespaces import MemoryStore

    if messages < 1 or namespaces < 2 or reopens < 1:
        raise InvalidInputError("messages and reopens must be >= 1 and namespaces >= 2.")
    texts, table = topical_stream(messages * namespaces, seed)
    emb = _CountingReplay(table)
    names = [("bench", f"user{i}") for i in range(namespaces)]
    with tempfile.TemporaryDirectory(prefix="hiermem-ns-") as root:

        def store(max_resident: int | None) -> MemoryStore:
            return MemoryStore(
                lambda: stub_memory(kind, emb),
                root,
                durable=True,
                synchronous="NORMAL",
                max_resident=max_resident,
            )

        st = store(1)
        for i, ns in enumerate(names):
            st.add(ns, texts[i * messages : (i + 1) * messages])
        st.close()
        st = store(1)
        before = emb.texts
        walls, cpus = [], []
        for r in range(reopens):
            w, c = _timed(lambda r=r: st.get(names[r % namespaces]))
            walls.append(w)
            cpus.append(c)
        reembedded = emb.texts - before
        st.close()
        rss = _resident_rss(kind, root, names)
        disk = sum(f.stat().st_size for f in Path(root).rglob("memory.sqlite*"))
    n = messages * namespaces
    return {
        "kind": kind,
        "messages": messages,
        "namespaces": namespaces,
        "cold_open": {"wall": _stats(walls), "cpu": _stats(cpus)},
        "embedded_texts_on_reopen": reembedded,
        "rss_per_resident_message_bytes": None if rss is None else rss / (messages * (namespaces - 1)),
        "sqlite_bytes_per_message": disk / n,
    }


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    try:
        out = sorted({int(s) for s in sizes})
    except (TypeError, ValueError):
        raise InvalidInputError(f"sizes must be integers, got {sizes!r}.") from None
    if not out or out[0] < 2 * K:
        raise InvalidInputError(f"sizes must be integers >= {2 * K} (leaves), got {list(sizes)!r}.")
    return out


# --------------------------------------------------------------------------- embedded throughput
def throughput(kinds: Sequence[str], turns: int = 300) -> dict[str, Any]:
    """Messages per second added into each memory built on the embedded defaults (real embedder, no LLM).

    The first ``turns`` turns of the bundled RealMem excerpt are added one ``add`` per session; every
    memory embeds its own texts (no cache). Flat dense retrieval over the same turns is measured beside:
    it embeds the same messages with the same batching and nothing else, so each memory's
    ``cpu_ratio_to_embedding`` (its CPU seconds over flat dense's) is what the memory costs per message
    as a multiple of embedding the message.

    Args:
        kinds: memory kinds. turns: number of turns (>= 1), default 300.

    Returns:
        ``{"turns", "sessions", "embedder", "results": {name: {"seconds", "cpu_seconds",
        "messages_per_second", "messages_per_cpu_second", "embed_calls_per_message",
        "embedded_texts_per_message", "cpu_ratio_to_embedding"}}}``.

    Raises:
        InvalidInputError: ``turns`` < 1.
    """
    if isinstance(turns, bool) or int(turns) < 1:
        raise InvalidInputError(f"turns must be >= 1, got {turns!r}.")
    from itertools import groupby

    from .eval.baselines import FlatDense
    from .eval.data import load_realmem_excerpt
    from .models.local import LocalEmbedder

    msgs = load_realmem_excerpt().messages[: int(turns)]
    sessions = [list(g) for _, g in groupby(msgs, key=lambda m: m.id)]
    emb = LocalEmbedder()
    emb.embed(["warm-up"])  # load the model before timing
    classes = _memory_classes()
    makers: dict[str, Callable[[], Any]] = {"flat_dense": lambda: FlatDense(emb)}
    makers.update({k: (lambda c=classes[k]: c(embedder=emb)) for k in kinds})
    res: dict[str, Any] = {}
    for name, make in makers.items():
        obj = make()
        w0, c0 = time.perf_counter(), time.process_time()
        for s in sessions:
            obj.add(s)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        u = obj.usage
        res[name] = {
            "seconds": wall,
            "cpu_seconds": cpu,
            "messages_per_second": len(msgs) / wall if wall > 0 else None,
            "messages_per_cpu_second": len(msgs) / cpu if cpu > 0 else None,
            "embed_calls_per_message": u.embed_calls / len(msgs),
            "embedded_texts_per_message": u.embedded_texts / len(msgs),
            "cpu_ratio_to_embedding": _ratio(cpu, res["flat_dense"]["cpu_seconds"] if res else cpu),
        }
    res["flat_dense"] = res.pop("flat_dense")  # listed after the memories, as before
    return {"turns": len(msgs), "sessions": len(sessions), "embedder": emb.name, "results": res}


# --------------------------------------------------------------------------- the run
def _in_process(fn: Callable[..., Any], isolate: bool, *args: Any, **kw: Any) -> Any:
    if not isolate:
        return fn(*args, **kw)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args, **kw).result()


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _growth(
    rows: list[dict[str, Any]], get: Callable[[dict[str, Any]], float | None]
) -> dict[str, float | None]:
    if not rows:
        return {}
    first = get(rows[0])
    return {str(r["leaves"]): _ratio(get(r), first) for r in rows[1:]}


def run_bench(
    sizes: Sequence[int] = (1_000, 10_000),
    *,
    memories: Sequence[str] | None = None,
    queries: int = 50,
    window: int = 200,
    throughput_turns: int = 300,
    isolate: bool = True,
    trace_max: int = 10_000,
    seed: int = 0,
    size_caps: dict[str, int] | None = None,
    namespace_messages: int | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the overhead benchmark for each memory, the tracemalloc pass and the throughput run.

    Args:
        sizes: leaf counts, default 1,000 and 10,000 (add 100,000 for the full run).
        memories: memory kinds, default every available one (SegTreeMem, MemTree, HAT, XMemory).
        queries: timed queries per size and policy, default 50.
        window: timed single inserts before each size, default 200.
        throughput_turns: RealMem excerpt turns for the embedded throughput run, 0 to skip; default 300.
        isolate: run each memory's timing and tracing in a fresh process (clean peak RSS), default ``True``.
        trace_max: largest size measured by tracemalloc (0 to skip), default 10,000.
        seed: stream seed, default 0.
        size_caps: ``{kind: largest size}`` for memories too costly at the largest sizes; the sizes left
            out are listed in ``doc["not_run"]``. Default none.
        namespace_messages: messages per namespace of :func:`namespace_profile` (cold open of an
            evicted SQLite namespace, RSS per resident message), run for each memory; default the
            smallest size capped at 1,000; 0 to skip.
        out: directory for ``bench.json``, ``bench.md`` and ``bench.png`` (``None``: nothing written).
        progress: callback receiving one line of text per finished step.

    Returns:
        ``{"schema", "machine": {"start", "end"}, "config", "memories": {kind: {...bench_memory...,
        "growth": {...}, "memory_profile": ..., "namespaces": ...namespace_profile...}}, "throughput"}``.

    Raises:
        InvalidInputError: bad sizes, an unknown memory, or non-positive counts.
    """
    sizes = _check_sizes(sizes)
    for name, v in (("queries", queries), ("window", window)):
        if isinstance(v, bool) or int(v) < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {v!r}.")
    available = _memory_classes()
    kinds = list(available) if memories is None else [str(m).strip().lower() for m in memories]
    unknown = [k for k in kinds if k not in available]
    if unknown or not kinds:
        raise InvalidInputError(
            f"Unknown memory {', '.join(unknown) or '(none)'}; choose from {', '.join(available)}."
        )
    ns_messages = min(sizes[0], 1_000) if namespace_messages is None else int(namespace_messages)
    if ns_messages < 0:
        raise InvalidInputError(f"namespace_messages must be >= 0, got {namespace_messages!r}.")
    caps = {str(k).lower(): int(v) for k, v in (size_caps or {}).items()}
    bad = [k for k in caps if k not in kinds]
    if bad:
        raise InvalidInputError(f"size cap for {', '.join(bad)}, which is not benchmarked in this run.")
    say = progress or (lambda s: None)
    t0 = time.perf_counter()
    doc: dict[str, Any] = {
        "schema": BENCH_SCHEMA,
        "machine": {"start": machine_description()},
        "config": {
            "sizes": sizes,
            "memories": kinds,
            "queries": int(queries),
            "window": int(window),
            "k": K,
            "dim": DIM,
            "seed": seed,
            "isolate": bool(isolate),
            "trace_max": int(trace_max),
            "throughput_turns": int(throughput_turns),
            "size_caps": caps,
            "namespace_messages": ns_messages,
            "threads": "BLAS and FAISS pinned to 1 thread for the overhead runs",
            "stubs": "ReplayEmbedder (precomputed vectors); SpanEndsSummarizer (SegTreeMem, HAT, XMemory), "
            "FirstTextSummarizer (MemTree); SegTreeMem relevance='dense'",
        },
        "memories": {},
        "not_run": [],
    }
    for kind in kinds:
        run_sizes = [s for s in sizes if s <= caps.get(kind, s)]
        doc["not_run"] += [
            {"memory": kind, "leaves": s, "reason": "size cap"} for s in sizes if s not in run_sizes
        ]
        if not run_sizes:
            continue
        say(f"bench {kind}: sizes {run_sizes} ...")
        r = _in_process(bench_memory, isolate, kind, run_sizes, window=window, queries=queries, seed=seed)
        rows = r["sizes"]
        r["growth"] = {
            "insert_wall": _growth(rows, lambda x: (x["insert"] or {}).get("wall", {}).get("median_ms")),
            "insert_cpu": _growth(rows, lambda x: (x["insert"] or {}).get("cpu", {}).get("median_ms")),
            "retrieve_cpu": {
                p: _growth(rows, lambda x, p=p: x["retrieve"][p]["cpu"]["median_ms"]) for p in r["policies"]
            },
            "flat_faiss_cpu": _growth(rows, lambda x: x["flat"]["faiss"]["cpu"]["median_ms"]),
            "flat_numpy_cpu": _growth(rows, lambda x: x["flat"]["numpy"]["cpu"]["median_ms"]),
        }
        for row in rows:
            fa = row["flat"]["faiss"]["cpu"]["median_ms"]
            row["retrieve_over_faiss_cpu"] = {
                p: _ratio(v["cpu"]["median_ms"], fa) for p, v in row["retrieve"].items()
            }
        traced = [s for s in run_sizes if s <= trace_max]
        if traced:
            r["memory_profile"] = _in_process(memory_profile, isolate, kind, traced, seed=seed)
        if ns_messages:
            r["namespaces"] = _in_process(namespace_profile, isolate, kind, ns_messages, seed=seed)
        doc["memories"][kind] = r
        if out is not None:  # partial results survive an interrupted run
            doc["machine"]["end"] = machine_description()
            write_bench(doc, out)
        last = rows[-1]
        say(
            f"  {kind} @ {last['leaves']}: insert median {last['insert']['cpu']['median_ms']:.3f} ms CPU, "
            + ", ".join(f"{p} {v['cpu']['median_ms']:.3f} ms" for p, v in last["retrieve"].items())
            + f"; flat FAISS {last['flat']['faiss']['cpu']['median_ms']:.3f} ms"
        )
    if throughput_turns:
        say(f"throughput: {throughput_turns} RealMem excerpt turns with the real embedder ...")
        doc["throughput"] = throughput(kinds, throughput_turns)
    doc["machine"]["end"] = machine_description()
    doc["seconds"] = time.perf_counter() - t0
    if out is not None:
        write_bench(doc, out)
    return doc


# --------------------------------------------------------------------------- reports
def _f(v: Any, d: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{d}f}" if isinstance(v, float) else str(v)


def render_markdown(doc: dict[str, Any]) -> str:
    """Markdown tables of a bench document: machine, inserts, retrieval, memory, evicted namespaces,
    throughput.

    Args:
        doc: the document returned by :func:`run_bench`.

    Returns:
        The Markdown text.
    """
    m0 = doc["machine"]["start"]
    m1 = doc["machine"].get("end", m0)
    cfg = doc["config"]
    lines = [
        "# hiermem bench",
        "",
        f"Machine: {m0.get('cpu_model')}, {m0.get('logical_cpus')} logical CPUs, {m0.get('memory_gib')} GiB; "
        f"load average {m0.get('load_average_1_5_15')} at the start and "
        f"{m1.get('load_average_1_5_15')} at the end (1/5/15 min). Wall times on a loaded machine "
        "include waiting for a CPU; CPU times do not.",
        "",
        f"Stub models (no model calls); {cfg['window']} timed single inserts before each size, "
        f"{cfg['queries']} queries per policy, k = {cfg['k']}; BLAS/FAISS on one thread.",
        "",
        *(
            [
                "Not run: "
                + "; ".join(f"{x['memory']} at {x['leaves']} leaves ({x['reason']})" for x in doc["not_run"])
                + ".",
                "",
            ]
            if doc.get("not_run")
            else []
        ),
        "## Insert time per message (ms)",
        "",
        "| memory | leaves | nodes | median wall | median CPU | p90 CPU | CPU growth vs smallest "
        "| peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, r in doc["memories"].items():
        g = r["growth"]["insert_cpu"]
        for row in r["sizes"]:
            ins = row["insert"] or {}
            lines.append(
                f"| {kind} | {row['leaves']} | {row['nodes']} | {_f(ins.get('wall', {}).get('median_ms'))} | "
                f"{_f(ins.get('cpu', {}).get('median_ms'))} | {_f(ins.get('cpu', {}).get('p90_ms'))} | "
                f"{_f(g.get(str(row['leaves'])), 2) if str(row['leaves']) in g else '1.00'} | "
                f"{_f(r['peak_rss_bytes'] / 2**20, 0) if row is r['sizes'][-1] else ''} |"
            )
    lines += [
        "",
        "## Retrieval time per query (ms, median CPU; wall in parentheses)",
        "",
        "| memory:policy | leaves | tree | flat FAISS | numpy brute force | tree / FAISS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, r in doc["memories"].items():
        for row in r["sizes"]:
            fa, nu = row["flat"]["faiss"], row["flat"]["numpy"]
            for p, v in row["retrieve"].items():
                lines.append(
                    f"| {kind}:{p} | {row['leaves']} | "
                    f"{_f(v['cpu']['median_ms'])} ({_f(v['wall']['median_ms'])}) | "
                    f"{_f(fa['cpu']['median_ms'])} ({_f(fa['wall']['median_ms'])}) | "
                    f"{_f(nu['cpu']['median_ms'])} ({_f(nu['wall']['median_ms'])}) | "
                    f"{_f(row['retrieve_over_faiss_cpu'][p], 1)} |"
                )
    prof = [(k, r["memory_profile"]) for k, r in doc["memories"].items() if r.get("memory_profile")]
    if prof:
        lines += [
            "",
            "## Traced Python/numpy memory (tracemalloc)",
            "",
            "| memory | leaves | traced MiB | peak MiB | bytes per leaf |",
            "|---|---:|---:|---:|---:|",
        ]
        for kind, p in prof:
            for s in p["sizes"]:
                lines.append(
                    f"| {kind} | {s['leaves']} | {_f(s['traced_bytes'] / 2**20, 1)} | "
                    f"{_f(s['traced_peak_bytes'] / 2**20, 1)} | {_f(s['bytes_per_leaf'], 0)} |"
                )
    nsp = [(k, r["namespaces"]) for k, r in doc["memories"].items() if r.get("namespaces")]
    if nsp:
        lines += [
            "",
            "## Evicted namespaces (MemoryStore on SQLite)",
            "",
            "| memory | messages per namespace | cold open median ms (CPU) | texts embedded on reopen "
            "| RSS bytes per resident message | SQLite bytes per message |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for kind, p in nsp:
            lines.append(
                f"| {kind} | {p['messages']} | {_f(p['cold_open']['wall']['median_ms'], 1)} "
                f"({_f(p['cold_open']['cpu']['median_ms'], 1)}) | {p['embedded_texts_on_reopen']} | "
                f"{_f(p['rss_per_resident_message_bytes'], 0)} | {_f(p['sqlite_bytes_per_message'], 0)} |"
            )
    tp = doc.get("throughput")
    if tp:
        lines += [
            "",
            f"## Embedded-default throughput ({tp['turns']} RealMem excerpt turns, "
            f"{tp['sessions']} sessions, "
            f"{tp['embedder']}, no LLM)",
            "",
            "| method | messages/s (wall) | messages per CPU-second | CPU per message, x embedding it "
            "| embedding calls/msg | embedded texts/msg |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, v in tp["results"].items():
            lines.append(
                f"| {name} | {_f(v['messages_per_second'], 1)} | {_f(v['messages_per_cpu_second'], 1)} | "
                f"{_f(v.get('cpu_ratio_to_embedding'), 2)} | "
                f"{_f(v['embed_calls_per_message'], 2)} | {_f(v['embedded_texts_per_message'], 2)} |"
            )
    return "\n".join(lines) + "\n"


def plot_bench(doc: dict[str, Any], path: str | Path) -> Path:
    """Log-log plot of time vs leaves: insert per message, and retrieval per query beside flat search.

    Args:
        doc: the bench document. path: the PNG to write.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    ax_i, ax_r = axes
    cmap = plt.get_cmap("tab10")
    for ci, (kind, r) in enumerate(doc["memories"].items()):
        xs = [row["leaves"] for row in r["sizes"] if row["insert"]]
        for t, style in (("cpu", "-"), ("wall", ":")):
            ys = [row["insert"][t]["median_ms"] for row in r["sizes"] if row["insert"]]
            ax_i.plot(xs, ys, style, marker="o", color=cmap(ci % 10), label=f"{kind} ({t})")
        for pi, p in enumerate(r["policies"]):
            ys = [row["retrieve"][p]["cpu"]["median_ms"] for row in r["sizes"]]
            ax_r.plot(
                [row["leaves"] for row in r["sizes"]],
                ys,
                ["-", "--", "-.", ":", "-"][pi % 5],
                marker="o",
                color=cmap(ci % 10),
                label=f"{kind}:{p}",
            )
    # flat search: the median over the memories' runs at each size
    by_size: dict[int, dict[str, list[float]]] = {}
    for r in doc["memories"].values():
        for row in r["sizes"]:
            d = by_size.setdefault(row["leaves"], {"faiss": [], "numpy": []})
            for m in d:
                d[m].append(row["flat"][m]["cpu"]["median_ms"])
    xs = sorted(by_size)
    for m, color in (("faiss", "black"), ("numpy", "gray")):
        ax_r.plot(
            xs,
            [statistics.median(by_size[x][m]) for x in xs],
            "-",
            lw=2.5,
            color=color,
            marker="s",
            label=f"flat {m} (floor)",
        )
    for ax, title, ylab in (
        (ax_i, "Insert: time per message (median; solid CPU, dotted wall)", "ms per message"),
        (ax_r, "Retrieval: CPU time per query (median), k = 10", "ms per query"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("leaves (messages stored)")
        ax.set_ylabel(ylab)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_bench(doc: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir`` (created when missing).

    Returns:
        The file names written.
    """
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = {"json": "bench.json", "markdown": "bench.md", "png": "bench.png"}
    doc["files"] = files
    (d / files["markdown"]).write_text(render_markdown(doc), encoding="utf-8")
    plot_bench(doc, d / files["png"])
    (d / files["json"]).write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return files
