"""The LangGraph store that survives restarts (``HierMemStore.from_conn_string``) on PostgreSQL: round trips
across a reopen, several openers of one store, atomic failed puts, databases that are not a store, and a
server restart. On the private server of ``pg_cluster`` / ``pg_url`` (tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.store.base import PutOp

from langchain_hiermem.store_durable import SCHEMA
from shared_core.types import (
    ModelError,
    PersistenceError,
    VersionMismatchError,
)
from tests.support.langgraph_store import (
    FACTS,
    NS,
    FailOn,
    leaves,
    open_store,
    round_trip,
    snapshot,
)


def test_postgres_round_trip_across_reopen(pg_url):
    round_trip(pg_url)
    with open_store(pg_url) as s:
        s.setup()
        s.setup()
        assert s.list_namespaces() == [("memories", "ann"), ("memories", "bob"), ("other",)]


def test_a_postgres_store_is_shared_by_several_openers(pg_url):
    """Two stores open on one URL (as two processes would be) see each other's puts and deletes; the
    multi-process tests are in tests/integration/test_langgraph_store_processes.py."""
    with open_store(pg_url) as s, open_store(pg_url) as t:
        s.put(NS, "a", {"text": FACTS[0]})
        t.put(NS, "b", {"text": FACTS[1]})
        s.delete(NS, "a")
        assert [i.key for i in t.search(NS, limit=10)] == ["b"] and s.get(NS, "b") is not None
    with open_store(pg_url) as s:
        assert [i.key for i in s.search(NS, limit=10)] == ["b"] and leaves(s, NS) == [("b", FACTS[1])]


def _dbname(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(url)["dbname"])


def _schemas(pg_cluster: Any, db: str) -> list[str]:
    rows = pg_cluster.execute(db, "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'hiermem%%'")
    return sorted(str(r[0]) for r in rows)


def test_postgres_databases_that_are_not_a_store_are_refused_untouched(pg_cluster, pg_url):
    db = _dbname(pg_url)
    pg_cluster.execute(db, f"CREATE SCHEMA {SCHEMA}")
    pg_cluster.execute(db, f"CREATE TABLE {SCHEMA}.things (id integer)")
    with pytest.raises(PersistenceError, match="not a hiermem LangGraph store"), open_store(pg_url):
        pass
    assert _schemas(pg_cluster, db) == [SCHEMA]  # the memories' schema was not created either

    url2 = pg_cluster.url(pg_cluster.create_database(), connect_timeout="3")
    db2 = _dbname(url2)
    pg_cluster.execute(db2, "CREATE SCHEMA hiermem")
    pg_cluster.execute(db2, "CREATE TABLE hiermem.junk (id integer)")
    with pytest.raises(PersistenceError, match="not a hiermem store"), open_store(url2):
        pass
    assert _schemas(pg_cluster, db2) == ["hiermem"]

    url3 = pg_cluster.url(pg_cluster.create_database(), connect_timeout="3")
    with open_store(url3) as s:
        s.put(NS, "a", {"text": FACTS[0]})
    pg_cluster.execute(_dbname(url3), f"UPDATE {SCHEMA}.meta SET value = '99' WHERE key = 'format'")
    with pytest.raises(VersionMismatchError), open_store(url3):
        pass
    missing = pg_cluster.url("no_such_database", connect_timeout="3")
    with pytest.raises(PersistenceError, match="Cannot connect"), open_store(missing):
        pass


def test_a_failed_postgres_put_changes_nothing(pg_cluster, pg_url):
    with open_store(pg_url, FailOn("poison")) as s:
        s.put(NS, "a", {"text": FACTS[0]})
        before = (snapshot(s, scores=False), leaves(s, NS))
        with pytest.raises(ModelError):
            s.batch([PutOp(("new",), "b", {"text": FACTS[1]}), PutOp(NS, "a", {"text": "poison"})])
        assert (snapshot(s, scores=False), leaves(s, NS)) == before
        # a change of the sequence is another process's write: the store reloads, then writes
        seq = f"UPDATE {SCHEMA}.meta SET value = (value::int + %s)::text WHERE key = 'seq'"
        pg_cluster.execute(_dbname(pg_url), seq, (1,))
        assert (snapshot(s, scores=False), leaves(s, NS)) == before
    with open_store(pg_url) as s:
        assert (snapshot(s, scores=False), leaves(s, NS)) == before and s.get_memory(("new",)) is None


def test_a_postgres_server_restart_gives_persistence_error_then_reconnects(pg_cluster, pg_url):
    with open_store(pg_url) as s:
        s.put(NS, "a", {"text": FACTS[0]})
        pg_cluster.stop("fast")
        try:
            with pytest.raises(PersistenceError):
                s.put(NS, "b", {"text": FACTS[1]})
            with pytest.raises(PersistenceError):  # a shared store cannot tell what others wrote
                s.get(NS, "a")
        finally:
            pg_cluster.start()
        assert s.get(NS, "b") is None and s.get(NS, "a").value == {"text": FACTS[0]}
        s.put(NS, "b", {"text": FACTS[1]})  # the next call connects again
        assert leaves(s, NS) == [("a", FACTS[0]), ("b", FACTS[1])]
        before = snapshot(s)
    with open_store(pg_url) as s:
        assert snapshot(s) == before


def test_a_table_lock_bounds_every_call_of_the_store(pg_cluster, pg_url):
    """Another session holds ACCESS EXCLUSIVE on the store's items table (as VACUUM FULL or an ALTER
    would): a get, a search and a put of another opener each wait at most the URL's lock_timeout, then
    fail with NamespaceBusyError; nothing changed, and once the lock is released the same store serves
    them."""
    from concurrent.futures import ThreadPoolExecutor

    import psycopg

    from shared_core.types import NamespaceBusyError

    url = f"{pg_url}&lock_timeout=0.5"
    with open_store(url) as s, open_store(url) as other:
        s.put(NS, "k0", {"text": FACTS[0]})
        holder = psycopg.connect(pg_cluster.url(_dbname(pg_url)))
        holder.execute(f"LOCK TABLE {SCHEMA}.items IN ACCESS EXCLUSIVE MODE")
        pool = ThreadPoolExecutor(1)
        try:
            calls = [
                lambda: other.get(NS, "k0"),
                lambda: other.search(NS, query=FACTS[0]),
                lambda: other.put(NS, "k1", {"text": FACTS[1]}),
            ]
            for call in calls:
                with pytest.raises(NamespaceBusyError, match="locked"):
                    pool.submit(call).result(timeout=20)  # a wait past the bound fails the test
        finally:
            holder.close()  # a call still waiting (the test failed) goes on, and the pool ends
            pool.shutdown(wait=True)
        assert other.get(NS, "k0").value == {"text": FACTS[0]}
        assert other.get(NS, "k1") is None
        other.put(NS, "k1", {"text": FACTS[1]})
        assert s.get(NS, "k1").value == {"text": FACTS[1]}
