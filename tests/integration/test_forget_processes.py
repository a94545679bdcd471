"""Two memories on one PostgreSQL namespace: a deletion in one leaves no trace in the other's caches, and
what each reports as stored follows the other's adds and deletes.

Two memories open one PostgreSQL namespace (two processes' worth of state: each its own node store,
FAISS and BM25 index, summariser cache). The second one writes and searches (so its summariser caches
the first message's sentences and its BM25 index holds its words); the first one deletes that message;
after the second catches up, nothing reachable from it holds the deleted message's secret word.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared_core import HierarchicalMemory, Message
from tests.support.forget import KINDS4, cache_memory, exercise, traces_of
from tests.support.memory import HashEmbedder

SECRET = "zq7k7x"


@pytest.mark.parametrize("kind", KINDS4)
def test_a_deletion_elsewhere_leaves_no_trace_in_this_process(kind: str, pg_url: str) -> None:
    a = cache_memory(kind)
    a.attach_store(pg_url, namespace=("shared",))
    b: Any = None
    try:
        a.add(Message(f"My locker code at the big city gym is {SECRET}.", id="m0", speaker="ann"))
        for i in range(1, 4):
            a.add(Message(f"My locker code at the big city gym was changed, note {i}.", id=f"m{i}"))
        b = HierarchicalMemory.open(pg_url, namespace=("shared",), embedder=HashEmbedder())
        b.add(Message("The gym near the station opens at nine.", id="b0", speaker="bob"))
        exercise(b, "locker code gym")
        if kind == "xmemory":
            b.flush()
        assert traces_of(b, [SECRET]), "the second process holds the secret before the deletion"
        assert a.delete("m0") == 1
        exercise(b, "locker code gym")  # catches up with the deletion
        assert not [h for h in b.retrieve("locker code", k=20) if SECRET in h.text]
        assert traces_of(b, [SECRET]) == []
    finally:
        a.close_store()
        if b is not None:
            b.close_store()


@pytest.mark.parametrize("kind", KINDS4)
def test_stored_sources_follows_adds_and_deletes_here_and_elsewhere(kind: str, pg_url: str) -> None:
    """``stored_sources`` answers from the caught-up memory: another process's adds and deletes count."""
    a = cache_memory(kind)
    a.attach_store(pg_url, namespace=("sources",))
    b: Any = None
    try:
        a.add([Message(f"Note {i} about the garden.", id=f"n{i}") for i in range(3)])
        assert a.stored_sources(["n0", "n2", "zz"]) == {"n0", "n2"}
        assert a.stored_sources([]) == set()
        b = HierarchicalMemory.open(pg_url, namespace=("sources",), embedder=HashEmbedder())
        assert b.stored_sources(["n0", "n1", "n2"]) == {"n0", "n1", "n2"}
        a.delete("n1")
        a.add(Message("Note 3 about the garden.", id="n3"))
        assert b.stored_sources(["n0", "n1", "n2", "n3"]) == {"n0", "n2", "n3"}
    finally:
        a.close_store()
        if b is not None:
            b.close_store()
