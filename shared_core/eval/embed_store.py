"""The on-disk embedding cache of ``hiermem eval`` (``--embed-cache-dir``): per embedder and per
conversation, the vectors that conversation's methods used, so that a re-run embeds nothing again.

Layout: ``<root>/<embedder identity>/<conversation key>.npz`` (:meth:`CachingEmbedder.export` arrays; texts
kept only as SHA-256 digests). The embedder identity (:func:`embedder_identity`) is a digest of the
embedder's class, name and dimension and of the vector it gives a fixed probe text, so other weights, another
backend or another model never read these vectors. The conversation key (:func:`conversation_key`) is a digest
of its id and of every text it primes (messages as rendered, questions).

Why per conversation and not one table for the run: an embedder that packs several texts in one forward pass
(:class:`~shared_core.models.local.LocalEmbedder`) gives a text vectors that differ in the last float bits
(about 1e-7) with the batch it was embedded in. Each conversation's vectors depend on that conversation
alone (its own batches, in its own order), whatever the number of worker processes or the order they finish
in, and a re-run reads back exactly the vectors the first run computed, so its results are identical. A text
two conversations share is embedded in each.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .embed_cache import CachingEmbedder, text_key

__all__ = ["PROBE_TEXT", "EmbeddingStore", "conversation_key", "default_embed_cache_dir", "embedder_identity"]

logger = logging.getLogger(__name__)

PROBE_TEXT = "hiermem embedding cache probe: the quick brown fox jumps over the lazy dog."
"""The text whose vector identifies an embedder in :func:`embedder_identity`."""

_ARRAYS = ("keys", "vectors", "part_keys", "part_offsets", "parts")


def default_embed_cache_dir() -> Path:
    """``<hiermem cache dir>/eval-embeddings`` (see :func:`~shared_core.models.local.default_cache_dir`:
    ``$HIERMEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/hiermem``, else ``~/.cache/hiermem``)."""
    from ..models.local import default_cache_dir

    return default_cache_dir() / "eval-embeddings"


def embedder_identity(embedder: Any) -> str:
    """A 16-hex-digit digest naming an embedder's vectors: its class, ``name``, ``dim``, and the bytes of
    the vector it gives :data:`PROBE_TEXT` (embedded once here)."""
    base = embedder.base if isinstance(embedder, CachingEmbedder) else embedder
    probe = np.asarray(base.embed([PROBE_TEXT]), dtype=np.float32)
    h = hashlib.sha256()
    h.update(f"{type(base).__module__}.{type(base).__qualname__}|{getattr(base, 'name', '')}|".encode())
    h.update(f"{getattr(base, 'dim', probe.shape[-1])}|".encode())
    h.update(probe.tobytes())
    return h.hexdigest()[:16]


def conversation_key(conversation_id: str, texts: Sequence[str]) -> str:
    """A 24-hex-digit digest of a conversation: its id and the texts it primes, in order."""
    h = hashlib.sha256(json.dumps(str(conversation_id)).encode())
    for t in texts:
        h.update(text_key(t))
    return h.hexdigest()[:24]


class EmbeddingStore:
    """Per-conversation vector files of one embedder under ``root`` (see the module docstring).

    Args:
        root: the cache directory (created on first write).
        identity: the embedder's :func:`embedder_identity`.

    A file that cannot be read (cut short, another layout) is ignored and rewritten; a directory that
    cannot be written is logged once and the run goes on without writing.
    """

    def __init__(self, root: str | os.PathLike[str], identity: str) -> None:
        self.dir = Path(root).expanduser() / str(identity)
        self._warned = False

    def path(self, key: str) -> Path:
        """The file of conversation ``key``."""
        return self.dir / f"{key}.npz"

    def read(self, key: str) -> dict[str, np.ndarray] | None:
        """The arrays stored for ``key``, or ``None`` when there are none (or they cannot be read)."""
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            with np.load(p, allow_pickle=False) as z:
                return {a: z[a] for a in _ARRAYS}
        except Exception as e:  # a damaged file: recomputed and rewritten
            logger.warning("Ignoring the unreadable embedding cache file %s (%s).", p, e)
            return None

    def write(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Store ``arrays`` for ``key`` atomically (a concurrent reader sees the old file or the new one)."""
        tmp: str | None = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.dir, suffix=".tmp", delete=False) as f:
                tmp = f.name
                np.savez(f, **arrays)
            os.replace(tmp, self.path(key))
        except OSError as e:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    Path(tmp).unlink(missing_ok=True)
            if not self._warned:
                logger.warning("Cannot write the embedding cache under %s (%s); going on.", self.dir, e)
                self._warned = True
