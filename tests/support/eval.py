"""Helpers of the evaluation tests: a cheap bag-of-words embedder and the ``--jsonl`` input writer."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_core.eval.data import Conversation


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


def write_jsonl(path: Path, conv: Conversation) -> Path:
    """The conversation as a ``hiermem eval --jsonl`` file (queries at their positions)."""
    lines = []
    for i, m in enumerate([*conv.messages, None]):
        for q in conv.queries:
            if q.position == i:
                lines.append(
                    {
                        "question": q.question,
                        "answer": q.answer,
                        "evidence": q.evidence,
                        "category": q.category,
                        "id": q.id,
                    }
                )
        if m is not None:
            lines.append(
                {
                    "text": m.text,
                    "speaker": m.speaker,
                    "id": m.id,
                    "timestamp": m.timestamp,
                    "metadata": m.metadata,
                }
            )
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path
