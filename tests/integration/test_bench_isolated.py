"""Benchmarks run in isolated subprocesses (``isolate=True``): ``hiermem bench`` and the conversation
workload with size caps."""

from __future__ import annotations

from shared_core.bench import core as B
from shared_core.bench import workloads as W


def test_isolated_run_in_a_subprocess():
    doc = B.run_bench(
        [30], memories=["hat"], queries=2, window=5, throughput_turns=0, isolate=True, trace_max=0
    )
    r = doc["memories"]["hat"]
    assert r["sizes"][0]["leaves"] == 30 and "memory_profile" not in r
    assert r["peak_rss_bytes"] > 0


def test_isolated_run_and_size_caps():
    events = []
    doc = W.run_workloads(
        conversation=True,
        sizes=[30, 60],
        memories=["hat", "memtree"],
        streams=["random"],
        window=3,
        size_caps={"memtree": 30},
        isolate=True,
        progress=lambda *e: events.append(e),
    )
    conv = doc["conversation"]
    assert conv["not_run"] == [{"memory": "memtree", "leaves": 60, "reason": "size cap"}]
    assert [s["leaves"] for s in conv["results"]["memtree"]["random"]["sizes"]] == [30]
    assert [s["leaves"] for s in conv["results"]["hat"]["random"]["sizes"]] == [30, 60]
    assert ("conversation hat random", 63, 63) in events
