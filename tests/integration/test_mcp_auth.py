"""``hiermem mcp --http --tokens``: bearer tokens, each reaching only its namespaces.

End to end through the official SDK's client (``mcp.client.streamable_http``) against the real server
process on 127.0.0.1 (an ephemeral port): no or a wrong token is HTTP 401; a token reads and writes its
namespaces only; another namespace is a tool error that does not say whether it exists, and leaves its
data alone. Then the checks that need no server: the tokens file's validation, namespaces matched
exactly as the store keys them, and the refusal to listen on an address other than loopback without
tokens (asserted to happen before anything is bound). No token value may reach stderr or a log.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import unicodedata
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason='the MCP SDK is not installed (pip install "hiermem[mcp]")')

import httpx2  # noqa: E402  (the MCP SDK's HTTP client)
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from shared_core.cli import app  # noqa: E402
from shared_core.namespaces import MemoryStore, namespace_dirname  # noqa: E402
from shared_core.serve import (
    mcp_auth,  # noqa: E402
    mcp_server,  # noqa: E402
)
from shared_core.serve.mcp_auth import (  # noqa: E402
    MIN_TOKEN_CHARS,
    Grant,
    TokensFileError,
    TokenTable,
    UnauthenticatedBindError,
    is_loopback,
    transport_security,
)
from shared_core.serve.mcp_server import HierMemTools, build_server, memory_factory, open_store  # noqa: E402
from tests.support.mcp import ROOT, SERVER_ENV, TIMEOUT, _error, _free_port, _ok, _wait_listening  # noqa: E402
from tests.support.memory import HashEmbedder  # noqa: E402
from tests.support.namespaces import copy_namespace  # noqa: E402

A, B, STAR = (secrets.token_urlsafe(32) for _ in range(3))
TOKENS = {A: ["alice"], B: ["bob", "team"], STAR: ["*"]}
#: well-formed tokens the server does not know (a near miss of A among them)
WRONG = [secrets.token_urlsafe(32), A[:-1] + ("x" if A[-1] != "x" else "y"), A + "x", A[:-1]]
SECRETS = [A, B, STAR, *WRONG]
#: the namespace a tampered directory of the served store names (see the ``server`` fixture)
HIDDEN = "eve-private-ledger"
HIDDEN_TEXT = "the vault code is 8675309"


def _write_tokens(path: Path, tokens: Any) -> Path:
    path.write_text(json.dumps(tokens) if not isinstance(tokens, str) else tokens, encoding="utf-8")
    path.chmod(0o600)
    return path


def _no_secret(text: str) -> None:
    for s in SECRETS:
        assert s not in text, "a token value reached the output"


# --------------------------------------------------------------------------- the server, over HTTP
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``hiermem mcp --http 127.0.0.1:<free port> --tokens FILE --store DIR``; its URL and stderr log.

    The store holds a copied directory: the one of B's namespace ``"team"`` holds a copy of the
    memory of :data:`HIDDEN` (a namespace only ``"*"`` could hold; its own directory is gone), its
    record naming :data:`HIDDEN`."""
    tmp = tmp_path_factory.mktemp("mcp-auth")
    tokens = _write_tokens(tmp / "tokens.json", TOKENS)
    hidden = MemoryStore(memory_factory("segtree", HashEmbedder()), tmp / "store", durable=True)  # type: ignore[arg-type]
    hidden.add((HIDDEN,), HIDDEN_TEXT)
    hidden.close()
    copy_namespace(tmp / "store", (HIDDEN,), ("team",))
    shutil.rmtree(tmp / "store" / namespace_dirname((HIDDEN,)))
    port = _free_port()
    log = tmp / "server.log"
    out = tmp / "server.out"
    env = {**os.environ, **SERVER_ENV, "COLUMNS": "1000"}  # log lines unwrapped
    with open(log, "wb") as err, open(out, "wb") as stdout:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shared_core.cli",
                "mcp",
                "--http",
                f"127.0.0.1:{port}",
                "--tokens",
                str(tokens),
                "--store",
                str(tmp / "store"),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=err,
        )
    try:
        _wait_listening(proc, port, log)
        yield f"http://127.0.0.1:{port}/mcp", log
        assert proc.poll() is None, log.read_text(errors="replace")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()
        # nothing the server printed, on either stream, holds a token
        _no_secret(log.read_text(errors="replace"))
        _no_secret(out.read_text(errors="replace"))


@asynccontextmanager
async def _client(
    url: str,
    token: str | None,
    *,
    mode: str = "auto",
    statuses: list[int] | None = None,
    scheme: str = "Bearer",
) -> AsyncIterator[Client]:
    """The SDK's streamable-HTTP client, sending ``Authorization: <scheme> <token>`` when given a token."""
    headers = {} if token is None else {"Authorization": f"{scheme} {token}"}
    http = create_mcp_http_client(headers=headers)

    async def record(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    http.event_hooks = {"response": [record]}
    async with (
        http,
        Client(
            streamable_http_client(url, http_client=http), read_timeout_seconds=TIMEOUT, mode=mode
        ) as client,
    ):
        yield client


def _leaves(exc: BaseException) -> list[BaseException]:
    subs = getattr(exc, "exceptions", None)
    return [exc] if subs is None else [x for s in subs for x in _leaves(s)]


async def _refused(url: str, token: str | None, scheme: str = "Bearer") -> None:
    """The SDK's client cannot connect: every HTTP answer was 401."""
    statuses: list[int] = []
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(BaseException) as info:  # noqa: B017 - an exception group from the client
            async with _client(url, token, statuses=statuses, scheme=scheme) as client:
                await client.list_tools()
    assert any(isinstance(e, MCPError) for e in _leaves(info.value)), info.value
    assert statuses and set(statuses) == {401}, statuses


async def test_no_or_wrong_token_is_401(server: tuple[str, Path]) -> None:
    url, _ = server
    await _refused(url, None)
    for token in WRONG:
        await _refused(url, token)
    await _refused(url, A, scheme="Basic")  # a known token, but not as a bearer token
    # the raw answer: 401 with the bearer challenge, and no session
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
        for headers in ({}, {"Authorization": f"Bearer {WRONG[0]}"}):
            r = await http.post(
                url,
                json=init,
                headers={**headers, "Accept": "application/json, text/event-stream"},
            )
            assert r.status_code == 401
            assert r.headers["www-authenticate"].startswith("Bearer ")
            assert "mcp-session-id" not in r.headers


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_token_reaches_only_its_namespaces(server: tuple[str, Path], mode: str) -> None:
    """Over both protocol eras (a session per client, or one request per call)."""
    url, _ = server
    with anyio.fail_after(TIMEOUT):
        # B's own data first, through B's token (namespaces are "bob" and "team")
        async with _client(url, B, mode=mode) as b:
            bob_id = await _ok(b, "remember", {"namespace": "bob", "text": f"My bank PIN is 4921 ({mode})."})
            bob_msgs = (await _ok(b, "memory_stats", {"namespace": "bob"}))["messages"]

        async with _client(url, A, mode=mode) as a:
            # A: remember / recall / stats / forget on its namespace
            mid = await _ok(a, "remember", {"namespace": "alice", "text": f"My dog is called Luna ({mode})."})
            keep = await _ok(a, "remember", {"namespace": "alice", "text": f"I like green tea ({mode})."})
            hits = await _ok(a, "recall", {"namespace": "alice", "query": "dog name"})
            assert mid in {s for h in hits for s in h["source_ids"]}
            assert not any("PIN" in h["text"] for h in hits)
            n = (await _ok(a, "memory_stats", {"namespace": "alice"}))["messages"]
            assert await _ok(a, "forget", {"namespace": "alice", "id": mid}) == 1
            assert (await _ok(a, "memory_stats", {"namespace": "alice"}))["messages"] == n - 1
            assert await _ok(a, "list_namespaces") == ["alice"]

            # A on B's namespace (which exists) and on one nobody has (which does not): the same refusal
            for other in ("bob", "team", "carol", "*", "Alice", "alice "):
                calls = [
                    ("remember", {"namespace": other, "text": "overwrite"}),
                    ("recall", {"namespace": other, "query": "PIN"}),
                    ("recall", {"namespace": other, "query": "PIN", "policy": "no-such-policy"}),
                    ("forget", {"namespace": other, "id": bob_id}),
                    ("memory_stats", {"namespace": other}),
                ]
                for tool, args in calls:
                    msg = await _error(a, tool, args)
                    assert "Access denied" in msg and repr(other) in msg, msg
                    assert "4921" not in msg and bob_id not in msg
                    generic = msg.replace(repr(other), "<ns>")
                    assert generic == (
                        f"Error executing tool {tool}: Access denied: this token may not use namespace "
                        "<ns> (its namespaces: 'alice')."
                    ), generic
            assert await _ok(a, "list_namespaces") == ["alice"]
            await _ok(a, "recall", {"namespace": "alice", "query": "tea"})  # still serving A

        # B's message is still there, and nothing was created by A's attempts
        async with _client(url, B, mode=mode) as b:
            hits = await _ok(b, "recall", {"namespace": "bob", "query": "bank PIN"})
            assert bob_id in {s for h in hits for s in h["source_ids"]}
            assert (await _ok(b, "memory_stats", {"namespace": "bob"}))["messages"] == bob_msgs
            assert await _ok(b, "list_namespaces") == ["bob"]
            assert "Access denied" in await _error(b, "recall", {"namespace": "alice", "query": "tea"})

        # the "*" token sees and reaches every namespace
        async with _client(url, STAR, mode=mode) as star:
            assert await _ok(star, "list_namespaces") == ["alice", "bob"]
            hits = await _ok(star, "recall", {"namespace": "bob", "query": "bank PIN"})
            assert bob_id in {s for h in hits for s in h["source_ids"]}
            hits = await _ok(star, "recall", {"namespace": "alice", "query": "green tea"})
            assert keep in {s for h in hits for s in h["source_ids"]}
            assert (await _ok(star, "memory_stats", {"namespace": "bob"}))["messages"] == bob_msgs
            # cleanup for the other protocol era: "*" may forget anywhere
            assert await _ok(star, "forget", {"namespace": "bob", "id": bob_id}) == 1
            assert await _ok(star, "forget", {"namespace": "alice", "id": keep}) == 1


async def test_a_tampered_directory_is_skipped_and_logged(server: tuple[str, Path]) -> None:
    """The directory of "team" holds another namespace's memory: every token still lists its own
    namespaces (never that directory), B's calls on "team" fail without naming that namespace, its
    text or the directory, and the server's log tells the operator which directory and why."""
    url, log = server
    team = namespace_dirname(("team",))
    own = {A: {"alice"}, B: {"bob", "team"}, STAR: None}
    with anyio.fail_after(TIMEOUT):
        for token, names in own.items():
            async with _client(url, token) as client:
                listed = await _ok(client, "list_namespaces")
                assert HIDDEN not in listed and "team" not in listed, listed
                assert names is None or set(listed) <= names, listed
        async with _client(url, B) as b:
            for tool, args in (
                ("remember", {"namespace": "team", "text": "minutes of the meeting"}),
                ("recall", {"namespace": "team", "query": "meeting"}),
                ("memory_stats", {"namespace": "team"}),
            ):
                msg = await _error(b, tool, args)
                assert "could not read or write" in msg and "Reference" in msg, msg
                assert HIDDEN not in msg and "8675309" not in msg and team not in msg, msg
    text = log.read_text(errors="replace")
    assert f"Skipping namespace directory {team}" not in text  # the whole path is logged
    skipped = [line for line in text.splitlines() if "Skipping namespace directory" in line]
    assert len(skipped) == 1 and team in skipped[0] and "does not belong" in skipped[0], skipped


async def test_a_session_belongs_to_its_token(server: tuple[str, Path]) -> None:
    """A session opened with A's token does not answer B's (the SDK's session ownership)."""
    url, _ = server
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
        r = await http.post(url, json=init, headers={**accept, "Authorization": f"Bearer {A}"})
        assert r.status_code == 200
        sid = r.headers["mcp-session-id"]
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        h = {**accept, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        r = await http.post(url, json=call, headers={**h, "Authorization": f"Bearer {B}"})
        assert r.status_code == 404
        r = await http.post(url, json=call, headers=h)
        assert r.status_code == 401
        await http.delete(url, headers={**h, "Authorization": f"Bearer {A}"})


# --------------------------------------------------------------------------- the tokens file
def test_tokens_file_loads(tmp_path: Path) -> None:
    table = TokenTable.load(_write_tokens(tmp_path / "t.json", TOKENS))
    assert len(table) == 3
    ga, gb, gs = table.lookup(A), table.lookup(B), table.lookup(STAR)
    assert ga == Grant("token-1", frozenset({"alice"}))
    assert gb == Grant("token-2", frozenset({"bob", "team"}))
    assert gs is not None and gs.every and gs.allows("anything") and gs.allows("*")
    assert ga.allows("alice") and not ga.allows("bob") and not ga.allows("*")
    for w in WRONG:
        assert table.lookup(w) is None
    assert table.lookup("") is None and table.lookup("\udcff") is None
    assert table.grant("token-2") == gb and table.grant("token-9") is None
    _no_secret(repr(table) + repr(ga) + repr(list(table)))
    # a BOM and "~" / "+" / "/" / trailing "=" are fine
    tok = "a~b+c/d." + "x" * MIN_TOKEN_CHARS + "=="
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({tok: ["n"]}).encode())
    assert TokenTable.load(p).lookup(tok) == Grant("token-1", frozenset({"n"}))


def test_token_lookup_compares_every_token(monkeypatch: pytest.MonkeyPatch) -> None:
    table = TokenTable.from_mapping(TOKENS)
    calls: list[tuple[bytes, bytes]] = []
    real = mcp_auth.hmac.compare_digest

    def counting(x: bytes, y: bytes) -> bool:
        calls.append((x, y))
        return real(x, y)

    monkeypatch.setattr(mcp_auth.hmac, "compare_digest", counting)
    for token in (A, STAR, WRONG[0]):
        calls.clear()
        table.lookup(token)
        assert len(calls) == len(TOKENS)  # no early exit, hit or miss
        assert all(len(x) == len(y) == 32 for x, y in calls)  # digests: the length does not leak either


SHORT = "s3cr3t-but-short"


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ("{not json", "not valid JSON"),
        (f'{{"{A}": ["alice"],}}', "not valid JSON"),
        ("", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (f'"{A}"', "must be a JSON object"),
        ("{}", "no tokens"),
        (
            {SHORT: ["alice"]},
            f"token #1 has {len(SHORT)} characters; a token needs at least {MIN_TOKEN_CHARS}",
        ),
        ({A: ["alice"], "x" * 31: ["bob"]}, "token #2 has 31 characters"),
        ({"é" * 40: ["alice"]}, "token #1 has characters a bearer token cannot have"),
        ({A[:20] + " " + A[20:]: ["alice"]}, "token #1 has characters"),
        ({A: "alice"}, "token #1: its value must be a list of namespaces"),
        ({A: {"alice": True}}, "token #1: its value must be a list"),
        ({A: None}, "token #1: its value must be a list"),
        ({A: []}, "token #1: no namespaces"),
        ({A: ["alice", 3]}, "token #1: namespace 2 is a number; namespaces are strings"),
        ({A: [["alice"]]}, "token #1: namespace 1 is a list"),
        ({A: [None]}, "token #1: namespace 1 is null"),
        ({A: [""]}, "token #1: namespace 1 is not a valid namespace"),
        ({A: ["  "]}, "token #1: namespace 1 is not a valid namespace"),
        ({A: ["a\nb"]}, "control character"),
        ({A: ["n" * 257]}, "limit is 256"),
        ({A: ["*", "alice"]}, '"*" already means every namespace'),
        ({A: ["*", "*"]}, '"*" already means every namespace'),
        (f'{{"{A}": ["alice"], "{A}": ["bob"]}}', "token #2 is the same token as token #1"),
        (f'{{"{A}": ["\\ud800"]}}', "lone surrogate"),
    ],
)
def test_malformed_tokens_file(tmp_path: Path, content: Any, expect: str) -> None:
    path = _write_tokens(tmp_path / "tokens.json", content)
    with pytest.raises(TokensFileError) as info:
        TokenTable.load(path)
    msg = str(info.value)
    assert expect in msg and str(path) in msg, msg
    _no_secret(msg)
    assert SHORT not in msg and "é" * 40 not in msg


def test_unreadable_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(TokensFileError, match="cannot read it"):
        TokenTable.load(tmp_path / "missing.json")
    with pytest.raises(TokensFileError, match="cannot read it"):
        TokenTable.load(tmp_path)  # a directory
    p = tmp_path / "latin1.json"
    p.write_bytes(b'{"\xe9": []}')
    with pytest.raises(TokensFileError, match="not UTF-8"):
        TokenTable.load(p)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (mcp_auth.MAX_TOKENS_FILE_BYTES + 1))
    with pytest.raises(TokensFileError, match="larger than"):
        TokenTable.load(big)


def _run_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "shared_core.cli", "mcp", *args],
        cwd=ROOT,
        env={**os.environ, **SERVER_ENV},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT,
    )


def test_cli_malformed_tokens_file_exits_1(tmp_path: Path) -> None:
    """Exit 1 with the reason on stderr (nothing on stdout, the MCP channel), before anything starts."""
    port = _free_port()
    cases = {
        "syntax.json": (f'{{"{A}": ["alice"]', "not valid JSON"),
        "short.json": ({SHORT: ["alice"]}, "at least 32"),
        "value.json": ({A: "alice"}, "must be a list"),
    }
    for name, (content, expect) in cases.items():
        path = _write_tokens(tmp_path / name, content)
        r = _run_cli("--http", f"127.0.0.1:{port}", "--tokens", str(path))
        err = r.stderr.decode(errors="replace")
        assert r.returncode == 1, err
        assert r.stdout == b""
        assert "cannot serve" in err and expect in err and name in err, err
        _no_secret(err)
        assert SHORT not in err
    r = _run_cli("--http", f"127.0.0.1:{port}", "--tokens", str(tmp_path / "nope.json"))
    assert r.returncode == 1 and b"cannot read it" in r.stderr
    if os.name == "posix":  # a FIFO nothing writes to: refused at once (it used to wait forever)
        os.mkfifo(tmp_path / "fifo.json")
        r = _run_cli("--http", f"127.0.0.1:{port}", "--tokens", str(tmp_path / "fifo.json"))
        err = r.stderr.decode(errors="replace")
        assert r.returncode == 1 and "fifo.json" in err and "not a regular file" in err, err


# --------------------------------------------------------------------------- where it may listen
@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("localhost", True),
        ("LocalHost", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("10.0.0.1", False),
        ("128.0.0.1", False),
        ("fe80::1", False),
        ("example.com", False),
        ("localhost.example.com", False),
        ("127.0.0.1.nip.io", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_transport_security() -> None:
    s = transport_security("127.0.0.2")
    assert s.enable_dns_rebinding_protection
    assert "127.0.0.2:*" in s.allowed_hosts and "127.0.0.1:*" in s.allowed_hosts
    assert "http://127.0.0.2:*" in s.allowed_origins
    assert "[::1]:*" in transport_security("::1").allowed_hosts
    # elsewhere the token protects the server; a Host allow-list would refuse a proxy's or a DNS name
    assert not transport_security("0.0.0.0").enable_dns_rebinding_protection


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and stop) any attempt to load the model, open the store, build or run the server."""
    started: list[str] = []

    def stop(what: str) -> Any:
        def fail(*_: Any, **__: Any) -> Any:
            started.append(what)
            raise AssertionError(f"{what} must not happen")

        return fail

    import shared_core.models.local as local

    monkeypatch.setattr(local, "LocalEmbedder", stop("loading the model"))
    monkeypatch.setattr(mcp_server, "open_store", stop("opening the store"))
    monkeypatch.setattr(mcp_server, "build_server", stop("building the server"))
    monkeypatch.setattr(MCPServer, "run", stop("serving"))
    return started


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "192.0.2.7", "example.com"])
def test_cli_refuses_other_than_loopback_without_tokens(host: str, no_start: list[str]) -> None:
    """Exit 1 with the reason, before anything is loaded or bound."""
    r = CliRunner().invoke(app, ["mcp", "--http", f"{host}:{_free_port()}"])
    assert r.exit_code == 1, (r.output, r.exception)
    assert isinstance(r.exception, SystemExit)
    assert no_start == []
    assert r.stdout == ""
    err = " ".join(r.stderr.split())
    bare = host.strip("[]")
    assert f"refusing to serve on {bare} without authentication" in err, err
    assert "not a loopback address" in err and "--tokens FILE" in err


def test_serve_refuses_other_than_loopback_without_tokens(no_start: list[str]) -> None:
    with pytest.raises(UnauthenticatedBindError, match="not a loopback address"):
        mcp_server.serve(None, http="0.0.0.0:8765", embedder=HashEmbedder())  # type: ignore[arg-type]
    assert no_start == []


def test_cli_tokens_needs_http(tmp_path: Path, no_start: list[str]) -> None:
    path = _write_tokens(tmp_path / "t.json", TOKENS)
    r = CliRunner().invoke(app, ["mcp", "--tokens", str(path)])
    assert r.exit_code == 1 and no_start == []
    assert "--tokens applies to --http only" in " ".join(r.stderr.split())


@pytest.mark.parametrize(
    ("host", "shown"), [("127.0.0.2", "127.0.0.2"), ("::1", "[::1]"), ("localhost", "localhost")]
)
def test_cli_loopback_without_tokens_says_so(
    host: str, shown: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Loopback without tokens starts (here: up to ``run``, not bound) and says once it is unauthenticated."""
    import shared_core.models.local as local

    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(local, "LocalEmbedder", HashEmbedder)
    monkeypatch.setattr(
        MCPServer, "run", lambda self, transport="stdio", **kw: runs.append({"t": transport, **kw})
    )
    r = CliRunner().invoke(app, ["mcp", "--http", f"{host}:{8765}"])
    assert r.exit_code == 0, (r.output, r.exception)
    err = " ".join(r.stderr.split())
    assert err.count("unauthenticated") == 1, err
    assert f"http://{shown}:8765/mcp" in err
    assert len(runs) == 1 and runs[0]["t"] == "streamable-http" and runs[0]["host"] == host
    sec = runs[0]["transport_security"]
    assert sec.enable_dns_rebinding_protection and f"{shown}:*" in sec.allowed_hosts

    # with tokens: no such notice, and the bearer requirement in the ready line
    runs.clear()
    path = _write_tokens(tmp_path / "t.json", TOKENS)
    r = CliRunner().invoke(app, ["mcp", "--http", f"{host}:8765", "--tokens", str(path)])
    assert r.exit_code == 0, (r.output, r.exception)
    err = " ".join(r.stderr.split())
    assert "unauthenticated" not in err and "bearer tokens required (3 in tokens file" in err, err
    assert "readable by other users" not in err
    _no_secret(r.stderr + r.stdout)
    path.chmod(0o644)
    r = CliRunner().invoke(app, ["mcp", "--http", f"{host}:8765", "--tokens", str(path)])
    assert r.exit_code == 0 and "readable by other users" in " ".join(r.stderr.split())


def test_non_loopback_with_tokens_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``0.0.0.0`` with tokens gets past the checks (``run`` is stubbed: nothing is bound)."""
    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(MCPServer, "run", lambda self, transport="stdio", **kw: runs.append(kw))
    path = _write_tokens(tmp_path / "t.json", TOKENS)
    mcp_server.serve(None, http="0.0.0.0:8765", tokens=path, embedder=HashEmbedder())  # type: ignore[arg-type]
    assert runs and runs[0]["host"] == "0.0.0.0"
    assert not runs[0]["transport_security"].enable_dns_rebinding_protection


# --------------------------------------------------------------------------- namespaces matched exactly
def _tools(grant: Grant | None, store: MemoryStore) -> HierMemTools:
    return HierMemTools(store, access=lambda: grant)


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    s = MemoryStore(memory_factory("segtree", HashEmbedder()))  # type: ignore[arg-type]
    yield s
    s.close()


NFC = unicodedata.normalize("NFC", "Zoë")
NFD = unicodedata.normalize("NFD", "Zoë")
LOOKALIKES = {
    "alice": [
        "Alice",
        "ALICE",
        "alice ",
        " alice",
        "alice\u200b",  # zero-width space
        "ali\u0441e",  # Cyrillic es
        "\uff41lice",  # full-width a
        "alice/",
        "../alice",
        "*",
    ],
    NFC: [NFD, "zoë", "Zoe"],
    NFD: [NFC],
}


@pytest.mark.parametrize("owned", list(LOOKALIKES))
def test_a_token_reaches_no_other_spelling(owned: str, store: MemoryStore) -> None:
    """The store keys a namespace by its exact string, so a token matches exactly: another spelling
    is another memory, and the token reaches neither it nor (from it) its own."""
    admin = _tools(Grant("token-0", frozenset(), every=True), store)
    ids = {ns: admin.remember(ns, f"the secret of {ns!r} is 4921") for ns in [owned, *LOOKALIKES[owned]]}
    mine = _tools(Grant("token-1", frozenset({owned})), store)
    assert mine.list_namespaces() == [owned]
    assert {s for h in mine.recall(owned, "secret") for s in h.source_ids} == {ids[owned]}
    for other in LOOKALIKES[owned]:
        for tool, args in (
            ("remember", ("x",)),
            ("recall", ("secret",)),
            ("forget", (ids[other],)),
            ("memory_stats", ()),
        ):
            with pytest.raises(ToolError, match="Access denied"):
                getattr(mine, tool)(other, *args)
        # and the owner of that spelling does not reach this one
        theirs = _tools(Grant("token-2", frozenset({other})), store)
        with pytest.raises(ToolError, match="Access denied"):
            theirs.recall(owned, "secret")
        assert theirs.list_namespaces() == [other]
    for ns, mid in ids.items():  # every message still there
        assert admin.memory_stats(ns)["messages"] == 1
        assert mid in {s for h in admin.recall(ns, "secret") for s in h.source_ids}


def test_refusal_does_not_reveal_existence(store: MemoryStore) -> None:
    admin = _tools(Grant("token-0", frozenset(), every=True), store)
    admin.remember("bob", "the PIN is 4921")
    alice = _tools(Grant("token-1", frozenset({"alice"})), store)
    for tool, args in (
        ("remember", ("x",)),
        ("recall", ("x",)),
        ("forget", ("x",)),
        ("memory_stats", ()),
    ):
        msgs = []
        for ns in ("bob", "nobody"):
            with pytest.raises(ToolError) as info:
                getattr(alice, tool)(ns, *args)
            msgs.append(str(info.value).replace(repr(ns), "<ns>"))
        assert msgs[0] == msgs[1], msgs
    assert store.list_namespaces() == [("bob",)]  # nothing created


async def test_in_process_client_has_no_token(local_embedder: Any) -> None:
    """With tokens, a caller without one (in-process, no HTTP) is refused every call: fail closed."""
    server = build_server(open_store(None, "segtree", local_embedder), tokens=TokenTable.from_mapping(TOKENS))
    async with Client(server) as client:
        for tool, args in (
            ("list_namespaces", {}),
            ("remember", {"namespace": "alice", "text": "x"}),
            ("recall", {"namespace": "alice", "query": "x"}),
        ):
            res = await client.call_tool(tool, args)
            assert res.is_error
            assert "Not authenticated" in " ".join(getattr(c, "text", "") for c in res.content)


def test_no_token_text_in_error_paths(tmp_path: Path) -> None:
    """A JSON error right after a token, or a token as a namespace: the messages never quote the token."""
    for content in (f'{{"{A}" ["alice"]}}', f'{{"{A}": ["alice"] "{B}": []}}', f'{{"{A}": [{B}]}}'):
        with pytest.raises(TokensFileError) as info:
            TokenTable.load(_write_tokens(tmp_path / "t.json", content))
        _no_secret(str(info.value))
    assert re.search(r"line \d+, column \d+", str(info.value))
