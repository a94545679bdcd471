"""``hiermem mcp``: the memory tools over the Model Context Protocol, through the official SDK's client.

Over stdio (the server as a subprocess, as an MCP client runs it), over streamable HTTP, and in-process
for the cheaper checks (time ranges, every memory kind). All on the real embedded local embedder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason='the MCP SDK is not installed (pip install "hiermem[mcp]")')

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from shared_core.serve.mcp_server import MEMORY_KINDS, build_server, open_store, parse_host_port  # noqa: E402
from shared_core.types import InvalidInputError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"remember", "recall", "forget", "list_namespaces", "memory_stats"}
#: generous: the server loads torch and the embedder on a loaded 2-core machine
TIMEOUT = 120

SERVER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
}

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


def _stdio(*args: str) -> StdioServerParameters:
    """The server as an MCP client launches it: this interpreter, ``-m shared_core.cli mcp ...``."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "shared_core.cli", "mcp", *args],
        env=SERVER_ENV,
        cwd=str(ROOT),
    )


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


# --------------------------------------------------------------------------- stdio, durable
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
                    ["namespace", "query", "k", "policy", "time_range_start", "time_range_end"],
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


# --------------------------------------------------------------------------- streamable HTTP
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


# --------------------------------------------------------------------------- in-process
async def test_time_range(local_embedder: Any) -> None:
    """A leaf outside the time range never comes back; either end may be open; a date includes its day."""
    server = build_server(open_store(None, "segtree", local_embedder))
    async with Client(server) as client:
        msgs = [
            ("We talked about hiking in the Alps.", "ana", "2024-01-15T10:00:00"),
            ("We planned hiking in the Pyrenees.", "ana", "2024-03-10T10:00:00"),
            ("We went hiking in the Rockies.", "ana", "2024-03-31T23:30:00"),
            ("We dreamt of hiking in Patagonia.", "ana", "2024-06-01T10:00:00"),
        ]
        ids = await _remember_all(client, "ana", msgs)
        q = {"namespace": "ana", "query": "hiking trips"}
        assert _ids(await _ok(client, "recall", q)) == set(ids)
        for start, end, inside in [
            ("2024-03-01", "2024-03-31", {1, 2}),  # a date-only end includes its whole day
            ("2024-03-01T00:00:00", "2024-03-31T12:00:00", {1}),
            (None, "2024-02-01", {0}),
            ("2024-04-01", None, {3}),
            ("2025-01-01", None, set()),
        ]:
            args = {**q, "time_range_start": start, "time_range_end": end}
            hits = await _ok(client, "recall", args)
            assert _ids(hits) == {ids[i] for i in inside}, (start, end)
            for h in hits:
                assert h["timestamp"] is None or h["timestamp"] in {msgs[i][2] for i in inside}
        for policy in ("collapsed", "bottom_up"):
            args = {**q, "policy": policy, "time_range_start": "2024-03-01", "time_range_end": "2024-03-31"}
            assert _ids(await _ok(client, "recall", args)) <= {ids[1], ids[2]}
        msg = await _error(
            client, "recall", {**q, "time_range_start": "2024-05-01", "time_range_end": "2024-01-01"}
        )
        assert "after" in msg
        assert "ISO-8601" in await _error(client, "recall", {**q, "time_range_start": "last week"})


@pytest.mark.parametrize("kind", MEMORY_KINDS)
async def test_every_memory_kind(kind: str, local_embedder: Any, tmp_path: Path) -> None:
    server = build_server(open_store(tmp_path / "store", kind, local_embedder))
    async with Client(server) as client:
        ids = await _remember_all(client, "alice", ALICE)
        await _remember_all(client, "bob", BOB)
        hits = await _ok(client, "recall", {"namespace": "alice", "query": "What is my dog's name?", "k": 5})
        assert ids[0] in _ids(hits) and _ids(hits) <= set(ids)
        leaf_hits = [h for h in hits if h["is_leaf"]]
        assert leaf_hits and all(h["timestamp"] in {m[2] for m in ALICE} for h in leaf_hits)
        stats = await _ok(client, "memory_stats", {"namespace": "alice"})
        assert stats["kind"] == kind and stats["messages"] == 4
        assert await _ok(client, "forget", {"namespace": "alice", "id": ids[0]}) == 1
        hits = await _ok(client, "recall", {"namespace": "alice", "query": "What is my dog's name?"})
        assert ids[0] not in _ids(hits) and not any("Luna" in h["text"] for h in hits)
        assert (await _ok(client, "memory_stats", {"namespace": "alice"}))["messages"] == 3
        msg = await _error(client, "recall", {"namespace": "alice", "query": "dog", "policy": "best"})
        assert "best" in msg and stats["default_policy"] in msg


async def test_namespaces_never_mix(local_embedder: Any, tmp_path: Path) -> None:
    """Names that look like paths or like each other are distinct namespaces."""
    server = build_server(open_store(tmp_path, "segtree", local_embedder))
    names = ["alice", "Alice", "alice/", "../alice", "alice bob", "ali\u00e7e", "🙂"]
    async with Client(server) as client:
        ids = {}
        for n in names:
            ids[n] = await _ok(
                client, "remember", {"namespace": n, "text": f"My secret word is {n}-pineapple."}
            )
        assert await _ok(client, "list_namespaces") == sorted(names)
        for n in names:
            hits = await _ok(client, "recall", {"namespace": n, "query": "secret word"})
            assert _ids(hits) == {ids[n]}, n
            assert (await _ok(client, "memory_stats", {"namespace": n}))["messages"] == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ns-")) == sorted(
        p.name for p in tmp_path.iterdir() if p.is_dir()
    )


def test_parse_host_port() -> None:
    assert parse_host_port("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert parse_host_port("[::1]:9") == ("::1", 9)
    for bad in ("8000", ":8000", "host:", "host:0", "host:70000", "host:http"):
        with pytest.raises(InvalidInputError):
            parse_host_port(bad)


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
