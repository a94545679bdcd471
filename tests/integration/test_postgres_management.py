"""Management on the PostgreSQL store, every memory: a duplicate id is refused and nothing written, an
upsert is one durable replacement, get_all reads the reopened namespace, close() releases it."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")

from tests.support.management import check_durable_management  # noqa: E402
from tests.support.memory import KINDS, HashEmbedder, memory_class  # noqa: E402


@pytest.mark.parametrize("kind", KINDS)
def test_duplicate_ids_upsert_get_all_and_close_with_postgres(kind, pg_url):
    cls = memory_class(kind)
    check_durable_management(lambda: cls.open(pg_url, embedder=HashEmbedder(), namespace=("mgmt", kind)))
