"""Model protocols: what an embedder and an LLM must provide, and checks of their outputs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from ..scores import normalize_rows
from ..types import Completion, EmbeddingError, HierMemError, ModelError, Usage

__all__ = [
    "LLM",
    "Embedder",
    "Summarizer",
    "UsageMeter",
    "call_embedder",
    "unit_embeddings",
    "validate_embeddings",
    "wrap_model_error",
]

T = TypeVar("T")


class UsageMeter:
    """Cumulative usage counters of a model client, safe across threads.

    A client calls :meth:`_start_usage` in its constructor and :meth:`_count` after every call.
    """

    _usage: Usage
    _usage_lock: threading.Lock

    def _start_usage(self) -> None:
        self._usage = Usage()
        self._usage_lock = threading.Lock()

    @property
    def usage(self) -> Usage:
        """Cumulative usage since creation or the last :meth:`reset_usage` (a copy)."""
        with self._usage_lock:
            return self._usage.copy()

    def reset_usage(self) -> None:
        """Set the cumulative usage counters back to zero."""
        with self._usage_lock:
            self._usage = Usage()

    def _count(self, usage: Usage) -> None:
        """Add one call's usage to the counters."""
        with self._usage_lock:
            self._usage += usage


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors.

    ``embed(texts)`` returns a ``float32`` array of shape ``(len(texts), dim)``; one call per batch.
    ``aembed`` is the async form. Vectors need not be normalised: the node index normalises them.
    """

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    async def aembed(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class LLM(Protocol):
    """Completes a prompt.

    ``complete(prompt, *, system=None, max_tokens=None, logprobs=False) -> Completion``;
    ``acomplete`` is the async form. ``logprobs=True`` asks for per-token log-probabilities.
    """

    def complete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion: ...

    async def acomplete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion: ...


def validate_embeddings(vecs: object, n: int, dim: int | None) -> np.ndarray:
    """Check an embedder's output and return it as a C-contiguous float32 array ``(n, dim)``.

    Raises:
        EmbeddingError: wrong type, wrong shape (rows must equal the number of texts, columns the
            embedder's ``dim``), or NaN / infinite values.
    """
    try:
        arr = np.asarray(vecs, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise EmbeddingError(f"Embedder returned something that is not a numeric array: {e}") from None
    if arr.ndim != 2 or arr.shape[0] != n:
        raise EmbeddingError(
            f"Embedder returned shape {arr.shape} for {n} texts; expected ({n}, dim). "
            "Check that embed() returns one row per input text."
        )
    if dim is not None and arr.shape[1] != dim:
        raise EmbeddingError(
            f"Embedder returned vectors of dimension {arr.shape[1]}, but this memory uses {dim}; "
            "use the same embedder the memory was built with."
        )
    if not np.isfinite(arr).all():
        raise EmbeddingError("Embedder returned NaN or infinite values; check the embedding model.")
    return np.ascontiguousarray(arr)


@runtime_checkable
class Summarizer(Protocol):
    """Aggregates ordered child texts into one annotation.

    ``summarize(texts, **fields) -> (text, usage)``; ``fields`` are prompt placeholders an LLM summariser
    may use (e.g. MemTree's ``n``); extractive summarisers ignore them.
    """

    def summarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]: ...

    async def asummarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]: ...


def wrap_model_error(exc: BaseException, what: str, source: str) -> HierMemError:
    """The typed error to raise for a failure of a model call.

    Args:
        exc: what the model (or the code reading its answer) raised.
        what: the operation, e.g. ``"Embedding"`` or ``"Completion"``.
        source: the model in words, e.g. ``"the LangChain model ChatOpenAI"``.

    Returns:
        ``exc`` itself when it is already a :class:`~shared_core.types.HierMemError` (e.g. an
        ``EmbeddingError`` or ``InvalidInputError``), else a :class:`~shared_core.types.ModelError` naming
        the operation, the model and the cause (chain it with ``raise ... from exc``).
    """
    if isinstance(exc, HierMemError):
        return exc
    return ModelError(
        f"{what} with {source} failed: {type(exc).__name__}: {exc}. "
        "Check the model's configuration (credentials, endpoint, model name)."
    )


def call_embedder(embedder: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a call of ``embedder`` (its ``embed`` or ``embed_spans``), with what it raises typed.

    Args:
        embedder: the embedder (named in the error).
        fn: the method to call. args: its arguments.

    Returns:
        What ``fn`` returns.

    Raises:
        HierMemError: what ``fn`` raised when it is one (e.g. ``EmbeddingError``), unchanged; so is a
            ``MemoryError`` (the process's, not the model's).
        ModelError: ``fn`` raised any other ``Exception``; the original is its ``__cause__``.
    """
    try:
        return fn(*args)
    except (HierMemError, MemoryError):
        raise
    except Exception as e:
        raise wrap_model_error(e, "Embedding", f"the embedder {type(embedder).__name__}") from e


def unit_embeddings(vecs: object, n: int, dim: int | None) -> np.ndarray:
    """An embedder's output checked (:func:`validate_embeddings`) and its rows scaled to L2 norm 1.

    Args:
        vecs: the embedder's output, ``(n, dim)`` array-like.
        n: the number of texts embedded. dim: the expected dimension, ``None`` for any.

    Returns:
        C-contiguous ``float32`` array ``(n, dim)`` of unit rows.

    Raises:
        EmbeddingError: as :func:`validate_embeddings`, or a row whose L2 norm (in float32) is 0 or
            overflows (e.g. values near 3e38): such a vector has no direction to compare.
    """
    arr = validate_embeddings(vecs, n, dim)
    with np.errstate(over="ignore"):
        norms = np.linalg.norm(arr, axis=1)
    bad = np.flatnonzero(~np.isfinite(norms) | (norms == 0))
    if bad.size:
        j = int(bad[0])
        raise EmbeddingError(
            f"Embedder returned a vector of {'zero' if norms[j] == 0 else 'overflowing'} length for text "
            f"{j} ({bad.size} of {n} such); it has no direction to compare: check the embedding model."
        )
    return normalize_rows(arr)
