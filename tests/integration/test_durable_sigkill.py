"""Durable SQLite store: every acknowledged add survives SIGKILL (children killed at random moments)."""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from typing import Any

import pytest

from shared_core import Message
from tests.support.memory import (
    KINDS,
    HashEmbedder,
    check_tree,
    memory_class,
    message_text,
    open_memory,
)


def _writer(kind: str, path: str, conn: Any, limit: int) -> None:
    """Child: open the store, report how many messages it holds, then add messages one by one and send
    the index of each one after ``add`` returned (the acknowledgement)."""
    mem = memory_class(kind).open(path, embedder=HashEmbedder(), synchronous="FULL")
    start = len(mem)
    conn.send(("ready", start))
    for i in range(start, start + limit):
        mem.add(Message(message_text(i), id=f"m{i}"))
        conn.send(("ack", i))
    conn.send(("done", start + limit))
    time.sleep(30)


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.integration.test_durable_sigkill"])
    return ctx


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_never_loses_an_acknowledged_message(kind, tmp_path):
    """Child processes adding messages one by one are SIGKILLed at random moments; after every kill the
    reopened store holds every acknowledged message (in order, none half-inserted) and a valid tree."""
    memory_class(kind)
    runs, limit = 8, 400
    ctx = _context()
    rng = random.Random(f"sigkill-{kind}")
    path = tmp_path / f"{kind}.sqlite"
    acked_total = killed = lost = unacked_kept = 0
    max_acked = -1
    for run in range(runs):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_writer, args=(kind, str(path), send, limit), daemon=True)
        proc.start()
        send.close()
        early = run % 4 == 3  # every fourth run is killed at a random moment of start-up / reopen
        if early:
            time.sleep(rng.uniform(0.0, 0.2))
        else:
            assert recv.poll(60), "child did not start"
            time.sleep(rng.uniform(0.02, 0.35))
        proc.kill()  # SIGKILL
        proc.join(10)
        assert proc.exitcode == -9, f"run {run}: child ended by itself (exit {proc.exitcode})"
        killed += 1
        acks = []
        try:
            while recv.poll():
                tag, i = recv.recv()
                if tag == "ack":
                    acks.append(i)
        except (EOFError, OSError):
            pass
        recv.close()
        if acks:
            assert acks == list(range(acks[0], acks[-1] + 1))
            max_acked = max(max_acked, acks[-1])
        acked_total += len(acks)
        mem = open_memory(kind, path)
        n = len(mem)
        lost += max(0, max_acked + 1 - n)
        assert n >= max_acked + 1, f"run {run}: acknowledged messages lost ({max_acked + 1 - n})"
        assert n <= max_acked + 2, "more than the one in-flight message appeared"
        unacked_kept += n - (max_acked + 1)
        max_acked = n - 1  # an in-flight add that committed before the kill is durable from now on
        texts = [message_text(i) for i in range(n)]
        check_tree(mem, texts)
        assert [mem._store.nodes[i].message.id for i in mem._store.leaves()] == [f"m{i}" for i in range(n)]
        mem.close_store()
    print(
        f"\nSIGKILL[{kind}]: runs={runs} kills={killed} acknowledged={acked_total} "
        f"stored={max_acked + 1} committed-but-unacknowledged={unacked_kept} lost={lost}"
    )
    assert lost == 0
    assert acked_total > 0
