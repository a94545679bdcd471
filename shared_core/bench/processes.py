"""``hiermem bench --postgres URL``: many processes adding to and retrieving from one PostgreSQL database.

For each process count ``N`` the benchmark runs the same per-process workload twice: ``N`` processes
writing into ONE shared namespace (their adds are serialised by the namespace's advisory lock, and each
process catches up with the others' commits before its next add), then ``N`` processes each writing
into a namespace of its own (adds run in parallel). Each process adds ``messages`` messages, one ``add``
per message, then runs ``queries`` retrievals with the memory's default policy on its namespace. The
same workload in ONE process against an SQLite file is the baseline every figure is also given against.

Models are the stubs of :mod:`shared_core.bench.core`: a deterministic embedder (``"hash"``:
:class:`~shared_core.bench.core.ReplayEmbedder` with an empty table, a unit vector seeded by the text's
CRC-32; ``"pool"``: :class:`~shared_core.bench.core.PoolEmbedder`) and
:class:`~shared_core.bench.core.HashSummarizer`
(its text depends only on the children, so every process computes the same aggregates), with
``relevance="dense"``: the figures are the memory's and the store's own cost, not a model's.

Measurement: worker processes are started once with the ``spawn`` start method (imports, thread pinning
and interpreter start-up are outside every timing) and reused for every run. Per run each worker opens
its memory and reports ready; when all are ready the parent takes the start time and tells them all to
go (the common start barrier); each worker reports when its last add returned, and the parent's clock at
the last of those reports ends the run. ``adds_per_s`` is acknowledged adds over those wall seconds; the
per-add and per-retrieve latencies (p50, p95 in ms) are pooled over every process of the run. In the
shared layout a process that finished its adds retrieves while others still add.

Correctness: after each run every namespace is opened afresh (a new connection and memory) and must
hold every acknowledged message exactly once, with its text, and nothing else; otherwise
:class:`ProcessBenchError` is raised. Namespaces are named ``("bench", <run id>, ...)`` and dropped at
the end, also after a failure.
"""

from __future__ import annotations

import collections
import contextlib
import math
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait
from pathlib import Path
from typing import Any

import numpy as np

from ..types import HierMemError, InvalidInputError, Message

__all__ = ["PROCESS_BENCH_SCHEMA", "ProcessBenchError", "run_process_bench", "to_markdown"]

PROCESS_BENCH_SCHEMA = "hiermem.bench.processes/1"
EMBEDDERS = ("hash", "pool")
LAYOUTS = ("shared", "separate")
_WORDS = (
    "dog",
    "music",
    "travel",
    "garden",
    "cooking",
    "football",
    "books",
    "weather",
    "movies",
    "family",
    "coffee",
    "work",
    "painting",
    "hiking",
    "piano",
    "sister",
)


class ProcessBenchError(HierMemError, RuntimeError):
    """A benchmark worker failed, timed out, or a namespace lost, duplicated or invented a message."""


# --------------------------------------------------------------------------- workload (every process)
def _messages(tag: str, n: int) -> list[tuple[str, str]]:
    """``(id, text)`` of the ``n`` messages of writer ``tag``: unique ids, texts of a few topic words."""
    out = []
    for i in range(n):
        a, b = _WORDS[(i * 7 + len(tag)) % len(_WORDS)], _WORDS[(i * 3 + 5) % len(_WORDS)]
        out.append((f"{tag}-{i}", f"{tag} says {i}: my {a} and the {b}, note {i * 31 % 97}"))
    return out


def _queries(tag: str, n: int) -> list[str]:
    return [f"what did {tag} say about the {_WORDS[(j * 5) % len(_WORDS)]}?" for j in range(n)]


def _embedder(name: str) -> Any:
    from .core import PoolEmbedder, ReplayEmbedder

    return ReplayEmbedder({}, unknown="hash") if name == "hash" else PoolEmbedder()


def _new_memory(kind: str, embedder: str) -> Any:
    from ..eval.methods import available_memories
    from .core import HashSummarizer

    cls = available_memories()[kind]
    return cls(embedder=_embedder(embedder), summarizer=HashSummarizer(), relevance="dense")


def _open(job: dict[str, Any]) -> Any:
    """The memory of a job, attached to its store (created when new, loaded when it exists)."""
    mem = _new_memory(job["memory"], job["embedder"])
    if job["namespace"] is None:
        mem.attach_store(job["target"])
    else:
        mem.attach_store(job["target"], namespace=tuple(job["namespace"]))
    return mem


def _run_job(conn: Connection, job: dict[str, Any]) -> None:
    mem = _open(job)
    try:
        conn.send(("ready", mem.default_policy))
        if conn.recv() != "go":
            return
        add_ms: list[float] = []
        acked: list[str] = []
        failed: list[str] = []
        for mid, text in _messages(job["tag"], job["messages"]):
            t0 = time.perf_counter()
            try:
                mem.add(Message(text, id=mid))
            except HierMemError as e:  # not acknowledged: counted, and the run goes on
                failed.append(f"{mid}: {e}")
                continue
            add_ms.append((time.perf_counter() - t0) * 1000.0)
            acked.append(mid)
        conn.send(("added", len(acked)))
        retrieve_ms: list[float] = []
        for q in _queries(job["tag"], job["queries"]):
            t0 = time.perf_counter()
            mem.retrieve(q)
            retrieve_ms.append((time.perf_counter() - t0) * 1000.0)
    finally:
        mem.close_store()
    conn.send(("done", {"add_ms": add_ms, "retrieve_ms": retrieve_ms, "acked": acked, "failed": failed}))


def _worker(conn: Connection) -> None:
    """A benchmark process: runs the jobs the parent sends over ``conn`` until "stop" or end of pipe."""
    from .core import pin_threads

    pin_threads()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if not isinstance(msg, tuple) or msg[0] != "job":
            return
        try:
            _run_job(conn, msg[1])
        except BaseException:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("error", traceback.format_exc()))


# --------------------------------------------------------------------------- the parent
class _Workers:
    """``n`` spawned worker processes with one pipe each; stopped (or killed) on :meth:`close`."""

    def __init__(self, n: int, timeout: float) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.timeout = timeout
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        try:
            for k in range(n):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child,), name=f"hiermem-bench-{k}", daemon=True)
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Tell every worker to stop and close the pipes (a worker waiting on its pipe then ends, one in
        the middle of a job ends after it); kill those still alive after 30 s."""
        for c in self.conns:
            with contextlib.suppress(OSError, ValueError):
                c.send(("stop",))
            c.close()
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(10)

    def receive(
        self, pending: set[int], deadline: float, what: str
    ) -> Iterable[tuple[int, tuple[Any, ...], float]]:
        """``(worker, message, parent's perf_counter at receipt)`` until ``pending`` is empty (the caller
        removes workers from it); raises on a worker error, a dead worker or the deadline."""
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProcessBenchError(f"{len(pending)} benchmark process(es) did not {what} in time.")
            for c in _wait([self.conns[i] for i in sorted(pending)], timeout=min(left, 5.0)):
                i = self.conns.index(c)  # type: ignore[arg-type]
                try:
                    msg = c.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    code = self.procs[i].exitcode
                    raise ProcessBenchError(
                        f"Benchmark process {i} ended (exit code {code}) before it could {what}."
                    ) from None
                if msg[0] == "error":
                    raise ProcessBenchError(f"Benchmark process {i} failed:\n{msg[1]}")
                yield i, msg, time.perf_counter()

    def run(self, jobs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Run one job on each of the first ``len(jobs)`` workers from a common start; the raw figures."""
        idx = list(range(len(jobs)))
        for i, job in zip(idx, jobs):
            self.conns[i].send(("job", job))
        policies: dict[int, str] = {}
        pending = set(idx)
        for i, msg, _ in self.receive(pending, time.monotonic() + self.timeout, "open its memory"):
            policies[i] = str(msg[1])
            pending.discard(i)
        start = time.perf_counter()
        for i in idx:
            self.conns[i].send("go")
        added_at: dict[int, float] = {}
        done: dict[int, dict[str, Any]] = {}
        pending = set(idx)
        for i, msg, at in self.receive(pending, time.monotonic() + self.timeout, "finish its workload"):
            if msg[0] == "added":
                added_at[i] = at
            elif msg[0] == "done":
                done[i] = msg[1]
                pending.discard(i)
        return {
            "wall_s": max(added_at.values()) - start,
            "policy": policies[0],
            "results": [done[i] for i in idx],
        }


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def _figures(raw: dict[str, Any]) -> dict[str, Any]:
    res = raw["results"]
    add_ms = [x for r in res for x in r["add_ms"]]
    retrieve_ms = [x for r in res for x in r["retrieve_ms"]]
    acked = sum(len(r["acked"]) for r in res)
    failed = [f for r in res for f in r["failed"]]
    wall = float(raw["wall_s"])
    return {
        "adds": acked,
        "failed_adds": len(failed),
        "add_errors": failed[:5],
        "retrieves": len(retrieve_ms),
        "policy": raw["policy"],
        "wall_s": wall,
        "adds_per_s": acked / wall if wall > 0 else None,
        "add_ms_p50": _pct(add_ms, 50),
        "add_ms_p95": _pct(add_ms, 95),
        "retrieve_ms_p50": _pct(retrieve_ms, 50),
        "retrieve_ms_p95": _pct(retrieve_ms, 95),
    }


_RATIOS = {
    "adds_per_s_ratio_to_sqlite": "adds_per_s",
    "add_p50_ratio_to_sqlite": "add_ms_p50",
    "add_p95_ratio_to_sqlite": "add_ms_p95",
    "retrieve_p50_ratio_to_sqlite": "retrieve_ms_p50",
    "retrieve_p95_ratio_to_sqlite": "retrieve_ms_p95",
}


def _ratios(run: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, key in _RATIOS.items():
        a, b = run.get(key), base.get(key)
        out[name] = a / b if a is not None and b else None
    return out


def _check(
    target: str | Path,
    namespace: tuple[str, ...] | None,
    sent: dict[str, str],
    acked: Iterable[str],
    embedder: str,
) -> int:
    """Open ``namespace`` afresh and check it holds every acknowledged message exactly once (with its
    text) and nothing that was not sent; returns the number of leaves. Raises :class:`ProcessBenchError`."""
    from ..memories.base import HierarchicalMemory
    from .core import HashSummarizer

    where = f"namespace {list(namespace)!r}" if namespace is not None else str(target)
    kw: dict[str, Any] = {} if namespace is None else {"namespace": namespace}
    mem = HierarchicalMemory.open(target, embedder=_embedder(embedder), summarizer=HashSummarizer(), **kw)
    try:
        leaves = [n for n in mem.to_dict()["tree"]["nodes"] if n["is_leaf"]]
    finally:
        mem.close_store()
    ids = [(n.get("message") or {}).get("id") for n in leaves]
    counts = collections.Counter(ids)
    problems = []
    missing = [m for m in acked if counts[m] == 0]
    if missing:
        problems.append(f"{len(missing)} acknowledged message(s) missing (e.g. {missing[:3]})")
    dup = sorted(str(m) for m, c in counts.items() if c > 1)
    if dup:
        problems.append(f"{len(dup)} message(s) stored more than once (e.g. {dup[:3]})")
    alien = sorted(str(m) for m in counts if m not in sent)
    if alien:
        problems.append(f"{len(alien)} leaf/leaves that were never sent (e.g. {alien[:3]})")
    wrong = [i for n, i in zip(leaves, ids) if i in sent and n["text"] != sent[i]]
    if wrong:
        problems.append(f"{len(wrong)} message(s) with another text (e.g. {wrong[:3]})")
    if problems:
        raise ProcessBenchError(f"Correctness check failed for {where}: " + "; ".join(problems) + ".")
    return len(leaves)


def _layout_jobs(
    run_id: str, n: int, layout: str, common: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[tuple[str, ...]]]:
    if layout == "shared":
        ns = ("bench", run_id, "shared", f"n{n}")
        names = [ns]
        spaces = [ns] * n
    else:
        spaces = [("bench", run_id, "separate", f"n{n}", f"p{k}") for k in range(n)]
        names = list(spaces)
    jobs = [{**common, "namespace": list(spaces[k]), "tag": f"p{k}"} for k in range(n)]
    return jobs, names


def _verify(
    jobs: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]], embedder: str
) -> dict[str, Any]:
    by_ns: dict[tuple[str, ...] | None, tuple[dict[str, str], list[str]]] = {}
    for job, res in zip(jobs, results):
        ns = tuple(job["namespace"]) if job["namespace"] is not None else None
        sent, acked = by_ns.setdefault(ns, ({}, []))
        sent.update(_messages(job["tag"], job["messages"]))
        acked.extend(res["acked"])
    leaves = 0
    for ns, (sent, acked) in by_ns.items():
        leaves += _check(jobs[0]["target"], ns, sent, acked, embedder)
    return {"ok": True, "namespaces": len(by_ns), "leaves": leaves}


def _validate(
    url: str, processes: Sequence[int], messages: int, queries: int, memory: str, embedder: str
) -> list[int]:
    from ..eval.methods import available_memories
    from ..stores import is_postgres_url

    if not is_postgres_url(url):
        raise InvalidInputError(
            f"url must be a PostgreSQL URL such as postgresql://user:password@host:5432/dbname, got {url!r}."
        )
    procs = list(processes)
    if not procs or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in procs):
        raise InvalidInputError(f"processes must be positive integers, e.g. (1, 2, 4); got {processes!r}.")
    for name, v, lo in (("messages", messages, 1), ("queries", queries, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InvalidInputError(f"{name} must be an integer >= {lo}, got {v!r}.")
    kinds = available_memories()
    if memory not in kinds:
        raise InvalidInputError(f"Unknown memory {memory!r}; available: {', '.join(kinds)}.")
    if embedder not in EMBEDDERS:
        raise InvalidInputError(f"embedder must be one of {', '.join(EMBEDDERS)}, got {embedder!r}.")
    return procs


def _clean_up(
    workers: _Workers | None, db: Any, run_id: str, created: Sequence[tuple[str, ...]], quiet: bool
) -> None:
    """Stop the workers, drop every namespace of the run (those known and any other under its prefix)
    and close the database; with ``quiet`` a failure to drop is swallowed."""
    if workers is not None:
        workers.close()
    try:
        leftover = [ns for ns in db.namespaces() if ns[:2] == ("bench", run_id)]
        for ns in dict.fromkeys([*created, *leftover]):
            db.drop_namespace(ns)
    except HierMemError:
        if not quiet:
            raise
    finally:
        db.close()


def run_process_bench(
    url: str,
    *,
    processes: Sequence[int] = (1, 2, 4),
    messages: int = 50,
    queries: int = 20,
    memory: str = "segtree",
    embedder: str = "hash",
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure many processes adding to and retrieving from one PostgreSQL database (see the module).

    Args:
        url: the database, ``postgresql://user:password@host:port/dbname``; the schema is created when
            absent. Namespaces ``("bench", <run id>, ...)`` are written and dropped at the end.
        processes: the process counts to run, default ``(1, 2, 4)``; each runs the shared and the
            separate layout.
        messages: messages each process adds, one ``add`` per message, default 50.
        queries: retrievals each process runs after its adds (default policy), default 20.
        memory: ``"segtree"`` (default), ``"memtree"``, ``"hat"`` or ``"xmemory"``.
        embedder: the stub embedder, ``"hash"`` (default) or ``"pool"``.
        timeout: seconds each phase of a run (opening, the workload) may take before the benchmark
            gives up, default 600.
        progress: called with a line of text before each run.

    Returns:
        ``{"schema", "config", "machine": {"start", "end"}, "sqlite_one_process": {...}, "runs": [...]}``.
        ``sqlite_one_process`` and every run carry ``adds`` (acknowledged), ``failed_adds``,
        ``retrieves``, ``policy``, ``wall_s``, ``adds_per_s``, ``add_ms_p50``, ``add_ms_p95``,
        ``retrieve_ms_p50``, ``retrieve_ms_p95`` and ``check`` (the correctness check); a run also
        ``processes``, ``layout`` (``"shared"`` or ``"separate"``), ``namespaces`` and the ratios
        ``adds_per_s_ratio_to_sqlite``, ``add_p50_ratio_to_sqlite``, ``add_p95_ratio_to_sqlite``,
        ``retrieve_p50_ratio_to_sqlite`` and ``retrieve_p95_ratio_to_sqlite`` (run / baseline; ``None``
        where the baseline figure is missing or zero).

    Raises:
        InvalidInputError: a malformed URL or argument, an unknown memory or embedder.
        PersistenceError: the server cannot be reached or the database is not a hiermem store.
        ProcessBenchError: a benchmark process failed or timed out, or a correctness check failed.
    """
    from ..stores.postgres import PostgresDatabase
    from .core import machine_description

    procs = _validate(url, processes, messages, queries, memory, embedder)
    say = progress or (lambda _msg: None)
    run_id = uuid.uuid4().hex[:12]
    db = PostgresDatabase(url.strip(), pool_size=2)  # fails fast on a bad server; creates the schema
    created: list[tuple[str, ...]] = []
    common = {
        "target": url.strip(),
        "memory": memory,
        "embedder": embedder,
        "messages": messages,
        "queries": queries,
    }
    doc: dict[str, Any] = {
        "schema": PROCESS_BENCH_SCHEMA,
        "config": {
            "database": db.location,
            "run_id": run_id,
            "namespace_prefix": ["bench", run_id],
            "processes": procs,
            "layouts": list(LAYOUTS),
            "messages_per_process": messages,
            "queries_per_process": queries,
            "memory": memory,
            "embedder": embedder,
            "summarizer": "HashSummarizer",
            "relevance": "dense",
            "adds": "one add per message",
            "start_method": "spawn",
            "sqlite_synchronous": "FULL",
        },
        "machine": {"start": machine_description()},
    }
    workers: _Workers | None = None
    try:
        say(f"starting {max(procs)} benchmark process(es)")
        workers = _Workers(max(procs), timeout)
        with tempfile.TemporaryDirectory(prefix="hiermem-bench-") as tmp:
            say("SQLite, 1 process")
            job = {**common, "target": str(Path(tmp) / "m.sqlite"), "namespace": None, "tag": "p0"}
            raw = workers.run([job])
            base = _figures(raw)
            base["check"] = _verify([job], raw["results"], embedder)
        doc["sqlite_one_process"] = base
        runs = []
        for n in procs:
            for layout in LAYOUTS:
                say(f"PostgreSQL, {n} process(es), {layout} namespace{'s' if layout == 'separate' else ''}")
                jobs, names = _layout_jobs(run_id, n, layout, common)
                created.extend(names)
                raw = workers.run(jobs)
                fig = _figures(raw)
                run = {"processes": n, "layout": layout, "namespaces": len(names), **fig}
                run.update(_ratios(fig, base))
                run["check"] = _verify(jobs, raw["results"], embedder)
                runs.append(run)
        doc["runs"] = runs
    except BaseException:
        _clean_up(workers, db, run_id, created, quiet=True)  # the first error is the one to report
        raise
    _clean_up(workers, db, run_id, created, quiet=False)
    doc["config"]["namespaces_dropped"] = len(dict.fromkeys(created))
    doc["machine"]["end"] = machine_description()
    return doc


# --------------------------------------------------------------------------- report
def _cell(v: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return format(v, fmt)


def to_markdown(doc: dict[str, Any]) -> str:
    """The process benchmark as a Markdown report: configuration, machine and one table row per run,
    SQLite in one process first, every figure also as a ratio to it."""
    c = doc["config"]
    m = doc.get("machine", {})
    lines = [
        "# hiermem bench: many processes on one PostgreSQL database",
        "",
        f"Database {c['database']}; memory `{c['memory']}` (stub embedder `{c['embedder']}`, "
        f"{c['summarizer']}, relevance {c['relevance']}); {c['messages_per_process']} adds (one message "
        f"each) then {c['queries_per_process']} retrievals (default policy) per process; "
        f"{c['start_method']} processes.",
    ]
    for when in ("start", "end"):
        mm = m.get(when)
        if mm:
            load = mm.get("load_average_1_5_15")
            lines.append(
                f"Machine at {when}: {mm.get('logical_cpus')} logical CPUs ({mm.get('cpu_model') or '?'}), "
                f"load average {load if load is not None else '?'}."
            )
    lines += [
        "",
        "| store | processes | layout | adds/s | add p50 ms | add p95 ms | retrieve p50 ms "
        "| retrieve p95 ms | adds/s ÷ SQLite | add p50 ÷ SQLite | retrieve p50 ÷ SQLite "
        "| retrieve p95 ÷ SQLite |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(store: str, n: int, layout: str, r: dict[str, Any], ratios: bool) -> str:
        cells = [
            store,
            str(n),
            layout,
            _cell(r.get("adds_per_s"), ".1f"),
            _cell(r.get("add_ms_p50"), ".2f"),
            _cell(r.get("add_ms_p95"), ".2f"),
            _cell(r.get("retrieve_ms_p50"), ".2f"),
            _cell(r.get("retrieve_ms_p95"), ".2f"),
        ]
        keys = (
            "adds_per_s_ratio_to_sqlite",
            "add_p50_ratio_to_sqlite",
            "retrieve_p50_ratio_to_sqlite",
            "retrieve_p95_ratio_to_sqlite",
        )
        cells += [_cell(r.get(k), ".2f") if ratios else "1.00" for k in keys]
        return "| " + " | ".join(cells) + " |"

    if doc.get("sqlite_one_process"):
        lines.append(row("SQLite", 1, "one file", doc["sqlite_one_process"], False))
    for r in doc.get("runs", []):
        lines.append(row("PostgreSQL", r["processes"], r["layout"], r, True))
    lines += [
        "",
        "adds/s: acknowledged adds of all processes over the wall time from the common start to the last "
        "process's last add. Latencies are pooled over every process of a run. Every run was checked: each "
        "acknowledged message is stored exactly once in its namespace.",
        "",
    ]
    return "\n".join(lines)
