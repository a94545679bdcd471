"""A memory's add, retrieve and delete run BLAS on one thread and give the process its thread counts back
(``shared_core.arrays.one_blas_thread``): OpenBLAS's idle workers spinning after each threaded call kept
a second core busy through a bulk add."""

from __future__ import annotations

import threading

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from shared_core.arrays import one_blas_thread
from tests.support.memory import KINDS, CountingEmbedder, make_memory, message_text


def _blas_threads() -> set[int]:
    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


@pytest.fixture()
def two_blas_threads():
    if not _blas_threads():
        pytest.skip("no BLAS library found by threadpoolctl")
    with threadpool_limits(limits=2, user_api="blas"):
        if _blas_threads() != {2}:
            pytest.skip("BLAS cannot be set to two threads here")
        yield


class ThreadsSeenEmbedder(CountingEmbedder):
    """Records the BLAS thread counts in force at each call (messages in an add, the query in a
    retrieve)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[set[int]] = []

    def embed(self, texts):
        self.threads.append(_blas_threads())
        return super().embed(texts)


@pytest.mark.parametrize("kind", KINDS)
def test_add_retrieve_and_delete_run_blas_on_one_thread(kind, two_blas_threads):
    emb = ThreadsSeenEmbedder()
    mem = make_memory(kind, emb)
    report = mem.add([message_text(i) for i in range(40)])
    assert emb.threads and all(t == {1} for t in emb.threads), emb.threads
    assert _blas_threads() == {2}  # given back
    emb.threads.clear()
    assert mem.retrieve("cooking and music", k=3)
    assert emb.threads and all(t == {1} for t in emb.threads)
    assert _blas_threads() == {2}
    seen: list[set[int]] = []
    original = mem._delete_leaves

    def spy(leaves, usage):
        seen.append(_blas_threads())
        return original(leaves, usage)

    mem._delete_leaves = spy
    assert mem.delete(report.leaf_ids[0]) == 1
    assert seen == [{1}]
    assert _blas_threads() == {2}


def test_a_failing_add_gives_the_threads_back(two_blas_threads):
    class Failing(CountingEmbedder):
        def embed(self, texts):
            raise RuntimeError("embedder down")

    mem = make_memory("segtree", Failing())
    with pytest.raises(RuntimeError, match="embedder down"):
        mem.add([message_text(i) for i in range(3)])
    assert _blas_threads() == {2}


def test_nested_blocks_limit_once_and_restore_when_the_outermost_leaves(two_blas_threads):
    with one_blas_thread():
        with one_blas_thread():
            assert _blas_threads() == {1}
        assert _blas_threads() == {1}  # the outer block still holds the limit
    assert _blas_threads() == {2}


def test_a_worker_thread_gives_back_control_of_a_process_wide_blas(two_blas_threads):
    """threadpoolctl lets one live thread set a process-wide OpenBLAS's count: a worker thread that
    took it for a memory operation gives it back, so the application's own limits still work."""
    from threadpoolctl import OpenBLASController

    OpenBLASController.clear_controlling_thread(force=True)  # the worker takes control first
    done, finish = threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def worker() -> None:
        with one_blas_thread():
            seen.append(_blas_threads())
        done.set()
        finish.wait(5)  # stays alive, as a thread pool's worker does

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert done.wait(5)
        assert seen == [{1}]
        assert _blas_threads() == {2}
        with threadpool_limits(limits=3, user_api="blas"):
            assert _blas_threads() == {3}
    finally:
        finish.set()
        t.join(5)
    assert _blas_threads() == {2}
