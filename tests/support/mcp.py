"""Starting the MCP server over HTTP and reading its replies, for the MCP tests."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.support import ROOT

#: generous: the server loads torch and the embedder on a loaded 2-core machine
TIMEOUT = 120


SERVER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
}


async def _ok(client: Client, tool: str, args: dict[str, Any] | None = None) -> Any:
    """Call a tool that must succeed; its structured result (unwrapped from ``{"result": ...}``)."""
    res = await client.call_tool(tool, args or {})
    text = " ".join(getattr(c, "text", "") for c in res.content)
    assert not res.is_error, f"{tool}({args}) failed: {text}"
    out = res.structured_content
    assert out is not None
    return out["result"] if tool != "memory_stats" else out


async def _error(client: Client, tool: str, args: dict[str, Any]) -> str:
    """Call a tool that must fail with an MCP tool error; its message. The server must keep answering."""
    res = await client.call_tool(tool, args)
    assert res.is_error, f"{tool}({args}) should have failed, got {res.structured_content}"
    text = " ".join(getattr(c, "text", "") for c in res.content)
    assert text
    assert isinstance(await _ok(client, "list_namespaces"), list)  # still serving
    return text


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the HTTP server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"the HTTP server did not listen within {TIMEOUT} s:\n{log.read_text(errors='replace')}")


TOOLS = {"remember", "recall", "forget", "list_namespaces", "memory_stats"}


ALICE = [
    ("I adopted a beagle puppy and named her Luna.", "alice", "2024-01-10T09:00:00"),
    ("My favourite food is spicy Thai green curry.", "alice", "2024-02-14T19:30:00"),
    ("I work as a structural engineer designing bridges.", "alice", "2024-03-02T08:15:00"),
    ("Next summer I am travelling to Japan to see Kyoto temples.", "alice", "2024-04-21T17:45:00"),
]


BOB = [
    ("I play the cello in a community orchestra.", "bob", "2024-01-05T20:00:00"),
    ("My cat Whiskers hates the vacuum cleaner.", "bob", "2024-02-01T10:00:00"),
]


def _ids(hits: list[dict[str, Any]]) -> set[str]:
    return {s for h in hits for s in h["source_ids"]}


async def _remember_all(client: Client, ns: str, msgs: list[tuple[str, str, str]]) -> list[str]:
    ids = []
    for text, speaker, ts in msgs:
        mid = await _ok(
            client, "remember", {"namespace": ns, "text": text, "speaker": speaker, "timestamp": ts}
        )
        assert isinstance(mid, str) and mid
        ids.append(mid)
    assert len(set(ids)) == len(ids)
    return ids
