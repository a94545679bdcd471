"""Supersession on the PostgreSQL store, every memory: a mark written by one handle reaches another by
catch-up, survives reopening, and deleting the newer statement there makes the older current again."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")

from shared_core.types import Message  # noqa: E402
from tests.support.memory import KINDS, HashEmbedder, memory_class  # noqa: E402

OLD = "I've watched 10 Crash Course videos so far this year."
NEW = "I just finished watching my 15th Crash Course video this year!"
QUERY = "how many Crash Course videos have I watched this year?"


@pytest.mark.parametrize("kind", KINDS)
def test_marks_catch_up_across_handles_and_reopen(kind, pg_url):
    cls = memory_class(kind)
    ns = ("supersession", kind)
    a = cls.open(pg_url, embedder=HashEmbedder(), namespace=ns)
    b = cls.open(pg_url, embedder=HashEmbedder(), namespace=ns)
    try:
        a.add(Message(OLD, role="user", id="old", timestamp="2024-01-05"))
        assert [m.id for m in b.history("old")] == ["old"]
        a.add(Message(NEW, role="user", id="new", timestamp="2024-03-01"))
        assert [m.id for m in b.history("old")] == ["old", "new"]  # b caught up with a's commit
        old = next(h for h in b.retrieve(QUERY, k=2) if h.source_ids == ["old"])
        assert (old.superseded_by, old.valid_to) == (("new",), "2024-03-01")
    finally:
        a.close()
        b.close()
    c = cls.open(pg_url, embedder=HashEmbedder(), namespace=ns)
    d = cls.open(pg_url, embedder=HashEmbedder(), namespace=ns)
    try:
        assert [m.id for m in c.history("new")] == ["old", "new"]
        d.delete("new")
        assert [m.id for m in c.history("old")] == ["old"]
        old = next(h for h in c.retrieve(QUERY, k=2) if h.source_ids == ["old"])
        assert old.superseded_by == () and old.valid_to is None
    finally:
        c.close()
        d.close()
