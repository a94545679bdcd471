"""A PostgreSQL LangGraph store shared by processes: writers take turns per namespace, readers catch up
with only what changed.

Checked with real processes (workers of :mod:`tests.test_langgraph_store_processes`): while one worker
holds a put on a namespace open (its texts in the memory, its items not committed), other workers put
and delete in other namespaces without waiting, a put to the held namespace fails with
``NamespaceBusyError`` after the URL's ``lock_timeout`` and changes nothing, a third process sees every
committed put and delete without reopening (``list_namespaces`` and searches across namespaces
included), and once the holder is SIGKILLed its namespace takes writes again with none of its texts
left. In one process: the catch-up of a store reads back only the namespaces written since its last
look (a put, a delete, a new namespace) and a store of the previous format is migrated on open.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from langchain_hiermem.store_items import SCHEMA
from shared_core.stores.namespace import namespace_key
from tests.support.langgraph_store import TEXTS, leaves, open_store
from tests.support.langgraph_workers import WAIT, Worker

HELD = ("tenants", "held")
FREE = [("tenants", "free"), ("other", "ns")]


def _keys(rows: list[Any]) -> list[tuple[tuple[str, ...], str]]:
    return [(tuple(r[0]), r[1]) for r in rows]


@pytest.fixture
def short_url(pg_url: str) -> str:
    """The database of ``pg_url``, a namespace lock waited for at most 2 s (an outcome, not a timing:
    a put that waits for the held namespace fails with NamespaceBusyError instead of hanging)."""
    return pg_url + ("&" if "?" in pg_url else "?") + "lock_timeout=2"


def test_writers_of_other_namespaces_never_wait_for_a_held_one(short_url: str) -> None:
    holder = Worker(short_url, hold_key="stuck")
    writer = Worker(short_url)
    reader = Worker(short_url)
    try:
        holder("put", HELD, "before", {"text": TEXTS[0]})
        holder.send("put", HELD, "stuck", {"text": TEXTS[1]})
        status, pid = holder.reply()
        assert status == "holding"  # its texts are in the memory, its items not committed, lock held
        # other namespaces: puts, a batch and deletes go through, from two processes
        writer("put", FREE[0], "a", {"text": TEXTS[2]})
        writer("batch", [(FREE[1], "b", {"text": TEXTS[3]}), (FREE[0], "c", {"text": TEXTS[4]})])
        reader("put", FREE[1], "d", {"text": TEXTS[0]})
        writer("delete", FREE[0], "a")
        # the held namespace: a bounded wait, then NamespaceBusyError; nothing changes
        writer.send("put", HELD, "other", {"text": TEXTS[2]})
        status, message = writer.reply()
        assert status == "error" and message.startswith("NamespaceBusyError"), message
        # a reader that never reopened sees every committed write, and no uncommitted one
        assert _keys(reader("search", ("tenants",), None)) == [(HELD, "before"), (FREE[0], "c")]
        assert sorted(_keys(reader("search", (), "dog beach"))) == sorted(
            [(HELD, "before"), (FREE[0], "c"), (FREE[1], "b"), (FREE[1], "d")]
        )
        assert [tuple(n) for n in reader("list")] == sorted([HELD, *FREE])
        assert reader("get", FREE[0], "a") is None and reader("get", HELD, "stuck") is None
        os.kill(pid, signal.SIGKILL)
        holder.proc.join(WAIT)
        # the lock died with its session: the namespace takes writes, the killed put left nothing
        writer("put", HELD, "after", {"text": TEXTS[3]})
        assert _keys(reader("search", HELD, None)) == [(HELD, "before"), (HELD, "after")]
        assert [tuple(x) for x in reader("leaves", HELD)] == sorted(
            [("after", TEXTS[3]), ("before", TEXTS[0])]
        )
        assert writer("get", FREE[1], "d")[2] == {"text": TEXTS[0]}
    finally:
        for w in (holder, writer, reader):
            w.stop()


def test_a_reader_catches_up_with_only_the_namespaces_written_since(pg_url: str) -> None:
    spaces = [("users", f"u{n}") for n in range(5)]
    with open_store(pg_url, fields=["text"]) as w, open_store(pg_url, fields=["text"]) as r:
        for n, ns in enumerate(spaces):
            w.put(ns, "k", {"text": TEXTS[n % len(TEXTS)], "n": n})
        assert r.list_namespaces() == sorted(spaces)  # caught up (or loaded) once
        assert r._db.changes() is None  # nothing since

        w.put(spaces[1], "k2", {"text": TEXTS[0]})
        w.delete(spaces[3], "k")
        w.put(("users", "new"), "k", {"text": TEXTS[1]})
        keys, space_rows, item_rows = r._db.changes()
        want = {namespace_key(spaces[1]), namespace_key(spaces[3]), namespace_key(("users", "new"))}
        assert set(keys) == want  # the namespaces written since, no other
        assert {row[0] for row in item_rows} <= want and {row[0] for row in space_rows} <= want
        r._resync = True  # (those changes were taken by hand: read everything once more)
        assert [i.key for i in r.search(spaces[1])] == ["k", "k2"]
        assert r.get(spaces[3], "k") is None and r.search(spaces[3]) == []

        # the same kinds of writes again, now found by the reads' own catch-up
        w.put(spaces[0], "k", {"text": TEXTS[2], "n": 9})  # an update keeps its place
        w.delete(spaces[1], "k")
        w.put(("users", "newer"), "k", {"text": TEXTS[1], "n": 5})
        assert [(i.key, i.value["n"]) for i in r.search(("users",), filter={"n": {"$gte": 4}})] == [
            ("k", 9),
            ("k", 4),
            ("k", 5),
        ]
        assert [i.key for i in r.search(spaces[1])] == ["k2"]
        assert r.list_namespaces() == sorted(
            [spaces[0], *spaces[1:3], spaces[4], ("users", "new"), ("users", "newer")]
        )
        assert [h.key for h in r.search(("users", "newer"), query=TEXTS[1])] == ["k"]
        assert leaves(r, spaces[1]) == [("k2", TEXTS[0])]
        r.put(spaces[2], "own", {"text": TEXTS[3]})  # its own write, then another process's
        w.delete(spaces[2], "own")
        assert [i.key for i in r.search(spaces[2])] == ["k"]
        assert r._db.changes() is None


def test_a_store_of_format_2_is_migrated_on_open(pg_cluster: Any, pg_url: str) -> None:
    with open_store(pg_url, fields=["text"]) as s:
        s.put(("a",), "k", {"text": TEXTS[0]})
    db = pg_url.split("?")[0].rsplit("/", 1)[1]
    pg_cluster.execute(db, f"DROP TABLE {SCHEMA}.changes")
    pg_cluster.execute(db, f"UPDATE {SCHEMA}.meta SET value = '2' WHERE key = 'format'")
    with open_store(pg_url, fields=["text"]) as s, open_store(pg_url, fields=["text"]) as t:
        assert s.get(("a",), "k").value == {"text": TEXTS[0]}
        s.put(("a",), "k2", {"text": TEXTS[1]})
        assert [i.key for i in t.search(("a",))] == ["k", "k2"]
    rows = pg_cluster.execute(db, f"SELECT value FROM {SCHEMA}.meta WHERE key = 'format'")
    assert json.loads(rows[0][0]) == 3


def test_a_sweep_spares_what_another_store_renewed_and_removes_the_rest(pg_url: str) -> None:
    """A sweep on PostgreSQL (namespace by namespace, each under its lock): an expired item that
    another store put again before the sweep stays although the sweeping store saw it expired, the
    others go (their texts too), and the other store sees the result without reopening."""
    from tests.support.langgraph_store import Clock

    clock = Clock()
    spaces = [("t", "a"), ("t", "b"), ("u", "c")]
    with open_store(pg_url, fields=["text"]) as s, open_store(pg_url, fields=["text"]) as o:
        s._clock = o._clock = clock
        for n, ns in enumerate(spaces):
            s.put(ns, "old", {"text": TEXTS[n]}, ttl=1)
            s.put(ns, "keep", {"text": TEXTS[n + 1]})
        clock.tick(2)
        seen = s.list_namespaces()  # s caught up: every "old" item has expired in its copy
        assert seen == sorted(spaces)
        o.put(spaces[1], "old", {"text": TEXTS[4]}, ttl=10)  # renewed by the other store
        assert s.sweep_ttl() == 2  # (t, a) and (u, c); (t, b)'s item is a new one now
        for ns in spaces:
            want = ["keep", "old"] if ns == spaces[1] else ["keep"]
            assert sorted(i.key for i in o.search(ns)) == want
            assert [k for k, _ in leaves(o, ns)] == want
        assert o.get(spaces[1], "old").value == {"text": TEXTS[4]}
        assert o.sweep_ttl() == 0
