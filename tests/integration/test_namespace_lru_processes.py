"""MemoryStore's bounded set of resident namespaces at scale and on PostgreSQL: 3,000 users in a process
under ``ulimit -n 1024`` (bounded open files, RSS levelling off), and PostgreSQL namespaces evicted and
reopened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared_core import Message, SegTreeMem
from shared_core.namespaces import DEFAULT_MAX_RESIDENT, MemoryStore
from shared_core.stores.resident import EvictedStore
from tests.support import ROOT
from tests.support.namespaces import EMB, CountingEmbedder, _msgs, _sources

_WORKLOAD = r"""
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
sys.path.insert(0, sys.argv[2])
from shared_core import Message, SegTreeMem
from shared_core.namespaces import MemoryStore
from tests.support.memory import HashEmbedder

emb = HashEmbedder(64)
store = MemoryStore(lambda: SegTreeMem(emb), root_dir=sys.argv[1], durable=True, synchronous="NORMAL")
N = int(sys.argv[3])

def rss():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no procfs: the peak (it only grows, so a flat peak is flat RSS as well)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

rss_at = {}
for i in range(N):
    store.add(("user%d" % i,), [
        Message("user%d says the secret word is w%dx" % (i, i), id="m%da" % i),
        Message("I like topic%d a lot" % (i % 7), id="m%db" % i),
    ])
    if i + 1 in (1, N // 3, N):
        rss_at[i + 1] = rss()
wrong = []
for i in range(N):
    hits = store.retrieve(("user%d" % i,), "w%dx secret word" % i, k=3)
    ids = {s for h in hits for s in h.source_ids}
    if "m%da" % i not in ids or not ids <= {"m%da" % i, "m%db" % i}:
        wrong.append(i)
print(json.dumps({"rss": rss_at, "wrong": wrong[:20], "n_wrong": len(wrong), "stats": store.stats(),
                  "fds": len(os.listdir("/proc/self/fd"))}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_NOFILE and /proc/self/statm are Linux's")
def test_three_thousand_namespaces_under_ulimit_1024(tmp_path: Path) -> None:
    """Default settings, ``ulimit -n 1024``: 3,000 users each get their own answers, open files stay
    bounded, and RSS levels off once the resident set is full."""
    n = 3000
    out = subprocess.run(
        [sys.executable, "-c", _WORKLOAD, str(tmp_path), str(ROOT), str(n)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["n_wrong"] == 0, res["wrong"]
    stats = res["stats"]
    assert stats["resident"] <= DEFAULT_MAX_RESIDENT and stats["evictions"] >= n - DEFAULT_MAX_RESIDENT
    assert res["fds"] < 2 * DEFAULT_MAX_RESIDENT + 100
    rss = {int(k): v for k, v in res["rss"].items()}
    first, third, last = rss[1], rss[n // 3], rss[n]
    assert last - third < 0.5 * (third - first), rss


def test_postgres_namespaces_are_evicted_and_reopened(pg_url: str) -> None:
    pytest.importorskip("psycopg")
    from shared_core.namespaces import NamespaceDeletedError

    emb = CountingEmbedder()
    a = MemoryStore(lambda: SegTreeMem(emb), url=pg_url, max_resident=2)
    b = MemoryStore(lambda: SegTreeMem(EMB), url=pg_url)
    held = a.get_or_create("alice")
    held.add(_msgs(0))
    for i in range(1, 6):
        a.add(f"user{i}", _msgs(i))
    assert a.resident == 2 and a.stats()["evictions"] >= 4 and isinstance(held._durable, EvictedStore)
    before = len(emb.texts)
    for i in range(1, 6):
        assert f"m{i}a" in _sources(a.retrieve(f"user{i}", f"w{i}x secret", k=3))
    assert len(emb.texts) - before == 5  # the queries only: vectors come from the database
    held.add(Message("alice adopted a beagle named Luna", id="luna"))  # reopened in place
    assert a.get("alice") is held and "luna" in _sources(b.retrieve("alice", "beagle Luna", k=3))

    # another process deletes an evicted namespace, or deletes and creates it again
    for i in range(1, 4):
        a.retrieve(f"user{i}", "secret")  # alice and user4 / user5 are evicted now
    assert isinstance(held._durable, EvictedStore)
    assert b.delete_namespace("alice") and b.delete_namespace("user4")
    b.add("user4", Message("a new user4 likes chess", id="chess"))
    assert a.retrieve("alice", "beagle Luna") == [] and "alice" not in a
    assert _sources(a.retrieve("user4", "chess w4x secret", k=5)) == {"chess"}
    with pytest.raises(NamespaceDeletedError):
        held.retrieve("beagle")  # the stale handle says so rather than answering from old data
    a.close()
    b.close()
