"""TTLs of the durable LangGraph store on PostgreSQL: expiry across a reopen, and the migration of a store
of the format before TTLs. On the private server of ``pg_cluster`` / ``pg_url`` (tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from langchain_hiermem.store_durable import SCHEMA
from tests.support.langgraph_store import a_store_before_ttls_is_migrated, expiry_persists_across_reopen


def test_expiry_persists_across_reopen_on_postgres(pg_url):
    expiry_persists_across_reopen(pg_url)


def test_a_store_of_the_format_before_ttls_is_migrated_on_postgres(pg_cluster, pg_url):
    db = pg_url.split("?")[0].rsplit("/", 1)[1]

    def run(sql: str) -> Any:
        return pg_cluster.execute(db, sql)

    a_store_before_ttls_is_migrated(pg_url, run, f"{SCHEMA}.")
