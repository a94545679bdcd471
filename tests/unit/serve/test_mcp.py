"""``hiermem mcp``: the memory tools over the Model Context Protocol, through the official SDK's client.

In-process (the server object and an in-memory session): time ranges, every memory kind, namespaces,
options. The server as a process (stdio, streamable HTTP) is tested in the integration tests. All on the
real embedded local embedder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason='the MCP SDK is not installed (pip install "hiermem[mcp]")')

from mcp import Client  # noqa: E402

from shared_core.serve.mcp_server import MEMORY_KINDS, build_server, open_store, parse_host_port  # noqa: E402
from shared_core.types import InvalidInputError  # noqa: E402
from tests.support.mcp import (
    ALICE,
    BOB,
    _error,
    _ids,
    _ok,
    _remember_all,
)


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


async def test_as_of_and_min_score(local_embedder: Any) -> None:
    """recall as of a time sees nothing remembered later; min_score keeps the hits scoring at least it;
    bad values are tool errors naming them."""
    server = build_server(open_store(None, "segtree", local_embedder))
    async with Client(server) as client:
        msgs = [
            ("I live in Lyon with my cat.", "ana", "2024-01-10T09:00:00"),
            ("I moved to Bordeaux with my cat.", "ana", "2024-03-02T18:00:00"),
            ("The weather report mentions rain.", "ana", "2024-03-05T08:00:00"),
        ]
        ids = await _remember_all(client, "ana", msgs)
        q = {"namespace": "ana", "query": "where do I live with my cat"}
        assert _ids(await _ok(client, "recall", {**q, "as_of": "2024-02-01"})) == {ids[0]}
        assert _ids(await _ok(client, "recall", {**q, "as_of": "2024-03-02"})) == {ids[0], ids[1]}
        every = await _ok(client, "recall", q)
        assert all(0.0 <= h["score"] <= 1.0 for h in every)
        cut = sorted(h["score"] for h in every)[1]
        kept = await _ok(client, "recall", {**q, "min_score": cut})
        assert [h["source_ids"] for h in kept] == [h["source_ids"] for h in every if h["score"] >= cut]
        assert "as_of" in await _error(client, "recall", {**q, "as_of": "next tuesday-ish"})
        assert "min_score" in await _error(client, "recall", {**q, "min_score": 1.5})


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


async def test_recall_marks_a_replaced_statement(local_embedder: Any) -> None:
    """A statement a newer one restates with another value comes back with the newer id and the time it
    was replaced, the newer one first; as of a time before the update it is current."""
    server = build_server(open_store(None, "segtree", local_embedder))
    async with Client(server) as client:
        msgs = [
            ("I've watched 10 Crash Course videos so far this year.", "ana", "2024-01-05T10:00:00"),
            ("I just finished watching my 15th Crash Course video this year!", "ana", "2024-03-01T10:00:00"),
        ]
        ids = await _remember_all(client, "ana", msgs)
        q = {"namespace": "ana", "query": "how many Crash Course videos have I watched?"}
        hits = await _ok(client, "recall", q)
        assert [h["source_ids"] for h in hits] == [[ids[1]], [ids[0]]]
        assert (hits[1]["superseded_by"], hits[1]["valid_to"]) == ([ids[1]], msgs[1][2])
        assert (hits[0]["superseded_by"], hits[0]["valid_to"]) == ([], None)
        (old,) = await _ok(client, "recall", {**q, "as_of": "2024-02-01"})
        assert (old["source_ids"], old["superseded_by"], old["valid_to"]) == ([ids[0]], [], None)
