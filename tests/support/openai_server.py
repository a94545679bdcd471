"""The scriptable OpenAI-protocol HTTP server as a pytest fixture (chat completions and embeddings).

Usage::

    from tests.support.openai_server import Reply, openai_server  # the fixture

    def test_x(openai_server):
        openai_server.script_chat("first answer", Reply(status=429, headers={"Retry-After": "0.01"}))
        llm = OpenAIChat("test-model", base_url=openai_server.base_url)
        ...
        assert openai_server.chat_requests()[0]["messages"][-1]["content"] == "..."

The server itself is :class:`shared_core.bench.openai_server.ScriptedOpenAIServer` (``hiermem bench
--llm-cost`` uses it too); see its module for the scripting API.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

import pytest

from shared_core.bench.openai_server import MAX_DELAY, Reply, ScriptedOpenAIServer, hash_embedding

__all__ = ["MAX_DELAY", "OpenAITestServer", "Reply", "hash_embedding", "openai_server", "shared_server"]

OpenAITestServer = ScriptedOpenAIServer

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
