"""Worker processes that each open the same PostgreSQL LangGraph store and run operations sent to them
over a pipe (the cross-process LangGraph store tests)."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from langgraph.store.base import PutOp

from tests.support.langgraph_store import leaves, open_store

WAIT = 300  # seconds a reply may take before the test gives up (a hung worker, never a timing check)


def _rows(items: list[Any]) -> list[tuple[Any, ...]]:
    return [(tuple(i.namespace), i.key, i.value) for i in items]


def _run(store: Any, msg: tuple[Any, ...]) -> Any:
    kind = msg[0]
    if kind == "put":
        store.put(msg[1], msg[2], msg[3])
        return None
    if kind == "delete":
        store.delete(msg[1], msg[2])
        return None
    if kind == "batch":
        store.batch([PutOp(*op) for op in msg[1]])
        return None
    if kind == "get":
        item = store.get(msg[1], msg[2])
        return None if item is None else _rows([item])[0]
    if kind == "search":
        return _rows(store.search(msg[1], query=msg[2], limit=100))
    if kind == "list":
        return store.list_namespaces()
    if kind == "leaves":
        return leaves(store, msg[1])
    raise ValueError(kind)


def _worker(url: str, conn: Any, hold_key: str | None = None) -> None:
    """Open the store and answer the parent's operations until ``("stop",)``. With ``hold_key``, a run
    of puts holding that key stops for good after its texts are in the memory, before its items are
    committed (and says so): the parent kills the process there."""
    from langchain_hiermem.store_durable import DurableHierMemStore

    if hold_key is not None:
        commit = DurableHierMemStore._commit_puts

        def held(self: Any, added: Any, now: Any) -> None:
            if any(op.key == hold_key for a in added for op in a.ops):
                conn.send(("holding", os.getpid()))
                while True:  # until SIGKILL
                    time.sleep(60)
            commit(self, added, now)

        DurableHierMemStore._commit_puts = held  # type: ignore[method-assign]
    try:
        opened = open_store(url, fields=["text"])
        store = opened.__enter__()
    except Exception as e:  # reported to the parent, which fails the test
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    try:
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            try:
                conn.send(("ok", _run(store, msg)))
            except Exception as e:  # reported to the parent, which fails the test
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        opened.__exit__(None, None, None)


class Worker:
    """A worker process and its end of the pipe."""

    def __init__(self, url: str, hold_key: str | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(url, child, hold_key), daemon=True)
        self.proc.start()
        assert self.reply() == ("ready",)

    def reply(self) -> Any:
        for _ in range(WAIT):
            if self.conn.poll(1):
                return self.conn.recv()
            assert self.proc.is_alive(), f"the worker died (exit code {self.proc.exitcode})"
        raise AssertionError("the worker did not answer")

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def __call__(self, *msg: Any) -> Any:
        self.send(*msg)
        status, result = self.reply()
        assert status == "ok", result
        return result

    def stop(self) -> None:
        if self.proc.is_alive():
            self.send("stop")
            self.proc.join(WAIT)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(WAIT)
