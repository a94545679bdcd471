"""Embedder and LLM clients for the OpenAI API and any OpenAI-compatible server (vLLM, Ollama, LM Studio...).

Both clients use the official ``openai`` SDK (the ``openai`` extra). The SDK retries connection errors,
timeouts, 408/409/429 and 5xx answers with exponential backoff and honours ``Retry-After``; what still
fails afterwards is raised as :class:`~shared_core.types.ModelError` with the provider's error chained.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..types import Completion, EmbeddingError, InvalidInputError, ModelError, Usage
from .base import UsageMeter, validate_embeddings

__all__ = ["KNOWN_EMBEDDING_DIMS", "OpenAIChat", "OpenAIEmbedder"]

#: Output sizes of OpenAI embedding models when no ``dimensions`` is requested.
KNOWN_EMBEDDING_DIMS: dict[str, int] = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}

# Key sent to OpenAI-compatible local servers that do not check it.
_PLACEHOLDER_KEY = "not-needed"
# At most this many embedding batches in flight at once in ``aembed``.
_ASYNC_BATCH_CONCURRENCY = 4
# Models that take ``max_completion_tokens`` and only their default temperature (OpenAI reasoning models).
_REASONING_MODEL = re.compile(r"^(o\d|gpt-5)")


def _openai() -> Any:
    try:
        import openai
    except ImportError:  # pragma: no cover - depends on the environment
        raise ModelError(
            "The OpenAI clients need the 'openai' package: pip install 'hiermem[openai]'."
        ) from None
    return openai


def _model_error(exc: BaseException, what: str, model: str, base_url: str | None) -> ModelError:
    """Turn an SDK / transport / decoding failure into a ModelError whose message says what to do."""
    where = base_url or "the OpenAI API"
    prefix = f"{what} with model {model!r} at {where} failed"
    openai = _openai()
    if isinstance(exc, openai.APITimeoutError):
        hint = "the request timed out after the configured retries; raise `timeout` or `max_retries`"
    elif isinstance(exc, openai.APIConnectionError):
        hint = "could not connect; check `base_url` and that the server is running"
    elif isinstance(exc, openai.AuthenticationError):
        hint = "the API key was rejected; set OPENAI_API_KEY or pass `api_key`"
    elif isinstance(exc, openai.PermissionDeniedError):
        hint = "the key may not use this model; check the model name and your account"
    elif isinstance(exc, openai.NotFoundError):
        hint = "not found; check the model name and `base_url` (it usually ends in /v1)"
    elif isinstance(exc, openai.RateLimitError):
        hint = "rate limited after the configured retries; slow down or raise `max_retries`"
    elif isinstance(exc, openai.BadRequestError):
        hint = "the provider rejected the request; check the model's supported parameters"
    elif isinstance(exc, openai.APIStatusError):
        hint = f"the provider answered HTTP {exc.status_code} after the configured retries"
    elif isinstance(
        exc, (openai.APIResponseValidationError, ValueError, KeyError, AttributeError, TypeError)
    ):
        hint = "the provider's answer was not a valid OpenAI-protocol response (truncated or malformed)"
    else:
        hint = "unexpected provider error"
    return ModelError(f"{prefix}: {hint}. Cause: {type(exc).__name__}: {exc}")


class _ClientFactory:
    """Creates the sync client once and one async client per event loop, lazily and thread-safely.

    ``httpx`` async connection pools are bound to the loop that opened them, so an ``AsyncOpenAI``
    is cached per running loop (a new ``asyncio.run`` gets a fresh client) and dropped once its loop
    is closed.
    """

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None,
        timeout: float,
        max_retries: int,
        client: Any,
        async_client: Any,
    ) -> None:
        self.api_key = api_key
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self._client = client
        self._fixed_async = async_client
        self._async: dict[asyncio.AbstractEventLoop, Any] = {}
        self._lock = threading.Lock()

    @property
    def effective_base_url(self) -> str | None:
        """The endpoint used, for error messages: argument, a given client's, ``OPENAI_BASE_URL``."""
        given = self._client if self._client is not None else self._fixed_async
        if self.base_url is None and given is not None and getattr(given, "base_url", None) is not None:
            return str(given.base_url)
        return self.base_url or os.environ.get("OPENAI_BASE_URL") or None

    def _kwargs(self) -> dict[str, Any]:
        key = self.api_key or os.environ.get("OPENAI_API_KEY")
        base_url = self.effective_base_url
        if not key:
            if base_url is None:
                raise ModelError(
                    "No OpenAI API key: set the OPENAI_API_KEY environment variable or pass api_key=...; "
                    "for a local OpenAI-compatible server pass base_url=... instead."
                )
            key = _PLACEHOLDER_KEY
        return {
            "api_key": key,
            "base_url": base_url,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
        }

    def sync(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = _openai().OpenAI(**self._kwargs())
        return self._client

    def async_(self) -> Any:
        if self._fixed_async is not None:
            return self._fixed_async
        loop = asyncio.get_running_loop()
        with self._lock:
            # A client's open connections keep its loop alive, so prune the clients of closed loops.
            for dead in [lp for lp in self._async if lp.is_closed()]:
                del self._async[dead]
            c = self._async.get(loop)
            if c is None:
                c = _openai().AsyncOpenAI(**self._kwargs())
                self._async[loop] = c
        return c

    def close(self) -> None:
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            c.close()

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            c = self._async.pop(loop, None)
        if c is not None:
            await c.close()


def _check_timeout_retries(timeout: float, max_retries: int) -> None:
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise InvalidInputError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    if not (isinstance(max_retries, int) and max_retries >= 0):
        raise InvalidInputError(f"max_retries must be an int >= 0, got {max_retries!r}.")


# =========================================================================== embedder
class OpenAIEmbedder(UsageMeter):
    """Embeddings from the OpenAI embeddings endpoint (or any OpenAI-compatible server).

    Implements the :class:`~shared_core.models.base.Embedder` protocol. Texts are sent in batches of
    ``batch_size`` (one request per batch, ``encoding_format="float"`` for compatibility with local
    servers); rows come back in input order.

    Args:
        model: embedding model name, default ``"text-embedding-3-small"``.
        api_key: API key; default the ``OPENAI_API_KEY`` environment variable. When neither is set but a
            ``base_url`` is (argument or ``OPENAI_BASE_URL``), a placeholder key is sent so local servers
            work; with neither, the first request raises :class:`ModelError`.
        base_url: endpoint root of an OpenAI-compatible server, e.g. ``"http://localhost:8000/v1"``;
            default the OpenAI API.
        dimensions: ask the provider for vectors of this size (``text-embedding-3-*`` support it); it is
            sent with every request and becomes :attr:`dim`.
        dim: the expected vector size when not requesting ``dimensions`` (e.g. for a local model). When
            both are omitted, known OpenAI models give their size (3-small 1536, 3-large 3072, ada-002
            1536); otherwise the size is learned from the first response.
        timeout: seconds per HTTP request, default 30.0.
        max_retries: SDK retries (exponential backoff, honouring ``Retry-After``), default 3.
        batch_size: texts per request, default 256 (the API accepts up to 2048).
        client: a ready ``openai.OpenAI`` to use instead of creating one.
        async_client: a ready ``openai.AsyncOpenAI`` to use instead of creating one per event loop
            (its connection pool belongs to one event loop; use it from that loop only).

    Attributes:
        usage: cumulative :class:`Usage` (``embed_calls`` = requests, ``embedded_texts``,
            ``prompt_tokens`` as reported, ``seconds`` wall time); a copy, see :meth:`reset_usage`.

    Raises:
        InvalidInputError: a bad ``batch_size`` / ``timeout`` / ``max_retries`` / ``dim``.

    References:
        OpenAI API reference, "Create embeddings" (``POST /v1/embeddings``).
    """

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        dimensions: int | None = None,
        dim: int | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        batch_size: int = 256,
        client: Any = None,
        async_client: Any = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError("model must be a non-empty model name, e.g. 'text-embedding-3-small'.")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise InvalidInputError(f"batch_size must be an int >= 1, got {batch_size!r}.")
        for name, v in (("dimensions", dimensions), ("dim", dim)):
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise InvalidInputError(f"{name} must be a positive int, got {v!r}.")
        if dimensions is not None and dim is not None and dimensions != dim:
            raise InvalidInputError(f"dimensions={dimensions} and dim={dim} disagree; pass only one of them.")
        _check_timeout_retries(timeout, max_retries)
        self.model = model
        self.dimensions = dimensions
        self.batch_size = batch_size
        self._dim: int | None = dimensions or dim or KNOWN_EMBEDDING_DIMS.get(model)
        self._clients = _ClientFactory(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            client=client,
            async_client=async_client,
        )
        self._start_usage()

    # ------------------------------------------------------------------ properties
    @property
    def dim(self) -> int:
        """Vector dimension. When it is not known yet, one short probe request learns it."""
        if self._dim is None:
            self.embed(["dimension probe"])
        assert self._dim is not None
        return self._dim

    # ------------------------------------------------------------------ helpers
    def _check_texts(self, texts: Sequence[str]) -> list[str]:
        if isinstance(texts, str):
            raise InvalidInputError("embed() takes a sequence of strings; wrap a single text as [text].")
        out = list(texts)
        for i, t in enumerate(out):
            if not isinstance(t, str):
                raise InvalidInputError(f"Text {i} is a {type(t).__name__}; embed() takes strings.")
            if not t:
                raise InvalidInputError(f"Text {i} is empty; the embeddings API rejects empty strings.")
        return out

    def _params(self, batch: list[str]) -> dict[str, Any]:
        p: dict[str, Any] = {"model": self.model, "input": batch, "encoding_format": "float"}
        if self.dimensions is not None:
            p["dimensions"] = self.dimensions
        return p

    def _rows(self, resp: Any, n: int) -> list[list[float]]:
        try:
            data = sorted(resp.data, key=lambda d: d.index)
            rows = [list(d.embedding) for d in data]
        except Exception as e:
            raise _model_error(e, "Embedding", self.model, self._clients.effective_base_url) from e
        if len(rows) != n:
            raise ModelError(
                f"Embedding with model {self.model!r} returned {len(rows)} vectors for {n} texts; "
                "the server does not follow the OpenAI protocol."
            )
        return rows

    def _record(self, n_texts: int, resp: Any, seconds: float) -> None:
        tokens = getattr(getattr(resp, "usage", None), "prompt_tokens", None) or 0
        self._count(Usage(embed_calls=1, embedded_texts=n_texts, prompt_tokens=tokens, seconds=seconds))

    def _finish(self, parts: list[list[list[float]]], n: int) -> np.ndarray:
        arr = validate_embeddings([r for part in parts for r in part], n, self._dim)
        if arr.shape[1] == 0:
            raise EmbeddingError(f"Embedding model {self.model!r} returned empty vectors; check the model.")
        if self._dim is None:
            self._dim = int(arr.shape[1])
        return arr

    def _batches(self, texts: list[str]) -> list[list[str]]:
        return [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]

    # ------------------------------------------------------------------ public
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``, one request per batch of ``batch_size``.

        Args:
            texts: the strings to embed (non-empty strings).

        Returns:
            ``float32`` array of shape ``(len(texts), dim)`` in input order (``(0, dim)`` when empty).

        Raises:
            InvalidInputError: a non-string or empty string in ``texts``.
            ModelError: the provider failed after the SDK's retries, or answered malformed data.
            EmbeddingError: vectors of the wrong dimension or with NaN/inf values.
        """
        texts = self._check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts: list[list[list[float]]] = []
        for batch in self._batches(texts):
            client = self._clients.sync()
            t0 = time.perf_counter()
            try:
                resp = client.embeddings.create(**self._params(batch))
            except Exception as e:
                raise _model_error(e, "Embedding", self.model, self._clients.effective_base_url) from e
            self._record(len(batch), resp, time.perf_counter() - t0)
            parts.append(self._rows(resp, len(batch)))
        return self._finish(parts, len(texts))

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed`; up to 4 batches are in flight at once, rows stay in input order.

        Returns / Raises: as :meth:`embed`.
        """
        texts = self._check_texts(texts)
        if not texts:
            if self._dim is None:
                await self.aembed(["dimension probe"])
            return np.zeros((0, self.dim), dtype=np.float32)
        sem = asyncio.Semaphore(_ASYNC_BATCH_CONCURRENCY)
        client = self._clients.async_()

        async def one(batch: list[str]) -> list[list[float]]:
            async with sem:
                t0 = time.perf_counter()
                try:
                    resp = await client.embeddings.create(**self._params(batch))
                except Exception as e:
                    raise _model_error(e, "Embedding", self.model, self._clients.effective_base_url) from e
                self._record(len(batch), resp, time.perf_counter() - t0)
                return self._rows(resp, len(batch))

        parts = await asyncio.gather(*(one(b) for b in self._batches(texts)))
        return self._finish(list(parts), len(texts))

    def close(self) -> None:
        """Close the sync HTTP client (it is re-created on the next call)."""
        self._clients.close()

    async def aclose(self) -> None:
        """Close the async HTTP client of the running event loop (re-created on the next call).

        Call it before a short-lived event loop ends (e.g. at the end of the coroutine given to
        ``asyncio.run``) to release its connections cleanly; a client passed as ``async_client`` is
        left to its owner.
        """
        await self._clients.aclose()

    def __repr__(self) -> str:
        extra = f", dimensions={self.dimensions}" if self.dimensions else ""
        return f"OpenAIEmbedder(model={self.model!r}{extra}, base_url={self._clients.base_url!r})"


# =========================================================================== chat
class OpenAIChat(UsageMeter):
    """Chat completions from the OpenAI API (or any OpenAI-compatible server) as an :class:`LLM`.

    Each call sends one user message (and an optional system message) and returns a
    :class:`~shared_core.types.Completion` whose ``usage`` has ``llm_calls=1``, the prompt and
    completion tokens the provider reported (0 when it reports none) and the wall-clock ``seconds``
    (retries included). A ``null`` answer content becomes ``""``.

    Args:
        model: chat model name, default ``"gpt-4o-mini"``.
        api_key: API key; default ``OPENAI_API_KEY``. Without both a key and a ``base_url`` the first
            call raises :class:`ModelError`; with a ``base_url`` but no key a placeholder key is sent.
        base_url: endpoint root of an OpenAI-compatible server; default the OpenAI API.
        temperature: sampling temperature, default 0.0 (deterministic decisions). For OpenAI reasoning
            models (``o1``/``o3``/``o4``/``gpt-5`` families), which accept only their default temperature,
            it is not sent and ``max_tokens`` is sent as ``max_completion_tokens``.
        timeout: seconds per HTTP request, default 60.0.
        max_retries: SDK retries (exponential backoff, honouring ``Retry-After``), default 3.
        client: a ready ``openai.OpenAI`` to use instead of creating one.
        async_client: a ready ``openai.AsyncOpenAI`` to use instead of creating one per event loop
            (its connection pool belongs to one event loop; use it from that loop only).

    Attributes:
        usage: cumulative :class:`Usage` over all calls (a copy), see :meth:`reset_usage`.

    Raises:
        InvalidInputError: a bad ``timeout`` / ``max_retries`` / ``temperature``.

    References:
        OpenAI API reference, "Create chat completion" (``POST /v1/chat/completions``), ``logprobs``.
    """

    def __init__(
        self,
        model: str = "gpt-4o-mini",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        temperature: float = 0.0,
        timeout: float = 60.0,
        max_retries: int = 3,
        client: Any = None,
        async_client: Any = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError("model must be a non-empty model name, e.g. 'gpt-4o-mini'.")
        if not isinstance(temperature, (int, float)) or not (0.0 <= temperature <= 2.0):
            raise InvalidInputError(f"temperature must be a number in [0, 2], got {temperature!r}.")
        _check_timeout_retries(timeout, max_retries)
        self.model = model
        self.temperature = float(temperature)
        self._clients = _ClientFactory(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            client=client,
            async_client=async_client,
        )
        self._start_usage()

    # ------------------------------------------------------------------ helpers
    def _params(
        self, prompt: str, system: str | None, max_tokens: int | None, logprobs: bool
    ) -> dict[str, Any]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("prompt must be a non-empty string.")
        if system is not None and not isinstance(system, str):
            raise InvalidInputError(f"system must be a string or None, got {type(system).__name__}.")
        if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens >= 1):
            raise InvalidInputError(f"max_tokens must be a positive int or None, got {max_tokens!r}.")
        messages: list[dict[str, str]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        p: dict[str, Any] = {"model": self.model, "messages": messages}
        reasoning = bool(_REASONING_MODEL.match(self.model))
        if not reasoning:
            p["temperature"] = self.temperature
        if max_tokens is not None:
            p["max_completion_tokens" if reasoning else "max_tokens"] = max_tokens
        if logprobs:
            p["logprobs"] = True
        return p

    def _completion(self, resp: Any, seconds: float, logprobs: bool) -> Completion:
        try:
            choice = resp.choices[0]
            text = choice.message.content or ""
            # a lone surrogate from the provider would make every later prompt quoting it unencodable
            text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
            lps: list[float] | None = None
            if logprobs:
                content = getattr(getattr(choice, "logprobs", None), "content", None)
                if content:
                    lps = [float(t.logprob) for t in content]
            u = getattr(resp, "usage", None)
            prompt_tokens = int(getattr(u, "prompt_tokens", 0) or 0)
            completion_tokens = int(getattr(u, "completion_tokens", 0) or 0)
        except Exception as e:
            raise _model_error(e, "Chat completion", self.model, self._clients.effective_base_url) from e
        usage = Usage(
            llm_calls=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, seconds=seconds
        )
        self._count(usage)
        return Completion(text=text, usage=usage, logprobs=lps)

    # ------------------------------------------------------------------ public
    def complete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Complete ``prompt`` with one chat request.

        Args:
            prompt: the user message (non-empty string).
            system: an optional system message, sent first.
            max_tokens: cap on completion tokens; default ``None`` (the provider's default).
            logprobs: ask for per-token log-probabilities of the answer.

        Returns:
            :class:`Completion` with ``text``, ``usage`` and ``logprobs`` (natural-log floats, one per
            answer token, or ``None`` when not asked for or the server gave none).

        Raises:
            InvalidInputError: empty prompt or bad ``max_tokens``.
            ModelError: no API key, or the provider failed after the SDK's retries (timeouts, connection
                errors, HTTP errors, malformed answers).
        """
        params = self._params(prompt, system, max_tokens, logprobs)
        client = self._clients.sync()
        t0 = time.perf_counter()
        try:
            resp = client.chat.completions.create(**params)
        except Exception as e:
            raise _model_error(e, "Chat completion", self.model, self._clients.effective_base_url) from e
        return self._completion(resp, time.perf_counter() - t0, logprobs)

    async def acomplete(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Async :meth:`complete`. Args / Returns / Raises: as :meth:`complete`."""
        params = self._params(prompt, system, max_tokens, logprobs)
        client = self._clients.async_()
        t0 = time.perf_counter()
        try:
            resp = await client.chat.completions.create(**params)
        except Exception as e:
            raise _model_error(e, "Chat completion", self.model, self._clients.effective_base_url) from e
        return self._completion(resp, time.perf_counter() - t0, logprobs)

    def close(self) -> None:
        """Close the sync HTTP client (it is re-created on the next call)."""
        self._clients.close()

    async def aclose(self) -> None:
        """Close the async HTTP client of the running event loop (re-created on the next call).

        Call it before a short-lived event loop ends (e.g. at the end of the coroutine given to
        ``asyncio.run``) to release its connections cleanly; a client passed as ``async_client`` is
        left to its owner.
        """
        await self._clients.aclose()

    def __repr__(self) -> str:
        return f"OpenAIChat(model={self.model!r}, base_url={self._clients.base_url!r})"
