"""``max_resident`` on the durable LangGraph store over PostgreSQL (the SQLite case:
tests/unit/namespaces/test_max_resident.py)."""

from __future__ import annotations

from tests.support.langgraph_store import langgraph_bounds


def test_durable_langgraph_store_bounds_resident_memories_postgres(pg_url) -> None:
    langgraph_bounds(pg_url)
