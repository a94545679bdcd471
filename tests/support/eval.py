"""A cheap bag-of-words embedder for the evaluation tests."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np


class BowEmbedder:
    """Deterministic bag-of-words embedder (hashed lower-cased words, 64-d): fast and topical."""

    dim = 64
    name = "bow-64"

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
            out[i, 0] += 1e-3  # never a zero vector
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)
