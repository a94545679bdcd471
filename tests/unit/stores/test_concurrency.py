"""Concurrency: one writer at a time, readers always see a consistent tree, nothing is lost.

8 writer threads and 8 reader threads share one memory for a bounded time; 100 async tasks
(``aadd`` / ``aretrieve``) run under one ``asyncio.gather``; a memory with a durable store attached is
written from many threads and the store is compared with the memory afterwards.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

from shared_core import HierarchicalMemory, Message
from tests.support.memory import (
    KINDS,
    LLM_FREE_POLICIES,
    HashEmbedder,
    check_tree,
    check_tree_dict,
    make_memory,
    memory_class,
    message_text,
    stripped,
)

WRITERS = 8
READERS = 8
SECONDS = 1.5  # wall time of each threaded run (bounded; the machine is shared)
QUERIES = ["dogs and travel", "cooking at work", "music in the garden", "detail number 7"]


def _run_threads(
    mem: HierarchicalMemory, kind: str, seconds: float
) -> tuple[list[str], list[BaseException], list[list[str]]]:
    """Writers add one message at a time (a few in a batch now and then); readers retrieve with every
    LLM-free policy and check snapshots. Returns every acknowledged text, the exceptions raised in any
    thread, and the acknowledged texts per writer (in order)."""
    stop = threading.Event()
    errors: list[BaseException] = []
    acked: list[list[str]] = [[] for _ in range(WRITERS)]
    reads = [0]
    lock = threading.Lock()

    def writer(w: int) -> None:
        rng = random.Random(w)
        j = 0
        try:
            while not stop.is_set():
                if rng.random() < 0.2:
                    batch = [f"Writer {w} item {j + b}: {message_text(j + b)}" for b in range(3)]
                    mem.add(batch)
                    acked[w].extend(batch)
                    j += 3
                else:
                    text = f"Writer {w} item {j}: {message_text(j)}"
                    mem.add(Message(text, id=f"w{w}-{j}"))
                    acked[w].append(text)
                    j += 1
        except BaseException as e:
            errors.append(e)
            stop.set()

    def reader(r: int) -> None:
        rng = random.Random(100 + r)
        try:
            while not stop.is_set():
                q = rng.choice(QUERIES)
                policy = rng.choice(LLM_FREE_POLICIES[kind])
                hits = mem.retrieve(q, k=5, policy=policy)
                assert len(hits) <= 5
                for h in hits:
                    assert h.text
                    assert h.span[0] <= h.span[1]
                if rng.random() < 0.15:  # a whole snapshot is consistent
                    check_tree_dict(mem.to_dict()["tree"], contiguous=mem.contiguous_spans)
                    stats = mem.stats()
                    assert stats["leaves"] <= stats["nodes"]
                with lock:
                    reads[0] += 1
        except BaseException as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    threads += [threading.Thread(target=reader, args=(r,)) for r in range(READERS)]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a thread is stuck"
    assert reads[0] > 0
    return [t for a in acked for t in a], errors, acked


def _check_all_present(mem: HierarchicalMemory, acked: list[list[str]]) -> None:
    stored = [mem._store.nodes[i].text for i in mem._store.leaves()]
    assert sorted(stored) == sorted(t for a in acked for t in a), "a message was lost or duplicated"
    pos = {t: i for i, t in enumerate(stored)}
    for a in acked:  # each writer's messages are stored in its own order
        assert [pos[t] for t in a] == sorted(pos[t] for t in a)


@pytest.mark.parametrize("kind", KINDS)
def test_eight_writers_eight_readers(kind):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(4)])
    _, errors, acked = _run_threads(mem, kind, SECONDS)
    assert not errors, f"{len(errors)} thread errors, first: {errors[0]!r}"
    seed = [[message_text(i) for i in range(4)]]
    _check_all_present(mem, seed + acked)
    check_tree(mem)
    assert sum(map(len, acked)) >= WRITERS  # every writer got through at least once on average


@pytest.mark.parametrize("kind", ["segtree", "hat"])
def test_threads_with_a_durable_store(kind, tmp_path):
    path = tmp_path / "m.sqlite"
    mem = memory_class(kind).open(path, embedder=HashEmbedder(), synchronous="NORMAL")
    _, errors, acked = _run_threads(mem, kind, 1.0)
    assert not errors, f"{len(errors)} thread errors, first: {errors[0]!r}"
    _check_all_present(mem, acked)
    before = stripped(mem.to_dict())
    mem.close_store()
    back = HierarchicalMemory.open(path, embedder=HashEmbedder())
    assert stripped(back.to_dict()) == before
    check_tree(back)
    back.close_store()


@pytest.mark.parametrize("kind", KINDS)
async def test_hundred_async_tasks(kind):
    mem = make_memory(kind)
    await mem.aadd([message_text(i) for i in range(3)])
    texts = [f"Async task {i}: {message_text(i)}" for i in range(50)]

    async def add(t: str) -> Any:
        return await mem.aadd(Message(t, id=t[:13]))

    async def read(i: int) -> Any:
        policy = LLM_FREE_POLICIES[kind][i % len(LLM_FREE_POLICIES[kind])]
        return await mem.aretrieve(QUERIES[i % len(QUERIES)], 4, policy)

    tasks = [add(t) for t in texts] + [read(i) for i in range(50)]
    random.Random(0).shuffle(tasks)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} task errors, first: {errors[0]!r}"
    reports = [r for r in results if hasattr(r, "leaf_ids")]
    assert len(reports) == 50 and all(len(r.leaf_ids) == 1 for r in reports)
    assert len({r.leaf_ids[0] for r in reports}) == 50
    stored = {mem._store.nodes[i].text for i in mem._store.leaves()}
    assert set(texts) <= stored and len(mem) == 53
    check_tree(mem)


async def test_sync_calls_inside_a_running_loop():
    """Sync methods work while an event loop runs (e.g. in a notebook): no asyncio.run inside."""
    mem = make_memory("segtree")
    mem.add("inside a running loop about dogs")
    assert mem.retrieve("dogs", k=1)[0].text == "inside a running loop about dogs"
    await mem.aadd("and the async path about travel")
    assert len(mem) == 2


def test_writes_are_serialised():
    """Two adds never interleave: an add that blocks inside the embedder holds off the other writer."""
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    class SlowEmbedder(HashEmbedder):
        def embed(self, texts):
            if any("slow" in t for t in texts) and not inside.is_set():
                inside.set()
                release.wait(5)
            return super().embed(texts)

    mem = make_memory("hat", embedder=SlowEmbedder())
    t1 = threading.Thread(target=lambda: (mem.add("slow message"), order.append("slow")))
    t1.start()
    assert inside.wait(5)
    t2 = threading.Thread(target=lambda: (mem.add("fast message"), order.append("fast")))
    t2.start()
    time.sleep(0.2)
    assert order == []  # the second writer waits for the first
    release.set()
    t1.join(5)
    t2.join(5)
    assert order == ["slow", "fast"]
    assert [mem._store.nodes[i].text for i in mem._store.leaves()] == ["slow message", "fast message"]
