"""The embedding cache of ``hiermem eval``: one embedding per distinct text, shared by every method of a
conversation (a LongMemEval question), cleared between conversations. Re-exported by
:mod:`shared_core.eval.runner`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..models.extractive import sentence_spans

__all__ = ["CachingEmbedder"]


class CachingEmbedder:
    """Memoises another embedder's vectors by text, so every method of a run shares each embedding.

    The evaluation pre-embeds every message rendering and question of a conversation in one batch
    (:meth:`prime`); the memories then find those vectors here, so their construction seconds measure
    the algorithm plus the texts only they embed (summaries), and retrieval latency excludes the query
    embedding, identically for every method. Usage counters of the memories still count each call
    they make.

    Args:
        base: the embedder to memoise (any :class:`~shared_core.models.base.Embedder`).

    Attributes:
        hits, misses: texts served from the cache / embedded by ``base``.
        seconds: wall-clock seconds spent in ``base.embed``.
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self._table: dict[str, np.ndarray] = {}
        self._parts: dict[tuple[str, tuple[tuple[int, int], ...]], np.ndarray] = {}
        self.hits = 0
        self.misses = 0
        self.seconds = 0.0

    @property
    def dim(self) -> int:
        """The base embedder's dimension."""
        return int(self.base.dim)

    @property
    def name(self) -> str:
        """The base embedder's name (or class name)."""
        return str(getattr(self.base, "name", type(self.base).__name__))

    def prime(self, texts: Iterable[str]) -> None:
        """Embed the texts not cached yet, in one batch (with their sentences' pooled vectors when the base
        embedder offers ``embed_spans``, as the default extractive summariser asks for them)."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._table]
        if not todo:
            return
        if callable(getattr(self.base, "embed_spans", None)):
            self._embed_spans(todo, [sentence_spans(t) for t in todo])
            return
        t0 = time.perf_counter()
        vecs = np.asarray(self.base.embed(todo), dtype=np.float32)
        self.seconds += time.perf_counter() - t0
        self.misses += len(todo)
        self._table.update(zip(todo, vecs))

    def _embed_spans(self, texts: list[str], spans: Sequence[Sequence[tuple[int, int]]]) -> None:
        t0 = time.perf_counter()
        vecs, parts = self.base.embed_spans(texts, spans)
        self.seconds += time.perf_counter() - t0
        self.misses += len(texts)
        for t, sp, v, p in zip(texts, spans, np.asarray(vecs, dtype=np.float32), parts):
            self._table.setdefault(t, v)
            self._parts[(t, tuple(map(tuple, sp)))] = np.asarray(p, dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts``, ``float32`` ``(len(texts), dim)``; unknown texts embedded in one batch."""
        texts = list(texts)
        before = self.misses
        self.prime(texts)
        self.hits += len(texts) - (self.misses - before)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._table[t] for t in texts])

    def embed_spans(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """The base embedder's ``embed_spans``, memoised by text and spans; ``(vectors, None)`` when the base
        has none."""
        texts = list(texts)
        if not callable(getattr(self.base, "embed_spans", None)):
            return self.embed(texts), None
        keys = [(t, tuple(map(tuple, sp))) for t, sp in zip(texts, spans)]
        todo = {k: None for k in keys if k not in self._parts}
        before = self.misses
        if todo:
            self._embed_spans([k[0] for k in todo], [k[1] for k in todo])
        self.hits += len(texts) - (self.misses - before)
        vecs = np.stack([self._table[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
        return vecs, [self._parts[k] for k in keys]

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed`."""
        return self.embed(texts)

    def counts(self) -> dict[str, float]:
        """``{"hits", "misses", "seconds"}`` so far (texts served from the cache, texts embedded by the base
        embedder, seconds spent in it)."""
        return {"hits": self.hits, "misses": self.misses, "seconds": self.seconds}

    def clear(self) -> None:
        """Forget every cached vector."""
        self._table.clear()
        self._parts.clear()
