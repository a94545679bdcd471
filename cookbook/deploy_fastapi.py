"""A small web API over hiermem: one memory per user, shared by every worker through PostgreSQL.

Run it (see docs/deployment.md)::

    export HIERMEM_DB=postgresql://app:secret@db.internal:5432/app
    uvicorn cookbook.deploy_fastapi:app --workers 4 --host 0.0.0.0 --port 8000

Endpoints::

    POST   /users/{user}/messages        {"text": ..., "speaker"?: ..., "timestamp"?: ...} -> {"id": ...}
    GET    /users/{user}/recall?q=...&k=10                 -> {"hits": [{"text", "score", "source_ids"}]}
    DELETE /users/{user}/messages/{id}                     -> {"deleted": <number of messages>}
    GET    /healthz                                        -> {"status": "ok"} (liveness only)

Environment:

- ``HIERMEM_DB``: a ``postgresql://`` URL (required).
- ``HIERMEM_MEMORY``: ``segtree`` (default), ``memtree``, ``hat`` or ``xmemory``: the kind of every
  user's memory (the same in every worker; a user stored with another kind gets 503).
- ``HIERMEM_EMBEDDER``: ``local`` (default, the embedded all-MiniLM-L6-v2) or ``hash`` (the
  :class:`HashEmbedder` stub below: for tests only). Every worker must use the same embedder.

hiermem's typed errors become JSON errors ``{"detail": <message>, "error": <class name>}``: bad input
and unknown policies 400, an unknown message id 404, a database failure 503 (retry; the next request
connects again). Every response carries ``X-Worker-Pid``, the pid of the worker that served it.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.middleware.base import RequestResponseEndpoint

from shared_core import HAT, HierarchicalMemory, MemTree, Message, SegTreeMem, XMemory
from shared_core.models.base import Embedder
from shared_core.namespaces import MemoryStore
from shared_core.types import (
    HierMemError,
    InvalidInputError,
    LLMRequiredError,
    NodeNotFoundError,
    PersistenceError,
    UnknownPolicyError,
)

MEMORIES: dict[str, type[HierarchicalMemory]] = {
    "segtree": SegTreeMem,
    "memtree": MemTree,
    "hat": HAT,
    "xmemory": XMemory,
}


class HashEmbedder:
    """TEST ONLY: a deterministic stand-in for a real embedding model (no model to load, no meaning).

    A text's vector is the sum of one pseudo-random 64-d vector per lower-cased word, seeded by the
    word's BLAKE2b digest (not Python's ``hash()``, which differs between processes), so every worker
    computes the same vectors and texts sharing words are similar. Never use it for real recall.
    """

    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One row per text, ``float32``."""
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()) or [text]:
                out[row] += self._word(word)
            if not out[row].any():
                out[row, 0] = 1.0
        return out

    def _word(self, word: str) -> np.ndarray:
        digest = hashlib.blake2b(word.encode("utf-8", "replace"), digest_size=8).digest()
        return np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(self.dim)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed`."""
        return self.embed(texts)


def open_store() -> MemoryStore:
    """The MemoryStore configured by the environment (raises ``RuntimeError`` on a bad setting)."""
    url = os.environ.get("HIERMEM_DB", "").strip()
    if not url:
        raise RuntimeError("Set HIERMEM_DB to a PostgreSQL URL, e.g. postgresql://user:pw@host:5432/db.")
    kind = os.environ.get("HIERMEM_MEMORY", "segtree")
    if kind not in MEMORIES:
        raise RuntimeError(f"HIERMEM_MEMORY must be one of {', '.join(MEMORIES)}, not {kind!r}.")
    embedder: Embedder
    choice = os.environ.get("HIERMEM_EMBEDDER", "local")
    if choice == "local":
        from shared_core.models.local import LocalEmbedder

        embedder = LocalEmbedder()
        embedder.embed(["warm-up"])  # load the model at startup, not on the worker's first request
    elif choice == "hash":
        embedder = HashEmbedder()
    else:
        raise RuntimeError(f"HIERMEM_EMBEDDER must be 'local' or 'hash', not {choice!r}.")
    cls = MEMORIES[kind]
    return MemoryStore(lambda: cls(embedder=embedder), url=url)  # connects now: fails fast


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the store when the worker starts; close its connections when the worker stops."""
    app.state.store = open_store()
    try:
        yield
    finally:
        app.state.store.close()


app = FastAPI(title="hiermem memory API", lifespan=lifespan)


def store_of(request: Request) -> MemoryStore:
    """The worker's MemoryStore."""
    store: MemoryStore = request.app.state.store
    return store


class NewMessage(BaseModel):
    """The body of ``POST /users/{user}/messages``."""

    text: str
    speaker: str | None = None
    timestamp: str | None = None


# hiermem's typed errors -> HTTP status (the first match wins; anything else is a 500).
ERROR_STATUS: list[tuple[type[HierMemError], int]] = [
    (NodeNotFoundError, 404),
    (InvalidInputError, 400),
    (UnknownPolicyError, 400),
    (LLMRequiredError, 400),
    (PersistenceError, 503),
]


@app.exception_handler(HierMemError)
async def hiermem_error(request: Request, exc: Exception) -> JSONResponse:
    """A hiermem error as a JSON error response."""
    status = next((code for cls, code in ERROR_STATUS if isinstance(exc, cls)), 500)
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"detail": str(exc), "error": type(exc).__name__}, status, headers=headers)


@app.middleware("http")
async def worker_pid(request: Request, call_next: RequestResponseEndpoint) -> Response:
    """Name the worker process that served the request (for debugging and the tests)."""
    response = await call_next(request)
    response.headers["X-Worker-Pid"] = str(os.getpid())
    return response


# Plain ``def`` endpoints: FastAPI runs them in a thread pool, so a database round trip never blocks
# the event loop. Each user's memory lives in the namespace ``(user,)``.
@app.post("/users/{user}/messages", status_code=201)
def add_message(user: str, body: NewMessage, request: Request) -> dict[str, str]:
    """Remember a message; answers after it is committed to the database."""
    message_id = uuid.uuid4().hex
    message = Message(body.text, speaker=body.speaker, timestamp=body.timestamp, id=message_id)
    store_of(request).add((user,), message)
    return {"id": message_id}


@app.get("/users/{user}/recall")
def recall(
    user: str,
    request: Request,
    q: str = Query(min_length=1),
    k: int = Query(10, ge=1, le=100),
    policy: str | None = None,
) -> dict[str, list[dict[str, object]]]:
    """The user's memories best matching ``q`` (an unknown user has none)."""
    hits = store_of(request).retrieve((user,), q, k=k, policy=policy)
    return {"hits": [{"text": h.text, "score": h.score, "source_ids": h.source_ids} for h in hits]}


@app.delete("/users/{user}/messages/{message_id}")
def forget(user: str, message_id: str, request: Request) -> dict[str, int]:
    """Forget one message (404 when the user has no message with that id)."""
    return {"deleted": store_of(request).delete((user,), message_id)}


@app.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the worker answers (the database is not asked)."""
    return {"status": "ok"}
