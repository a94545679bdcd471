"""``hiermem bench --postgres``: many spawned processes on one PostgreSQL database against one process on
SQLite — the document's structure, the correctness checks, the ratios, the clean-up and the CLI option.

Runs against the private PostgreSQL server of ``pg_cluster`` (tests/conftest.py), a fresh database each.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")

from shared_core import HierarchicalMemory  # noqa: E402
from shared_core.bench import processes as P  # noqa: E402
from shared_core.bench.command import bench_command  # noqa: E402
from shared_core.stores.postgres import PostgresDatabase  # noqa: E402
from shared_core.types import InvalidInputError, Message  # noqa: E402

FIGURES = ("adds_per_s", "add_ms_p50", "add_ms_p95", "retrieve_ms_p50", "retrieve_ms_p95")


def _namespaces(url: str) -> list[tuple[str, ...]]:
    db = PostgresDatabase(url)
    try:
        return db.namespaces()
    finally:
        db.close()


def _check_figures(r: dict[str, Any], adds: int, retrieves: int) -> None:
    assert r["adds"] == adds and r["failed_adds"] == 0 and r["add_errors"] == []
    assert r["retrieves"] == retrieves and r["policy"] == "collapsed"  # SegTreeMem's default
    assert r["wall_s"] > 0 and r["adds_per_s"] == pytest.approx(adds / r["wall_s"])
    assert 0 < r["add_ms_p50"] <= r["add_ms_p95"]
    assert 0 < r["retrieve_ms_p50"] <= r["retrieve_ms_p95"]


def test_processes_shared_and_separate_against_sqlite(pg_url):
    doc = P.run_process_bench(pg_url, processes=(1, 2), messages=6, queries=2)
    json.dumps(doc)  # JSON-able as it is
    c = doc["config"]
    assert doc["schema"] == P.PROCESS_BENCH_SCHEMA
    assert c["processes"] == [1, 2] and c["messages_per_process"] == 6 and c["queries_per_process"] == 2
    assert c["memory"] == "segtree" and c["embedder"] == "hash" and c["namespace_prefix"][0] == "bench"
    assert doc["machine"]["start"]["logical_cpus"] >= 1 and "end" in doc["machine"]

    base = doc["sqlite_one_process"]
    _check_figures(base, 6, 2)
    assert base["check"] == {"ok": True, "namespaces": 1, "leaves": 6}

    runs = doc["runs"]
    assert [(r["processes"], r["layout"]) for r in runs] == [
        (1, "shared"),
        (1, "separate"),
        (2, "shared"),
        (2, "separate"),
    ]
    for r in runs:
        n = r["processes"]
        spaces = 1 if r["layout"] == "shared" else n
        _check_figures(r, 6 * n, 2 * n)
        assert r["namespaces"] == spaces
        assert r["check"] == {"ok": True, "namespaces": spaces, "leaves": 6 * n}
        assert r["adds_per_s_ratio_to_sqlite"] == pytest.approx(r["adds_per_s"] / base["adds_per_s"])
        assert r["retrieve_p50_ratio_to_sqlite"] == pytest.approx(
            r["retrieve_ms_p50"] / base["retrieve_ms_p50"]
        )
        assert r["add_p95_ratio_to_sqlite"] == pytest.approx(r["add_ms_p95"] / base["add_ms_p95"])
        assert r["retrieve_p95_ratio_to_sqlite"] == pytest.approx(
            r["retrieve_ms_p95"] / base["retrieve_ms_p95"]
        )

    assert c["namespaces_dropped"] == 1 + 1 + 1 + 2
    assert _namespaces(pg_url) == []  # every namespace of the run was dropped

    md = P.to_markdown(doc)
    assert "| SQLite | 1 | one file |" in md and "| PostgreSQL | 2 | separate |" in md
    assert md.count("| PostgreSQL |") == 4


def test_the_correctness_check_rejects_lost_duplicated_and_alien_messages(pg_url):
    ns = ("bench", "check", "ns")
    sent = dict(P._messages("p0", 3))
    mem = P._new_memory("segtree", "hash")
    mem.attach_store(pg_url, namespace=ns)
    for mid, text in list(sent.items())[:2]:
        mem.add(Message(text, id=mid))
    mem.close_store()
    ok = ["p0-0", "p0-1"]
    assert P._check(pg_url, ns, sent, ok, "hash") == 2
    with pytest.raises(P.ProcessBenchError, match="1 acknowledged message"):
        P._check(pg_url, ns, sent, [*ok, "p0-2"], "hash")  # acknowledged but not stored
    with pytest.raises(P.ProcessBenchError, match="never sent"):
        P._check(pg_url, ns, {"p0-0": sent["p0-0"]}, ["p0-0"], "hash")
    mem = HierarchicalMemory.open(pg_url, namespace=ns, embedder=P._embedder("hash"))
    mem.add(Message(sent["p0-0"], id="p0-0"), allow_duplicate_ids=True)  # the same message a second time
    mem.close_store()
    with pytest.raises(P.ProcessBenchError, match="more than once"):
        P._check(pg_url, ns, sent, ok, "hash")


@pytest.mark.parametrize(
    "kw",
    [
        {"processes": ()},
        {"processes": (0,)},
        {"messages": 0},
        {"queries": -1},
        {"memory": "btree"},
        {"embedder": "local"},
    ],
)
def test_bad_arguments_fail_before_connecting(kw):
    with pytest.raises(InvalidInputError):
        P.run_process_bench("postgresql://nobody@127.0.0.1:1/none", **kw)
    with pytest.raises(InvalidInputError, match="PostgreSQL URL"):
        P.run_process_bench("/tmp/memory.sqlite")


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("bench")(bench_command)
    app.command("noop")(lambda: None)
    return app


def test_the_postgres_option_of_the_bench_command(pg_url, tmp_path):
    out = tmp_path / "p"
    res = CliRunner().invoke(
        _app(),
        ["bench", "--postgres", pg_url, "--processes", "1", "--messages", "3", "--retrieves", "1"]
        + ["--queries", "7", "--out", str(out)],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "processes.json").read_text())
    assert doc["config"]["processes"] == [1] and doc["config"]["messages_per_process"] == 3
    assert doc["config"]["queries_per_process"] == 1  # --retrieves; --queries is the overhead benchmark's
    assert [(r["processes"], r["layout"]) for r in doc["runs"]] == [(1, "shared"), (1, "separate")]
    assert all(r["check"]["ok"] and r["adds"] == 3 and r["retrieves"] == 1 for r in doc["runs"])
    assert not (out / "bench.json").exists()  # only the process benchmark ran
    md = (out / "processes.md").read_text()
    assert md == P.to_markdown(doc) and "| PostgreSQL | 1 | shared |" in md
    assert _namespaces(pg_url) == []

    res = CliRunner().invoke(
        _app(), ["bench", "--postgres", pg_url, "--memories", "segtree,hat", "--out", str(out)]
    )
    assert res.exit_code != 0 and "one kind" in res.output
    res = CliRunner().invoke(_app(), ["bench", "--postgres", "not-a-url", "--out", str(out)])
    assert res.exit_code == 2 and "PostgreSQL URL" in res.output


def test_a_failing_worker_is_reported_and_the_workers_stop(pg_url):
    workers = P._Workers(1, timeout=120)
    try:
        job = {"target": pg_url, "namespace": ["bench", "bad"], "tag": "p0", "memory": "no-such-kind"}
        job.update(embedder="hash", messages=1, queries=0)
        with pytest.raises(P.ProcessBenchError, match="(?s)process 0 failed:.*no-such-kind"):
            workers.run([job])
    finally:
        workers.close()
    assert not workers.procs[0].is_alive() and workers.procs[0].exitcode == 0
