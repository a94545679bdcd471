"""Counting embedders and message helpers for the MemoryStore (namespace) tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shared_core import Message
from tests.support.memory import HashEmbedder

EMB = HashEmbedder(64)


class CountingEmbedder:
    """HashEmbedder that counts every text it embeds."""

    def __init__(self) -> None:
        self.inner = HashEmbedder(64)
        self.texts: list[str] = []

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        return self.inner.embed(texts)


def _msgs(i: int) -> list[Message]:
    return [
        Message(f"user{i} says the secret word is w{i}x", id=f"m{i}a"),
        Message(f"I like topic{i % 7} a lot", id=f"m{i}b"),
    ]


def _sources(hits: Any) -> set[str]:
    return {s for h in hits for s in h.source_ids}
