"""The stub models and synthetic streams of ``hiermem bench`` and ``benchmarks/bench_*.py``.

A stub embedder that replays precomputed 384-d unit vectors (:class:`ReplayEmbedder`, a hashed unit
vector for an unknown text), summarisers that cost O(1) (:class:`SpanEndsSummarizer`,
:class:`FirstTextSummarizer`, :class:`HashSummarizer`), the topical and clustered streams, thread pinning,
the machine's description and the per-kind stub memory, so that a benchmark times a memory's own
algorithm and not its models. :mod:`shared_core.bench.core` re-exports them.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..types import InvalidInputError, Usage

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
    from ..eval.runner import available_memories

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
