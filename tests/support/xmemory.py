"""A bag-of-words embedder and a generated conversation for the xMemory tests."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np


def _hash_unit(text: str, dim: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim)
    return (v / np.linalg.norm(v)).astype(np.float32)


class BowEmbedder:
    """Sum of hashed word vectors: texts sharing words are similar."""

    dim = 32

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for t in texts:
            v = np.zeros(self.dim, dtype=np.float32)
            for w in re.findall(r"[a-z]+", t.lower()):
                v += _hash_unit(w, self.dim)
            out.append(v if np.linalg.norm(v) > 0 else _hash_unit(t, self.dim))
        return np.stack(out)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


WORDS = ["bees", "honey", "chess", "cup", "garden", "market", "hives", "sunday", "river", "boat"]


def _messages(n: int, seed: int = 3) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        f"I {rng.choice(['keep', 'sold', 'won', 'saw'])} the {rng.choice(WORDS)} by the {rng.choice(WORDS)}."
        for _ in range(n)
    ]


QUERIES = ["bees honey", "chess cup sunday", "river boat market", "who sold the hives"]
