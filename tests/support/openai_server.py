"""A scriptable OpenAI-protocol HTTP server for tests (chat completions and embeddings).

Usage::

    from tests.support.openai_server import Reply, openai_server  # the fixture

    def test_x(openai_server):
        openai_server.script_chat("first answer", Reply(status=429, headers={"Retry-After": "0.01"}))
        llm = OpenAIChat("test-model", base_url=openai_server.base_url)
        ...
        assert openai_server.chat_requests()[0]["messages"][-1]["content"] == "..."

Replies are served from a queue in order; when it is empty, chat answers ``default_chat`` (a string or a
callable ``request_json -> str | Reply``, default ``"OK"``) and embeddings are deterministic unit
vectors from a hash of each text (``embed_dim`` dimensions, default 8, or the request's ``dimensions``).
Every request body is recorded. Tokens are counted by whitespace split. An embeddings ``input`` may be
token arrays (lists of token ids), as the OpenAI API allows; each is embedded as its ids joined by spaces.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union

import numpy as np
import pytest

__all__ = ["OpenAITestServer", "Reply", "hash_embedding", "openai_server"]

# Longest delay a scripted reply may ask for, in seconds (keeps every test bounded).
MAX_DELAY = 10.0


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        text: chat completion text; ``None`` with status 200 sends ``"content": null``.
        status: HTTP status, default 200. A non-200 status without ``raw_body`` sends an
            OpenAI-style ``{"error": {...}}`` body.
        headers: extra response headers, e.g. ``{"Retry-After": "0.05"}``.
        raw_body: exact response body (str or bytes) sent instead of the generated JSON, e.g. a
            truncated document; ``Content-Type`` stays ``application/json``.
        delay: seconds to wait before answering (at most 10; cut short when the server closes).
        logprobs: per-token log-probabilities to report when the request asks for them (default -0.1
            per whitespace token of ``text``).
        embeddings: vectors to return for an embeddings request (default: hash vectors).
    """

    text: str | None = None
    status: int = 200
    headers: dict[str, str] | None = None
    raw_body: str | bytes | None = None
    delay: float = 0.0
    logprobs: list[float] | None = None
    embeddings: list[list[float]] | None = None


ChatDefault = Union[str, Callable[[dict[str, Any]], Union[str, Reply]]]


def _tokens(text: str) -> list[str]:
    return text.split()


def _is_token_array(value: Any) -> bool:
    """A non-empty list of token ids, as the embeddings endpoint accepts besides strings."""
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def hash_embedding(text: str, dim: int) -> list[float]:
    """Deterministic unit vector of length ``dim`` from a SHA-256 hash of ``text``."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim)
    v /= np.linalg.norm(v)
    return [float(x) for x in v]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class OpenAITestServer:
    """``ThreadingHTTPServer`` on 127.0.0.1 (free port) speaking enough of the OpenAI protocol for tests.

    Endpoints: ``POST /v1/chat/completions``, ``POST /v1/embeddings`` (also without ``/v1``),
    ``GET /v1/models``.

    Attributes:
        base_url: ``"http://127.0.0.1:PORT/v1"``.
        requests: ``(path, json_body)`` of every request, in arrival order.
        default_chat: answer when the chat queue is empty (str or callable ``request -> str | Reply``).
        embed_dim: dimension of hash embeddings when the request gives no ``dimensions`` (default 8).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._chat: deque[str | Reply] = deque()
        self._embed: deque[Reply | list[list[float]]] = deque()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.default_chat: ChatDefault = "OK"
        self.embed_dim = 8
        self._n = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ scripting
    def script_chat(self, *replies: str | Reply) -> None:
        """Queue chat replies (a str is the completion text), served in order."""
        for r in replies:
            if not isinstance(r, (str, Reply)):
                raise TypeError(f"A chat reply is a str or a Reply, got {type(r).__name__}.")
        with self._lock:
            self._chat.extend(replies)

    def script_embed(self, *replies: Reply | list[list[float]]) -> None:
        """Queue embeddings replies (a list of vectors, or a Reply), served in order."""
        for r in replies:
            if not isinstance(r, (Reply, list)):
                raise TypeError(
                    f"An embeddings reply is a list of vectors or a Reply, got {type(r).__name__}."
                )
        with self._lock:
            self._embed.extend(replies)

    def reset(self) -> None:
        """Clear both queues and the request record; restore ``default_chat`` and ``embed_dim``."""
        with self._lock:
            self._chat.clear()
            self._embed.clear()
            self.requests.clear()
            self.default_chat = "OK"
            self.embed_dim = 8

    def requests_to(self, endpoint: str) -> list[dict[str, Any]]:
        """Bodies of the recorded requests whose path ends with ``endpoint`` (e.g. ``"/embeddings"``)."""
        with self._lock:
            return [body for path, body in self.requests if path.rstrip("/").endswith(endpoint)]

    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies of the recorded chat-completion requests."""
        return self.requests_to("/chat/completions")

    def embed_requests(self) -> list[dict[str, Any]]:
        """Bodies of the recorded embeddings requests."""
        return self.requests_to("/embeddings")

    @property
    def pending(self) -> int:
        """Scripted replies not served yet (chat + embeddings)."""
        with self._lock:
            return len(self._chat) + len(self._embed)

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OpenAITestServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ answers
    def _next_id(self) -> int:
        with self._lock:
            self._n += 1
            return self._n

    def _chat_reply(self, req: dict[str, Any]) -> Reply:
        with self._lock:
            r = self._chat.popleft() if self._chat else None
            default = self.default_chat
        if r is None:
            r = default(req) if callable(default) else default
        return Reply(text=r) if isinstance(r, str) else r

    def _chat_body(self, req: dict[str, Any], r: Reply) -> dict[str, Any]:
        text = r.text
        prompt_tokens = sum(
            len(_tokens(_content_text(m.get("content"))))
            for m in req.get("messages", [])
            if isinstance(m, dict)
        )
        toks = _tokens(text or "")
        logprobs = None
        if req.get("logprobs"):
            values = r.logprobs if r.logprobs is not None else [-0.1] * len(toks)
            logprobs = {
                "content": [
                    {
                        "token": toks[i] if i < len(toks) else "",
                        "logprob": float(lp),
                        "bytes": list((toks[i] if i < len(toks) else "").encode("utf-8")),
                        "top_logprobs": [],
                    }
                    for i, lp in enumerate(values)
                ]
            }
        return {
            "id": f"chatcmpl-test-{self._next_id()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model", "test-model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(toks),
                "total_tokens": prompt_tokens + len(toks),
            },
        }

    def _embed_reply(self) -> Reply:
        with self._lock:
            r = self._embed.popleft() if self._embed else None
        if r is None:
            return Reply()
        return Reply(embeddings=r) if isinstance(r, list) else r

    def _embed_body(self, req: dict[str, Any], r: Reply) -> dict[str, Any]:
        inputs = req.get("input")
        if isinstance(inputs, str) or _is_token_array(inputs):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) or _is_token_array(t) for t in inputs):
            raise _BadRequest("'input' must be a string, a list of strings or token arrays.")
        # token arrays (what LangChain's OpenAIEmbeddings sends) are embedded as their text form
        inputs = [t if isinstance(t, str) else " ".join(map(str, t)) for t in inputs]
        if any(t == "" for t in inputs):
            raise _BadRequest("'input' must not contain empty strings.")
        dim = req.get("dimensions") or self.embed_dim
        vecs = r.embeddings if r.embeddings is not None else [hash_embedding(t, dim) for t in inputs]
        b64 = req.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": (
                    base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") if b64 else v
                ),
            }
            for i, v in enumerate(vecs)
        ]
        n_tokens = sum(len(_tokens(t)) for t in inputs)
        return {
            "object": "list",
            "data": data,
            "model": req.get("model", "test-embedding"),
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    # ------------------------------------------------------------------ HTTP
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, format: str, *args: Any) -> None:  # silence stderr
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

            def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
                kind = {
                    400: "invalid_request_error",
                    401: "authentication_error",
                    404: "not_found_error",
                    429: "rate_limit_error",
                }.get(status, "server_error")
                body = {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
                self._send(status, json.dumps(body).encode(), headers)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    data = [{"id": "test-model", "object": "model", "created": 0, "owned_by": "tests"}]
                    self._send(200, json.dumps({"object": "list", "data": data}).encode())
                else:
                    self._error(404, f"Unknown path {self.path}")

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0].rstrip("/")
                try:
                    req = json.loads(raw or b"{}")
                    if not isinstance(req, dict):
                        raise ValueError("not an object")
                except ValueError:
                    self._error(400, "The request body is not a JSON object.")
                    return
                with server._lock:
                    server.requests.append((path, req))
                if path in ("/v1/chat/completions", "/chat/completions"):
                    r = server._chat_reply(req)
                    make = server._chat_body
                elif path in ("/v1/embeddings", "/embeddings"):
                    r = server._embed_reply()
                    make = server._embed_body
                else:
                    self._error(404, f"Unknown path {path}")
                    return
                if r.delay > 0:
                    server._closing.wait(min(float(r.delay), MAX_DELAY))
                if r.raw_body is not None:
                    body = r.raw_body.encode() if isinstance(r.raw_body, str) else r.raw_body
                    self._send(r.status, body, r.headers)
                elif r.status != 200:
                    self._error(r.status, r.text or f"scripted HTTP {r.status}", r.headers)
                else:
                    try:
                        payload = make(req, r)
                    except _BadRequest as e:
                        self._error(400, str(e))
                        return
                    self._send(200, json.dumps(payload).encode(), r.headers)

        return Handler


class _BadRequest(Exception):
    pass


# --------------------------------------------------------------------------- fixture
_SHARED: OpenAITestServer | None = None
_SHARED_LOCK = threading.Lock()


def shared_server() -> OpenAITestServer:
    """The process-wide server behind the ``openai_server`` fixture (started on first use)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = OpenAITestServer()
            atexit.register(_SHARED.close)
        return _SHARED


@pytest.fixture
def openai_server() -> Any:
    """A reset :class:`OpenAITestServer` (one server per test process, cleared before and after each test)."""
    server = shared_server()
    server.reset()
    yield server
    server.reset()
