"""Texts, a cheap embedder and result summaries for the LlamaIndex adapter tests."""

from __future__ import annotations

import numpy as np

from tests.support.openai_server import hash_embedding

TEXTS = [
    "I adopted a dog named Luna last spring.",
    "Luna loves running on the beach every morning.",
    "My sister Maria lives in Oslo.",
    "Maria works as a nurse at the city hospital.",
    "For dinner I cooked a mushroom risotto.",
    "The risotto needed more parmesan cheese.",
]


class HashEmbedder:
    """A cheap deterministic core embedder (structure tests that do not need semantics)."""

    dim = 16

    def embed(self, texts):
        return np.asarray([hash_embedding(t, self.dim) for t in texts], dtype=np.float32).reshape(
            -1, self.dim
        )

    async def aembed(self, texts):
        return self.embed(texts)


def tree_of(index):
    return index.memory.to_dict()["tree"]


def summary(results) -> list[tuple[str, float, str]]:
    return [(r.node.node_id, round(float(r.score), 6), r.node.get_content()) for r in results]
