"""``hiermem mcp`` as a process: over stdio (the server as a subprocess, as an MCP client runs it), over
streamable HTTP, and the command's refusal of bad options. All on the real embedded local embedder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp", reason='the MCP SDK is not installed (pip install "hiermem[mcp]")')

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from tests.support.mcp import (
    ALICE,
    BOB,
    ROOT,
    SERVER_ENV,
    TIMEOUT,
    TOOLS,
    _error,
    _free_port,
    _ids,
    _ok,
    _remember_all,
    _wait_listening,
)


def _stdio(*args: str) -> StdioServerParameters:
    """The server as an MCP client launches it: this interpreter, ``-m shared_core.cli mcp ...``."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "shared_core.cli", "mcp", *args],
        env=SERVER_ENV,
        cwd=str(ROOT),
    )


async def test_stdio_durable_store(tmp_path: Path) -> None:
    store = tmp_path / "memories"
    with anyio.fail_after(TIMEOUT):
        async with Client(_stdio("--store", str(store)), read_timeout_seconds=TIMEOUT) as client:
            # the tools and their argument schemas
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            expect = {
                "remember": (["namespace", "text", "speaker", "timestamp"], ["namespace", "text"]),
                "recall": (
                    [
                        "namespace",
                        "query",
                        "k",
                        "policy",
                        "time_range_start",
                        "time_range_end",
                        "as_of",
                        "min_score",
                    ],
                    ["namespace", "query"],
                ),
                "forget": (["namespace", "id"], ["namespace", "id"]),
                "list_namespaces": ([], []),
                "memory_stats": (["namespace"], ["namespace"]),
            }
            for name, (props, required) in expect.items():
                schema = tools[name].input_schema
                assert list(schema.get("properties", {})) == props, name
                assert sorted(schema.get("required", [])) == sorted(required), name
                assert tools[name].description
            recall_props = tools["recall"].input_schema["properties"]
            assert recall_props["k"]["type"] == "integer" and recall_props["k"]["default"] == 10
            assert tools["recall"].annotations is not None and tools["recall"].annotations.read_only_hint

            assert await _ok(client, "list_namespaces") == []
            alice = await _remember_all(client, "alice", ALICE)
            bob = await _remember_all(client, "bob", BOB)
            assert await _ok(client, "list_namespaces") == ["alice", "bob"]

            # recall: ranked, the obvious message first, with its id, timestamp and speaker
            hits = await _ok(client, "recall", {"namespace": "alice", "query": "What is my dog's name?"})
            assert hits and "Luna" in hits[0]["text"]
            assert hits[0]["is_leaf"] and hits[0]["source_ids"] == [alice[0]]
            assert hits[0]["timestamp"] == ALICE[0][2] and hits[0]["speaker"] == "alice"
            assert hits[0]["span"] == [0, 0]
            scores = [h["score"] for h in hits]
            assert scores == sorted(scores, reverse=True)
            hits = await _ok(client, "recall", {"namespace": "alice", "query": "Thai curry", "k": 1})
            assert len(hits) == 1 and hits[0]["source_ids"] == [alice[1]]
            for policy in ("collapsed", "top_down", "bottom_up"):
                hits = await _ok(
                    client, "recall", {"namespace": "alice", "query": "bridge engineer", "policy": policy}
                )
                assert alice[2] in _ids(hits), policy

            # namespaces are isolated
            hits = await _ok(client, "recall", {"namespace": "bob", "query": "What is my dog's name?"})
            assert _ids(hits) <= set(bob) and not any("Luna" in h["text"] for h in hits)
            hits = await _ok(client, "recall", {"namespace": "alice", "query": "cello orchestra"})
            assert _ids(hits) <= set(alice) and not any("cello" in h["text"] for h in hits)
            # a namespace that does not exist has no hits and is not created by a read
            assert await _ok(client, "recall", {"namespace": "carol", "query": "dog"}) == []
            assert await _ok(client, "list_namespaces") == ["alice", "bob"]

            stats = await _ok(client, "memory_stats", {"namespace": "alice"})
            assert stats["messages"] == 4 and stats["leaves"] == 4 and stats["kind"] == "segtree"
            assert stats["policies"] == ["collapsed", "top_down", "bottom_up"]
            assert (await _ok(client, "memory_stats", {"namespace": "bob"}))["messages"] == 2

            # forget
            assert await _ok(client, "forget", {"namespace": "alice", "id": alice[0]}) == 1
            hits = await _ok(client, "recall", {"namespace": "alice", "query": "What is my dog's name?"})
            assert alice[0] not in _ids(hits) and not any("Luna" in h["text"] for h in hits)
            assert (await _ok(client, "memory_stats", {"namespace": "alice"}))["messages"] == 3
            assert (await _ok(client, "memory_stats", {"namespace": "bob"}))["messages"] == 2

            # bad arguments: MCP tool errors with a clear message; the server keeps answering
            msg = await _error(client, "forget", {"namespace": "alice", "id": alice[0]})
            assert alice[0] in msg
            msg = await _error(client, "forget", {"namespace": "bob", "id": alice[1]})
            assert alice[1] in msg
            msg = await _error(client, "forget", {"namespace": "nobody", "id": alice[1]})
            assert "nobody" in msg
            msg = await _error(client, "recall", {"namespace": "alice", "query": "dog", "policy": "best"})
            assert "best" in msg and all(p in msg for p in ("collapsed", "top_down", "bottom_up"))
            assert "namespace" in await _error(client, "remember", {"namespace": "", "text": "x"})
            assert "namespace" in await _error(client, "remember", {"namespace": "   ", "text": "x"})
            assert "256" in await _error(client, "remember", {"namespace": "n" * 257, "text": "x"})
            assert "control" in await _error(client, "remember", {"namespace": "a\x00b", "text": "x"})
            assert "control" in await _error(client, "recall", {"namespace": "a\nb", "query": "x"})
            assert "empty" in await _error(client, "remember", {"namespace": "alice", "text": "  "})
            msg = await _error(client, "remember", {"namespace": "alice", "text": "x", "timestamp": "soon"})
            assert "ISO-8601" in msg
            assert "query" in await _error(client, "recall", {"namespace": "alice", "query": ""})
            assert "k" in await _error(client, "recall", {"namespace": "alice", "query": "dog", "k": 0})
            await _error(client, "recall", {"namespace": "alice", "query": "dog", "k": "many"})
            await _error(client, "recall", {"namespace": "alice"})  # a required argument missing
            await _error(client, "remember", {"namespace": 3, "text": "x"})
            msg = await _error(
                client,
                "recall",
                {
                    "namespace": "alice",
                    "query": "dog",
                    "time_range_start": "2024-05-01",
                    "time_range_end": "2024-01-01",
                },
            )
            assert "after" in msg
            await _error(
                client, "recall", {"namespace": "alice", "query": "x", "time_range_end": "yesterday"}
            )
            await _error(client, "recall", {"namespace": "carol", "query": "dog", "policy": "best"})
            assert "No namespace" in await _error(client, "memory_stats", {"namespace": "carol"})
            await _error(client, "no_such_tool", {})
            assert (await _ok(client, "memory_stats", {"namespace": "alice"}))["messages"] == 3
            assert await _ok(client, "list_namespaces") == ["alice", "bob"]

        # durable: a second server process on the same store sees the first one's memories
        async with Client(_stdio("--store", str(store)), read_timeout_seconds=TIMEOUT) as client:
            assert await _ok(client, "list_namespaces") == ["alice", "bob"]
            assert (await _ok(client, "memory_stats", {"namespace": "alice"}))["messages"] == 3
            hits = await _ok(client, "recall", {"namespace": "alice", "query": "Kyoto temples trip"})
            assert alice[3] in hits[0]["source_ids"] and "Kyoto" in hits[0]["text"]
            hits = await _ok(client, "recall", {"namespace": "alice", "query": "What is my dog's name?"})
            assert alice[0] not in _ids(hits)  # the forget was durable too
            hits = await _ok(client, "recall", {"namespace": "bob", "query": "pet cat"})
            assert hits[0]["source_ids"] == [bob[1]]
            # a new message without timestamp is stamped now
            mid = await _ok(client, "remember", {"namespace": "bob", "text": "I bought a new bicycle."})
            hits = await _ok(client, "recall", {"namespace": "bob", "query": "bicycle", "k": 1})
            assert hits[0]["source_ids"] == [mid] and hits[0]["timestamp"] and hits[0]["speaker"] is None


async def test_streamable_http(tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, **SERVER_ENV}
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shared_core.cli", "mcp", "--http", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        await anyio.to_thread.run_sync(_wait_listening, proc, port, log)
        url = f"http://127.0.0.1:{port}/mcp"
        with anyio.fail_after(TIMEOUT):
            async with Client(url, read_timeout_seconds=TIMEOUT) as client:
                assert {t.name for t in (await client.list_tools()).tools} == TOOLS
                ids = await _remember_all(client, "alice", ALICE[:3])
                hits = await _ok(client, "recall", {"namespace": "alice", "query": "What is my dog's name?"})
                assert hits[0]["source_ids"] == [ids[0]] and "Luna" in hits[0]["text"]
                msg = await _error(client, "recall", {"namespace": "alice", "query": "x", "policy": "best"})
                assert "top_down" in msg
            # another session of the same server shares the memories (in memory, no --store)
            async with Client(url, read_timeout_seconds=TIMEOUT) as client:
                assert await _ok(client, "list_namespaces") == ["alice"]
                hits = await _ok(client, "recall", {"namespace": "alice", "query": "Thai curry", "k": 1})
                assert hits[0]["source_ids"] == [ids[1]]
                assert await _ok(client, "forget", {"namespace": "alice", "id": ids[1]}) == 1
                assert (await _ok(client, "memory_stats", {"namespace": "alice"}))["messages"] == 2
        text = log.read_text(errors="replace")
        assert "http://127.0.0.1" in text  # the ready line names the URL
        # loopback without --tokens: it starts, and says once that it is unauthenticated
        assert text.count("unauthenticated") == 1, text
        assert "bearer tokens required" not in text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()


def test_cli_rejects_bad_options() -> None:
    env = {**os.environ, **SERVER_ENV}
    for args in (["--memory", "bogus"], ["--http", "localhost"]):
        r = subprocess.run(
            [sys.executable, "-m", "shared_core.cli", "mcp", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT,
        )
        assert r.returncode == 1, r
        assert r.stdout == b""  # stdout is the MCP channel
        assert (b"bogus" in r.stderr) or (b"HOST:PORT" in r.stderr), r.stderr
