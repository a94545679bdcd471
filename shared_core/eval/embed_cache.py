"""The embedding cache of ``hiermem eval``: one embedding per distinct text, shared by every method of a
conversation (a LongMemEval question), cleared between conversations, and optionally kept on disk per
conversation (:mod:`shared_core.eval.embed_store`) so that a re-run embeds nothing again. Re-exported by
:mod:`shared_core.eval.runner`."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..models.extractive import sentence_spans

__all__ = ["CachingEmbedder", "text_key"]


def text_key(text: str, spans: Sequence[Sequence[int]] | None = None) -> bytes:
    """The cache key of a text (with ``spans``: of the text and its character spans), a 32-byte SHA-256
    digest: texts are kept by digest, never verbatim."""
    h = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    if spans is not None:
        h.update(b"\x00spans:" + ",".join(f"{int(a)}-{int(b)}" for a, b in spans).encode())
    return h.digest()


class CachingEmbedder:
    """Memoises another embedder's vectors by text, so every method of a run shares each embedding.

    The evaluation pre-embeds every message rendering and question of a conversation in one batch
    (:meth:`prime`); the memories then find those vectors here, so their construction seconds measure
    the algorithm plus the texts only they embed (summaries), and retrieval latency excludes the query
    embedding, identically for every method. Usage counters of the memories still count each call
    they make. Texts are keyed by SHA-256 digest (:func:`text_key`); :meth:`export` and :meth:`load` move
    the vectors to and from disk.

    Args:
        base: the embedder to memoise (any :class:`~shared_core.models.base.Embedder`).

    Attributes:
        hits, misses: texts served from the cache / embedded by ``base``.
        seconds: wall-clock seconds spent in ``base.embed``.
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self._table: dict[bytes, np.ndarray] = {}
        self._parts: dict[bytes, np.ndarray] = {}
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
        todo = [t for t in dict.fromkeys(texts) if text_key(t) not in self._table]
        if not todo:
            return
        if callable(getattr(self.base, "embed_spans", None)):
            self._embed_spans(todo, [sentence_spans(t) for t in todo])
            return
        t0 = time.perf_counter()
        vecs = np.asarray(self.base.embed(todo), dtype=np.float32)
        self.seconds += time.perf_counter() - t0
        self.misses += len(todo)
        self._table.update(zip(map(text_key, todo), vecs))

    def _embed_spans(self, texts: list[str], spans: Sequence[Sequence[tuple[int, int]]]) -> None:
        t0 = time.perf_counter()
        vecs, parts = self.base.embed_spans(texts, spans)
        self.seconds += time.perf_counter() - t0
        self.misses += len(texts)
        for t, sp, v, p in zip(texts, spans, np.asarray(vecs, dtype=np.float32), parts):
            self._table.setdefault(text_key(t), v)
            self._parts[text_key(t, sp)] = np.asarray(p, dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts``, ``float32`` ``(len(texts), dim)``; unknown texts embedded in one batch."""
        texts = list(texts)
        before = self.misses
        self.prime(texts)
        self.hits += len(texts) - (self.misses - before)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._table[text_key(t)] for t in texts])

    def embed_spans(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """The base embedder's ``embed_spans``, memoised by text and spans; ``(vectors, None)`` when the base
        has none."""
        texts = list(texts)
        if not callable(getattr(self.base, "embed_spans", None)):
            return self.embed(texts), None
        keys = [text_key(t, sp) for t, sp in zip(texts, spans)]
        todo = {k: (t, sp) for k, t, sp in zip(keys, texts, spans) if k not in self._parts}
        before = self.misses
        if todo:
            self._embed_spans([t for t, _ in todo.values()], [sp for _, sp in todo.values()])
        self.hits += len(texts) - (self.misses - before)
        if not texts:
            return np.zeros((0, self.dim), np.float32), []
        return np.stack([self._table[text_key(t)] for t in texts]), [self._parts[k] for k in keys]

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

    def export(self) -> dict[str, np.ndarray]:
        """Every cached vector as arrays: ``keys`` ``uint8 (n, 32)`` and ``vectors`` ``float32 (n, dim)``
        (text digests and vectors), ``part_keys`` ``uint8 (m, 32)``, ``part_offsets`` ``int64 (m + 1,)``
        and ``parts`` ``float32 (rows, dim)`` (the span vectors of entry ``i`` are rows
        ``part_offsets[i]:part_offsets[i + 1]``); what :meth:`load` takes."""
        dim = self.dim
        keys = list(self._table)
        pkeys = list(self._parts)
        rows = [self._parts[k].reshape(-1, dim) for k in pkeys]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        return {
            "keys": np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 32),
            "vectors": np.stack([self._table[k] for k in keys]) if keys else np.zeros((0, dim), np.float32),
            "part_keys": np.frombuffer(b"".join(pkeys), dtype=np.uint8).reshape(len(pkeys), 32),
            "part_offsets": offsets,
            "parts": np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32),
        }

    def load(self, arrays: Mapping[str, np.ndarray]) -> int:
        """Add the vectors of an :meth:`export` (entries already cached are kept); returns how many texts
        it held.

        Raises:
            ValueError: arrays of inconsistent shapes or of another dimension.
        """
        keys, vecs = np.asarray(arrays["keys"]), np.asarray(arrays["vectors"], dtype=np.float32)
        pkeys, offs = np.asarray(arrays["part_keys"]), np.asarray(arrays["part_offsets"])
        parts = np.asarray(arrays["parts"], dtype=np.float32)
        dim = self.dim
        if (
            keys.shape != (len(vecs), 32)
            or vecs.shape[1:] != (dim,)
            or pkeys.shape != (len(offs) - 1, 32)
            or parts.shape[1:] != (dim,)
            or (len(offs) and (offs[0] != 0 or offs[-1] != len(parts) or np.any(np.diff(offs) < 0)))
        ):
            raise ValueError("embedding cache arrays of inconsistent shapes")
        for k, v in zip(keys, vecs):
            self._table.setdefault(k.tobytes(), v)
        for i, k in enumerate(pkeys):
            self._parts.setdefault(k.tobytes(), parts[offs[i] : offs[i + 1]])
        return len(keys)
