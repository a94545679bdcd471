"""The erasure procedure of docs/storage.md ("Deleted rows on disk"), on the private server of
``pg_cluster``: after a ``delete`` a message's text is still in the server's files (dead tuples, WAL);
after the documented steps no file of the data directory holds it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")

from shared_core import Message  # noqa: E402
from tests.support.forget import KINDS4, cache_memory  # noqa: E402
from tests.support.postgres import _dbname  # noqa: E402

#: Tables of the erasure step, as docs/storage.md lists them.
_TABLES = "hiermem.nodes, hiermem.vectors, hiermem.meta, hiermem.namespaces"
#: Most rounds of ``pg_switch_wal(); CHECKPOINT`` before the test gives up.
_ROUNDS = 20


def _files_holding(data: Path, secrets: list[bytes]) -> list[str]:
    """Paths (relative to ``data``) of the files holding any of ``secrets``."""
    hits = []
    for root, _, files in os.walk(data):
        for name in files:
            path = Path(root) / name
            try:
                blob = path.read_bytes()
            except OSError:  # a file deleted while walking
                continue
            if any(s in blob for s in secrets):
                hits.append(str(path.relative_to(data)))
    return sorted(hits)


def test_the_documented_erasure_steps_leave_no_copy_in_the_data_directory(
    pg_cluster: Any, pg_url: str
) -> None:
    db = _dbname(pg_url)
    secrets = {kind: f"erasure canary {kind} q8v3k" for kind in KINDS4}
    for kind, secret in secrets.items():
        mem = cache_memory(kind)
        mem.attach_store(pg_url, namespace=("erasure", kind))
        mem.add(Message(f"My locker code at the gym is {secret}.", id="m0", speaker="ann"))
        for i in range(1, 4):
            mem.add(Message(f"My locker code at the gym was changed, note {i}.", id=f"m{i}"))
        if kind == "xmemory":
            mem.flush()
        assert mem.delete("m0") == 1
        mem.close_store()
    needles = [s.encode() for s in secrets.values()]
    sql = lambda q: pg_cluster.execute(db, q)  # noqa: E731 - as the superuser
    sql("CHECKPOINT")
    assert _files_holding(pg_cluster.data, needles), "a deleted text stays on disk until the steps below"
    sql("ALTER SYSTEM SET wal_recycle = off")
    try:
        sql("SELECT pg_reload_conf()")
        noted = {r[0] for r in sql("SELECT name FROM pg_ls_waldir()")}
        sql(f"VACUUM (FULL) {_TABLES}")
        for _ in range(_ROUNDS):
            if not noted & {r[0] for r in sql("SELECT name FROM pg_ls_waldir()")}:
                break
            sql("SELECT pg_switch_wal()")
            sql("CHECKPOINT")
        assert not noted & {r[0] for r in sql("SELECT name FROM pg_ls_waldir()")}
        assert _files_holding(pg_cluster.data, needles) == []
    finally:
        sql("ALTER SYSTEM RESET wal_recycle")
        sql("SELECT pg_reload_conf()")
