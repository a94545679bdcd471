"""``max_resident`` reaches the ``MemoryStore`` from every layer that builds one: the durable LangGraph store
(``HierMemStore.from_conn_string`` / ``DurableHierMemStore``, SQLite and PostgreSQL), LlamaIndex's
``HierMemBlock`` and the MCP server (``open_store`` / ``serve`` / ``hiermem mcp --max-resident``). Each
refuses the values ``MemoryStore`` refuses, keeps its default, and bounds the namespaces open at once
while every namespace keeps answering as before (nothing is embedded again when an evicted one reopens).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from langchain_hiermem.store_durable import DurableHierMemStore
from shared_core.namespaces import DEFAULT_MAX_RESIDENT, MemoryStore, check_max_resident
from shared_core.types import InvalidInputError
from tests.support.langgraph_store import langgraph_bounds, open_store
from tests.support.memory import HashEmbedder

BAD = [0, -3, True, 2.0, "4"]


@pytest.mark.parametrize("bad", BAD)
def test_every_layer_refuses_what_memory_store_refuses(bad: Any, tmp_path) -> None:
    from llamaindex_hiermem import HierMemBlock
    from shared_core.serve.mcp_server import open_store as mcp_open_store

    with pytest.raises(InvalidInputError, match="max_resident"):
        check_max_resident(bad)
    with pytest.raises(InvalidInputError, match="max_resident"):
        MemoryStore(lambda: None, max_resident=bad)  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidInputError, match="max_resident"):
        DurableHierMemStore(tmp_path / "s.sqlite", embedder=HashEmbedder(), max_resident=bad)
    with pytest.raises(InvalidInputError, match="max_resident"):
        HierMemBlock(store_dir=tmp_path / "b", embed_model=HashEmbedder(), max_resident=bad)
    with pytest.raises(InvalidInputError, match="max_resident"):
        mcp_open_store(tmp_path / "m", embedder=HashEmbedder(), max_resident=bad)
    assert not (tmp_path / "m").exists()  # refused before anything is created


def test_defaults_are_the_memory_stores(tmp_path) -> None:
    import inspect

    from llamaindex_hiermem import HierMemBlock
    from shared_core.cli import app
    from shared_core.serve import mcp_server

    assert DEFAULT_MAX_RESIDENT == 256
    with open_store(tmp_path / "s.sqlite") as store:
        assert store._memories.max_resident == DEFAULT_MAX_RESIDENT
    block = HierMemBlock(store_dir=tmp_path / "b", embed_model=HashEmbedder())
    assert block.memory_store.max_resident == DEFAULT_MAX_RESIDENT
    for fn in (mcp_server.open_store, mcp_server.serve):
        assert inspect.signature(fn).parameters["max_resident"].default == DEFAULT_MAX_RESIDENT
    import typer.main

    command = typer.main.get_command(app).commands["mcp"]  # type: ignore[attr-defined]
    option = next(p for p in command.params if "--max-resident" in p.opts)
    assert option.default == DEFAULT_MAX_RESIDENT
    assert check_max_resident(None) is None and check_max_resident(1) == 1


def test_durable_langgraph_store_bounds_resident_memories_sqlite(tmp_path) -> None:
    langgraph_bounds(tmp_path / "store.sqlite")


def test_memory_block_bounds_resident_sessions(tmp_path) -> None:
    from llama_index.core.llms import ChatMessage

    from llamaindex_hiermem import HierMemBlock
    from shared_core import SegTreeMem

    emb = HashEmbedder()
    block = HierMemBlock(store_dir=tmp_path / "b", embed_model=emb, max_resident=2)
    store = block.memory_store
    assert store is not None and store.max_resident == 2
    sessions = [f"s{n}" for n in range(5)]
    for n, sid in enumerate(sessions):
        msg = ChatMessage(role="user", content=f"session {n} talks about topic{n}")
        msg.additional_kwargs["session_id"] = sid
        asyncio.run(block._aput([msg]))
        assert store.resident <= 2
    assert store.stats()["evictions"] >= len(sessions) - 2
    for n, sid in enumerate(sessions):
        mem = block.session_memory(sid)
        assert mem is not None
        assert [h.text for h in mem.retrieve(f"topic{n}", k=1)] == [f"session {n} talks about topic{n}"]
        assert store.resident <= 2
    ready = MemoryStore(lambda: SegTreeMem(embedder=emb), tmp_path / "r", durable=True)
    with pytest.raises(InvalidInputError, match="max_resident"):
        HierMemBlock(store=ready, max_resident=2)
    with pytest.raises(InvalidInputError, match="max_resident"):
        HierMemBlock(memory=SegTreeMem(embedder=emb), max_resident=2)
    assert HierMemBlock(store=ready).memory_store is ready  # the store's own bound applies


def test_mcp_store_bounds_resident_namespaces(tmp_path) -> None:
    from shared_core.serve.mcp_server import HierMemTools
    from shared_core.serve.mcp_server import open_store as mcp_open_store

    store = mcp_open_store(tmp_path / "m", embedder=HashEmbedder(), max_resident=2)
    try:
        assert store.max_resident == 2
        tools = HierMemTools(store)
        for n in range(5):
            tools.remember(f"user{n}", f"user {n} keeps bees called bee{n}")
            assert store.resident <= 2
        for n in range(5):
            found = tools.recall(f"user{n}", f"bee{n}")
            assert f"bee{n}" in str(found)
            assert store.resident <= 2
        assert store.stats()["evictions"] >= 3
    finally:
        store.close()
    unbounded = mcp_open_store(tmp_path / "u", embedder=HashEmbedder(), max_resident=None)
    assert unbounded.max_resident is None
    unbounded.close()


def test_cli_refuses_a_bad_max_resident_before_loading_anything(tmp_path) -> None:
    from typer.testing import CliRunner

    from shared_core.cli import app

    result = CliRunner().invoke(app, ["mcp", "--store", str(tmp_path / "m"), "--max-resident", "0"])
    assert result.exit_code == 1
    assert "max_resident" in result.output
    assert not (tmp_path / "m").exists()
