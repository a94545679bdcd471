"""Texts, a hostile payload, a cheap embedder and the page-data reader for the visualisation tests."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np

from tests.support.openai_server import hash_embedding

PAYLOAD = "</script><script>alert(1)</script>"


TEXTS = [
    "I adopted a dog named Luna last spring.",
    "Luna loves running on the beach every morning.",
    "My sister Maria lives in Oslo.",
    "Maria works as a nurse at the city hospital.",
    f"Note to self: {PAYLOAD} is what an injection looks like.",
    "For dinner I cooked a mushroom risotto & a salad <b>bold</b> <!-- comment -->.",
    "The risotto needed more parmesan cheese.",
    "Tomorrow I fly to Kyoto for a week; the ryokan is booked.",
]


class HashEmbedder:
    """Deterministic unit vectors from a hash of each text (``dim`` dimensions, default 32)."""

    def __init__(self, dim: int = 32) -> None:
        self._dim = dim
        self.calls = 0

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return np.asarray([hash_embedding(t, self._dim) for t in texts], dtype=np.float32).reshape(
            len(texts), self._dim
        )

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def html_payload(html: str) -> dict:
    """The JSON data element (``script#data``) of a page written by ``render_html``."""
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))
