"""Threads, lock waits and database names for the PostgreSQL tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from shared_core import HierarchicalMemory
from shared_core.stores.postgres import LOCK_CLASS


def _dbname(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(url)["dbname"])


def _leaf_texts(mem: HierarchicalMemory) -> list[str]:
    return [mem._store.nodes[i].text for i in mem._store.leaves()]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # reported to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _finish(t: threading.Thread, out: dict[str, Any], timeout: float = 120.0) -> Any:
    t.join(timeout)
    assert not t.is_alive(), "the call did not finish (blocked)"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _waiting_for_lock(cluster: Any, url: str) -> int:
    rows = cluster.execute(
        _dbname(url),
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::bigint = %s",
        (LOCK_CLASS,),
    )
    return int(rows[0][0])
