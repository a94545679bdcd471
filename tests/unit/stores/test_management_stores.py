"""Management on the SQLite store, every memory: a duplicate id is refused and nothing written, an upsert
is one durable replacement, get_all reads the reopened store, close() releases the file (PostgreSQL:
tests/integration/test_postgres_management.py)."""

from __future__ import annotations

import pytest

from shared_core import MemoryClosedError, PersistenceError
from tests.support.management import check_durable_management
from tests.support.memory import KINDS, HashEmbedder, memory_class, message_text


@pytest.mark.parametrize("kind", KINDS)
def test_duplicate_ids_upsert_get_all_and_close_with_sqlite(kind, tmp_path):
    cls = memory_class(kind)
    check_durable_management(lambda: cls.open(tmp_path / "m.sqlite", embedder=HashEmbedder()))


def test_close_releases_the_sqlite_file_for_another_open_in_this_process(tmp_path):
    cls = memory_class("segtree")
    path = tmp_path / "m.sqlite"
    mem = cls.open(path, embedder=HashEmbedder())
    mem.add(message_text(0))
    with pytest.raises(PersistenceError):  # one writer per store: refused while it is open
        cls.open(path, embedder=HashEmbedder())
    mem.close()
    mem.close()
    other = cls.open(path, embedder=HashEmbedder())
    assert [m.text for m in other.get_all()] == [message_text(0)]
    with pytest.raises(MemoryClosedError):
        mem.add(message_text(1))
    other.close()
