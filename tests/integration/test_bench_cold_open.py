"""``hiermem bench --cold-open``: evicted namespaces reopened from SQLite and from PostgreSQL embed nothing
again, the PostgreSQL run leaves nothing behind in the database, and the command writes its JSON and
Markdown."""

from __future__ import annotations

import json

from shared_core.bench.namespaces import cold_open_bench, namespace_profile
from shared_core.namespaces import MemoryStore
from tests.support.memory import HashEmbedder


def _check(run: dict, store: str, messages: int) -> None:
    assert run["store"] == store and run["messages"] == messages
    assert run["embedded_texts_on_reopen"] == 0  # vectors come from the store
    assert run["cold_open"]["wall"]["median_ms"] > 0
    rss = run["rss_per_resident_message_bytes"]
    assert rss is None or rss > 0


def test_cold_open_from_sqlite_and_postgres(pg_url) -> None:
    _check(namespace_profile("segtree", 40, namespaces=2, reopens=2), "sqlite", 40)
    run = namespace_profile("hat", 40, namespaces=2, reopens=2, postgres=pg_url)
    _check(run, "postgres", 40)
    assert run["sqlite_bytes_per_message"] is None
    from shared_core import SegTreeMem

    left = MemoryStore(lambda: SegTreeMem(embedder=HashEmbedder()), url=pg_url)
    try:
        assert left.list_namespaces(("bench",)) == []  # the run deleted its namespaces
    finally:
        left.close()


def test_cold_open_command_writes_both_stores(pg_url, tmp_path) -> None:
    from typer.testing import CliRunner

    from shared_core.cli import app

    out = tmp_path / "out"
    args = ["bench", "--cold-open", "--sizes", "30", "--memories", "segtree", "--postgres", pg_url]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "namespaces.json").read_text())
    assert [(r["kind"], r["store"], r["messages"]) for r in doc["runs"]] == [
        ("segtree", "sqlite", 30),
        ("segtree", "postgres", 30),
    ]
    assert all(r["embedded_texts_on_reopen"] == 0 for r in doc["runs"])
    assert "| segtree | postgres | 30 |" in (out / "namespaces.md").read_text()
    assert cold_open_bench(["memtree"], [20], namespaces=2, reopens=1)["runs"][0]["store"] == "sqlite"
