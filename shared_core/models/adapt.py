"""Plain callables as core models, and the other framework-neutral pieces of the model adapters.

The LangChain and LlamaIndex adapters only translate between their framework and the two callables
these classes take; everything else is done here, once:

* :class:`CallableEmbedder` turns ``embed_batch(list[str]) -> list[list[float]]`` (and optionally an async
  ``aembed_batch``) into a core :class:`~shared_core.models.base.Embedder`: it checks the texts, validates
  the vectors (one finite row per text, one dimension), learns the dimension from the first call (or
  probes it with one short text), wraps provider failures in :class:`~shared_core.types.ModelError`, and
  runs ``embed_batch`` in a worker thread when there is no async form.
* :class:`CallableLLM` turns ``complete(prompt, system, max_tokens, logprobs) -> str | Reply`` (and
  optionally an async form) into a core :class:`~shared_core.models.base.LLM`: it checks the arguments,
  times each call, wraps failures, counts usage (per call and cumulative) and falls back to a worker
  thread for the async form.
* Helpers for adapters: :func:`wrap_model_error`, :func:`check_dim`, :func:`check_completion_args`,
  :func:`model_fields`, :func:`optional_call_kwargs`, :func:`join_system`, :func:`prompt_input`,
  :func:`get_field`, :func:`read_token_counts`, :func:`openai_logprobs`; and for the other direction (a
  core embedder inside a framework) :func:`core_embedder`, :func:`embed_rows`, :func:`aembed_rows`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from ..types import Completion, InvalidInputError, ModelError, Usage
from .base import UsageMeter, validate_embeddings, wrap_model_error

__all__ = [
    "DIM_PROBE",
    "CallableEmbedder",
    "CallableLLM",
    "Reply",
    "aembed_rows",
    "check_completion_args",
    "check_dim",
    "core_embedder",
    "embed_rows",
    "get_field",
    "join_system",
    "model_fields",
    "openai_logprobs",
    "optional_call_kwargs",
    "prompt_input",
    "read_token_counts",
    "wrap_model_error",
]

#: Text embedded to learn the dimension of an embedding model when it is asked before any call.
DIM_PROBE = "dimension probe"

#: ``embed_batch(texts) -> one vector per text`` (a list of lists, or any 2-D array-like).
EmbedBatch = Callable[[list[str]], Any]
#: Async ``embed_batch``.
AEmbedBatch = Callable[[list[str]], Awaitable[Any]]


# =========================================================================== helpers
def check_dim(dim: Any) -> int | None:
    """Check an optional vector dimension argument.

    Args:
        dim: a positive integer, or ``None`` (learned later).

    Returns:
        ``dim`` as an ``int``, or ``None``.

    Raises:
        InvalidInputError: ``dim`` is a bool, not an integer, or ``< 1``.
    """
    if dim is None:
        return None
    if isinstance(dim, bool):
        raise InvalidInputError(f"dim must be a positive integer or None, got {dim!r}.")
    try:
        value = int(dim)
    except (TypeError, ValueError):
        raise InvalidInputError(f"dim must be a positive integer or None, got {dim!r}.") from None
    if value < 1:
        raise InvalidInputError(f"dim must be a positive integer or None, got {dim!r}.")
    return value


def check_completion_args(prompt: Any, system: Any, max_tokens: Any) -> None:
    """Check the arguments of a core ``LLM.complete`` call.

    Args:
        prompt: must be a non-empty, non-whitespace string.
        system: must be a string or ``None``.
        max_tokens: must be a positive ``int`` (not a bool) or ``None``.

    Raises:
        InvalidInputError: one of them is not as described.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("prompt must be a non-empty string.")
    if system is not None and not isinstance(system, str):
        raise InvalidInputError(f"system must be a string or None, got {type(system).__name__}.")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise InvalidInputError(f"max_tokens must be a positive int or None, got {max_tokens!r}.")


def model_fields(model: object) -> frozenset[str]:
    """Names of the declared (pydantic) fields of ``model``'s class; empty for other objects.

    Args:
        model: a framework model object.

    Returns:
        The field names (e.g. ``{"model_name", "max_tokens", ...}``).
    """
    return frozenset(getattr(type(model), "model_fields", None) or {})


def optional_call_kwargs(
    base: Mapping[str, Any], fields: Iterable[str], *, max_tokens: int | None, logprobs: bool
) -> dict[str, Any]:
    """Keyword arguments for one model call: ``base`` plus the options the model supports.

    Args:
        base: keyword arguments sent with every call (copied, not changed).
        fields: the model's field names (see :func:`model_fields`).
        max_tokens: sent as ``max_tokens`` when not ``None`` and the model has a ``max_tokens`` field.
        logprobs: sent as ``logprobs=True`` when true and the model has a ``logprobs`` field.

    Returns:
        A new dict.
    """
    fields = set(fields)
    kw = dict(base)
    if max_tokens is not None and "max_tokens" in fields:
        kw["max_tokens"] = max_tokens
    if logprobs and "logprobs" in fields:
        kw["logprobs"] = True
    return kw


def join_system(prompt: str, system: str | None) -> str:
    """The single text a completion (non-chat) model receives.

    Args:
        prompt: the user prompt.
        system: an optional system instruction.

    Returns:
        ``system + "\\n\\n" + prompt`` when ``system`` is non-empty, else ``prompt``.
    """
    return f"{system}\n\n{prompt}" if system else prompt


def prompt_input(
    prompt: str, system: str | None, make_message: Callable[[str, str], Any] | None = None
) -> Any:
    """What a model receives for ``prompt`` and ``system``: chat messages or one text.

    Args:
        prompt: the user prompt.
        system: an optional system instruction.
        make_message: for a chat model, ``make_message(role, content)`` builds one framework message
            (``role`` is ``"system"`` or ``"user"``); default ``None`` = a completion (text) model.

    Returns:
        ``[make_message("system", system), make_message("user", prompt)]`` (no system message when
        ``system`` is empty) with ``make_message``, else :func:`join_system` of the two.
    """
    if make_message is None:
        return join_system(prompt, system)
    messages = [make_message("system", system)] if system else []
    messages.append(make_message("user", prompt))
    return messages


def get_field(obj: Any, name: str, default: Any = None) -> Any:
    """``obj[name]`` for a mapping, else ``getattr(obj, name)``; ``default`` when absent or ``obj is None``.

    Args:
        obj: a mapping, an object, or ``None``.
        name: the key or attribute name.
        default: returned when there is no such key / attribute.

    Returns:
        The value, or ``default``.
    """
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def read_token_counts(
    source: Any, prompt_key: str = "prompt_tokens", completion_key: str = "completion_tokens"
) -> tuple[int, int]:
    """Prompt and completion token counts from a usage record (a mapping or an object).

    Args:
        source: e.g. an OpenAI ``usage`` object or dict, LangChain ``usage_metadata``; may be ``None``.
        prompt_key: the name of the prompt count, default ``"prompt_tokens"``.
        completion_key: the name of the completion count, default ``"completion_tokens"``.

    Returns:
        ``(prompt_tokens, completion_tokens)``; a missing, ``None`` or unreadable count is 0.
    """

    def count(key: str) -> int:
        try:
            return int(get_field(source, key) or 0)
        except (TypeError, ValueError):
            return 0

    return count(prompt_key), count(completion_key)


def openai_logprobs(content: Any) -> list[float] | None:
    """Per-token log-probabilities from an OpenAI-format ``logprobs.content`` list.

    Args:
        content: a list of entries with a ``logprob`` key or attribute (dicts or SDK objects), or ``None``.

    Returns:
        One natural-log float per entry, or ``None`` when ``content`` is empty or ``None``.

    Raises:
        KeyError, AttributeError, TypeError, ValueError: an entry has no numeric ``logprob``.
    """
    if not content:
        return None
    return [float(t["logprob"] if isinstance(t, Mapping) else t.logprob) for t in content]


# =========================================================================== core embedder -> framework
def core_embedder(embedder: Any, owner: str) -> Any:
    """The core embedder a framework embeddings class wraps.

    Args:
        embedder: an object with ``embed(texts)``; ``None`` = a new
            :class:`~shared_core.models.local.LocalEmbedder` (all-MiniLM-L6-v2, 384-d, offline).
        owner: the wrapping class's name, for the error message.

    Returns:
        ``embedder``, or the new local embedder.

    Raises:
        InvalidInputError: ``embedder`` has no callable ``embed``.
    """
    if embedder is None:
        from .local import LocalEmbedder

        embedder = LocalEmbedder()
    if not callable(getattr(embedder, "embed", None)):
        raise InvalidInputError(
            f"{owner} needs a core embedder with embed(texts), got {type(embedder).__name__}."
        )
    return embedder


def embed_rows(embedder: Any, texts: Sequence[str]) -> list[list[float]]:
    """Embed ``texts`` with a core embedder, as plain lists (what frameworks expect).

    Args:
        embedder: a core embedder (``embed(texts) -> float32 (n, dim)``).
        texts: the texts.

    Returns:
        One ``list[float]`` per text; ``[]`` for no texts (the embedder is not called).

    Raises:
        Whatever the embedder raises.
    """
    texts = list(texts)
    if not texts:
        return []
    return np.asarray(embedder.embed(texts), dtype=np.float32).tolist()


async def aembed_rows(embedder: Any, texts: Sequence[str]) -> list[list[float]]:
    """Async :func:`embed_rows`: the embedder's ``aembed`` when it has one, else ``embed`` in a thread.

    Args:
        embedder: a core embedder.
        texts: the texts.

    Returns:
        One ``list[float]`` per text; ``[]`` for no texts.

    Raises:
        Whatever the embedder raises.
    """
    texts = list(texts)
    if not texts:
        return []
    aembed = getattr(embedder, "aembed", None)
    if callable(aembed):
        vecs = await aembed(texts)
    else:
        vecs = await asyncio.to_thread(embedder.embed, texts)
    return np.asarray(vecs, dtype=np.float32).tolist()


# =========================================================================== callables -> core embedder
def _describe(fn: Any, kind: str) -> str:
    return f"the {kind} {getattr(fn, '__qualname__', type(fn).__name__)}"


class CallableEmbedder:
    """A batch-embedding function as a core :class:`~shared_core.models.base.Embedder`.

    Args:
        embed_batch: ``embed_batch(list[str]) -> one vector per text`` (a list of lists or an array),
            called once per :meth:`embed` call.
        aembed_batch: optional async form, used by :meth:`aembed`; default ``None`` = run ``embed_batch``
            in a worker thread.
        dim: the vector dimension, if known; default ``None``: learned from the first call (or, when
            :attr:`dim` is read before any call, by embedding one short probe text).
        source: the model in words for error messages, e.g. ``"the LangChain model OpenAIEmbeddings"``;
            default names ``embed_batch``.

    Raises:
        InvalidInputError: ``embed_batch`` (or a given ``aembed_batch``) is not callable, or ``dim`` is
            not a positive integer.

    References:
        Core ``Embedder`` protocol (``shared_core/models/base.py``).
    """

    def __init__(
        self,
        embed_batch: EmbedBatch,
        aembed_batch: AEmbedBatch | None = None,
        *,
        dim: int | None = None,
        source: str | None = None,
    ) -> None:
        if not callable(embed_batch):
            raise InvalidInputError(
                f"embed_batch must be callable (texts -> vectors), got {type(embed_batch).__name__}."
            )
        if aembed_batch is not None and not callable(aembed_batch):
            raise InvalidInputError(
                f"aembed_batch must be callable or None, got {type(aembed_batch).__name__}."
            )
        self._dim = check_dim(dim)
        self._embed_batch = embed_batch
        self._aembed_batch = aembed_batch
        self._source = source or _describe(embed_batch, "embedding function")
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        """Vector dimension (learned from the first call when not given).

        Raises:
            EmbeddingError, ModelError: the probe call failed (only when the dimension is not known yet).
        """
        if self._dim is None:
            self.embed([DIM_PROBE])
        assert self._dim is not None
        return self._dim

    def _texts(self, texts: Sequence[str]) -> list[str]:
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidInputError(f"{type(self).__name__}.embed takes strings, got {type(t).__name__}.")
        return texts

    def _finish(self, raw: Any, n: int) -> np.ndarray:
        arr = validate_embeddings(raw, n, self._dim)
        with self._lock:
            if self._dim is None:
                self._dim = int(arr.shape[1])
            dim = self._dim
        if arr.shape[1] != dim:  # a concurrent first call learned another dimension
            return validate_embeddings(arr, n, dim)
        return arr

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self._dim or 0), dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` with one ``embed_batch`` call.

        Args:
            texts: the texts (strings).

        Returns:
            ``float32`` array of shape ``(len(texts), dim)``; ``(0, dim)`` for an empty list (no call;
            ``(0, 0)`` while the dimension is unknown).

        Raises:
            InvalidInputError: an element is not a string.
            EmbeddingError: the model returned the wrong number of rows, another dimension, or NaN.
            ModelError: the model raised.
        """
        texts = self._texts(texts)
        if not texts:
            return self._empty()
        try:
            raw = self._embed_batch(texts)
        except Exception as e:
            raise wrap_model_error(e, "Embedding", self._source) from e
        return self._finish(raw, len(texts))

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed`: ``aembed_batch`` when given, else ``embed_batch`` in a worker thread.

        Args:
            texts: the texts (strings).

        Returns:
            As :meth:`embed`.

        Raises:
            InvalidInputError, EmbeddingError, ModelError: as :meth:`embed`.
        """
        texts = self._texts(texts)
        if not texts:
            return self._empty()
        try:
            if self._aembed_batch is not None:
                raw = await self._aembed_batch(texts)
            else:
                raw = await asyncio.to_thread(self._embed_batch, texts)
        except Exception as e:
            raise wrap_model_error(e, "Embedding", self._source) from e
        return self._finish(raw, len(texts))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source}, dim={self._dim})"


# =========================================================================== callables -> core LLM
@dataclass(frozen=True)
class Reply:
    """What a completion function returns when it knows more than the text.

    Attributes:
        text: the answer text.
        prompt_tokens: prompt tokens as the provider reported them (0 when unknown).
        completion_tokens: completion tokens as the provider reported them (0 when unknown).
        logprobs: per-token natural-log probabilities of the answer, or ``None``.
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[float] | None = None


#: ``complete(prompt, system, max_tokens, logprobs) -> str | Reply``.
CompleteFn = Callable[[str, Union[str, None], Union[int, None], bool], Union[str, Reply]]
#: Async ``complete``.
ACompleteFn = Callable[[str, Union[str, None], Union[int, None], bool], Awaitable[Union[str, Reply]]]


class CallableLLM(UsageMeter):
    """A completion function as a core :class:`~shared_core.models.base.LLM`.

    The function gets already-checked arguments ``(prompt, system, max_tokens, logprobs)`` and returns the
    answer text, or a :class:`Reply` with token counts and log-probabilities. Each call's usage is
    ``llm_calls`` = 1, the reported tokens, and ``seconds`` = wall time of the call; :attr:`usage` sums
    them. Log-probabilities are returned only when asked for.

    Args:
        complete: the completion function.
        acomplete: optional async form, used by :meth:`acomplete`; default ``None`` = run ``complete``
            in a worker thread.
        source: the model in words for error messages, e.g. ``"the LlamaIndex model OpenAI"``; default
            names ``complete``.

    Attributes:
        usage: cumulative :class:`~shared_core.types.Usage` over all calls (a copy).

    Raises:
        InvalidInputError: ``complete`` (or a given ``acomplete``) is not callable.

    References:
        Core ``LLM`` protocol (``shared_core/models/base.py``).
    """

    def __init__(
        self, complete: CompleteFn, acomplete: ACompleteFn | None = None, *, source: str | None = None
    ) -> None:
        if not callable(complete):
            raise InvalidInputError(f"complete must be callable, got {type(complete).__name__}.")
        if acomplete is not None and not callable(acomplete):
            raise InvalidInputError(f"acomplete must be callable or None, got {type(acomplete).__name__}.")
        self._complete_fn = complete
        self._acomplete_fn = acomplete
        self._source = source or _describe(complete, "completion function")
        self._start_usage()

    def _finish(self, reply: Any, seconds: float, logprobs: bool) -> Completion:
        if isinstance(reply, str):
            reply = Reply(text=reply)
        elif not isinstance(reply, Reply):
            raise ModelError(
                f"Completion with {self._source} returned a {type(reply).__name__}; "
                "expected the answer text (str) or a Reply."
            )
        usage = Usage(
            llm_calls=1,
            prompt_tokens=int(reply.prompt_tokens or 0),
            completion_tokens=int(reply.completion_tokens or 0),
            seconds=seconds,
        )
        lps = [float(x) for x in reply.logprobs] if logprobs and reply.logprobs is not None else None
        self._count(usage)
        return Completion(text=str(reply.text), usage=usage, logprobs=lps)

    def complete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Complete ``prompt`` with one call of the completion function.

        Args:
            prompt: the user prompt (non-empty string).
            system: an optional system instruction.
            max_tokens: cap on completion tokens (the function decides how to honour it).
            logprobs: ask for per-token log-probabilities.

        Returns:
            :class:`~shared_core.types.Completion` with ``text``, ``usage`` and ``logprobs`` (or ``None``).

        Raises:
            InvalidInputError: empty prompt, bad ``system`` or ``max_tokens``.
            ModelError: the model raised, or its answer could not be read.
        """
        check_completion_args(prompt, system, max_tokens)
        t0 = time.perf_counter()
        try:
            reply = self._complete_fn(prompt, system, max_tokens, bool(logprobs))
        except Exception as e:
            raise wrap_model_error(e, "Completion", self._source) from e
        return self._finish(reply, time.perf_counter() - t0, bool(logprobs))

    async def acomplete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Async :meth:`complete`: ``acomplete`` when given, else ``complete`` in a worker thread.

        Args:
            prompt: the user prompt (non-empty string).
            system: an optional system instruction.
            max_tokens: cap on completion tokens.
            logprobs: ask for per-token log-probabilities.

        Returns:
            As :meth:`complete`.

        Raises:
            InvalidInputError, ModelError: as :meth:`complete`.
        """
        check_completion_args(prompt, system, max_tokens)
        args = (prompt, system, max_tokens, bool(logprobs))
        t0 = time.perf_counter()
        try:
            if self._acomplete_fn is not None:
                reply = await self._acomplete_fn(*args)
            else:
                reply = await asyncio.to_thread(self._complete_fn, *args)
        except Exception as e:
            raise wrap_model_error(e, "Completion", self._source) from e
        return self._finish(reply, time.perf_counter() - t0, bool(logprobs))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source})"
