"""Evicted namespaces in ``hiermem bench`` (:func:`namespace_profile`, :func:`cold_open_bench`).

A ``MemoryStore`` of durable namespaces, SQLite files or one PostgreSQL database, on the stub models of
:mod:`shared_core.bench.stubs`: the time to open an evicted namespace again (its rows and vectors read
back, its index rebuilt; the texts embedded meanwhile are counted and must be none), the RSS each
resident message costs (measured in a fresh interpreter) and the bytes stored per message.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..types import InvalidInputError
from .stubs import ReplayEmbedder, _rss, _stats, _timed, stub_memory, topical_stream


class _CountingReplay(ReplayEmbedder):
    """A :class:`ReplayEmbedder` that counts the texts it embeds."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        super().__init__(table)
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)


def _resident_bytes() -> int | None:
    """RSS now (psutil, else ``/proc/self/statm``), or ``None`` when neither is available."""
    r = _rss()
    if r is None:
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as f:
            r = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return r


_RESIDENT_RSS = r"""
import json, sys
from shared_core.bench.namespaces import _resident_bytes
from shared_core.bench.stubs import ReplayEmbedder, stub_memory
from shared_core.namespaces import MemoryStore
from shared_core.stores import is_postgres_url
kind, root, names = sys.argv[1], sys.argv[2], [tuple(n) for n in json.loads(sys.argv[3])]
emb = ReplayEmbedder({})
if is_postgres_url(root):
    st = MemoryStore(lambda: stub_memory(kind, emb), url=root, max_resident=None)
else:
    st = MemoryStore(lambda: stub_memory(kind, emb), root, durable=True, max_resident=None)
st.get(names[0])  # libraries loaded, caches warm
r0 = _resident_bytes()
for ns in names[1:]:
    st.get(ns)
r1 = _resident_bytes()
print(json.dumps(None if r0 is None or r1 is None else r1 - r0))
"""


def _resident_rss(kind: str, root: str, names: list[tuple[str, ...]]) -> int | None:
    """RSS added by opening ``names[1:]`` after ``names[0]`` (``root``: a directory of SQLite namespaces
    or a PostgreSQL URL), in a fresh interpreter (so that memory freed earlier in this process does not
    hide the growth); ``None`` when it cannot be measured."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        out = subprocess.run(
            [sys.executable, "-c", _RESIDENT_RSS, kind, root, json.dumps(names)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=True,
        )
        v = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return None if v is None else int(v)


def namespace_profile(
    kind: str,
    messages: int = 1_000,
    *,
    namespaces: int = 8,
    reopens: int = 8,
    seed: int = 0,
    postgres: str | None = None,
) -> dict[str, Any]:
    """A :class:`~shared_core.namespaces.MemoryStore` of durable namespaces on stub models: the cold open
    of an evicted namespace, and RSS per resident message.

    ``namespaces`` namespaces of ``messages`` messages each (one ``add`` each) are written to SQLite stores
    in a temporary directory, or with ``postgres`` to that database (under a namespace prefix of their
    own, deleted at the end). Cold open: with ``max_resident=1`` the namespaces are opened in turn
    (``MemoryStore.get``), so each open reads an evicted namespace's rows and vectors back and rebuilds its
    index; nothing may be embedded again. RSS: in a fresh interpreter, one namespace is opened (libraries
    loaded), then all the others at once (``max_resident=None``); the RSS they added, divided by their
    messages.

    Args:
        kind: the memory kind.
        messages: messages per namespace (>= 1), default 1,000.
        namespaces: namespaces written (>= 2), default 8.
        reopens: timed cold opens, default 8.
        seed: stream seed, default 0.
        postgres: a ``postgresql://`` URL to measure PostgreSQL instead of SQLite; default ``None``.

    Returns:
        ``{"kind", "store" ("sqlite" or "postgres"), "messages", "namespaces", "cold_open": {"wall",
        "cpu"} (median_ms, p90_ms, mean_ms), "embedded_texts_on_reopen", "rss_per_resident_message_bytes"
        (``None`` without a way to read RSS), "sqlite_bytes_per_message"}`` (the last ``None`` with
        PostgreSQL).

    Raises:
        InvalidInputError: an unknown kind, counts out of range, a malformed URL.
        PersistenceError: the database cannot be reached.
    """
    import tempfile
    import uuid

    from ..namespaces import MemoryStore

    if messages < 1 or namespaces < 2 or reopens < 1:
        raise InvalidInputError("messages and reopens must be >= 1 and namespaces >= 2.")
    texts, table = topical_stream(messages * namespaces, seed)
    emb = _CountingReplay(table)
    if postgres is None:
        names = [("bench", f"user{i}") for i in range(namespaces)]
    else:  # a prefix of this run's own in a shared database
        names = [("bench", f"run-{uuid.uuid4().hex[:12]}", f"user{i}") for i in range(namespaces)]
    with tempfile.TemporaryDirectory(prefix="hiermem-ns-") as root:

        def store(max_resident: int | None) -> MemoryStore:
            if postgres is not None:
                return MemoryStore(lambda: stub_memory(kind, emb), url=postgres, max_resident=max_resident)
            return MemoryStore(
                lambda: stub_memory(kind, emb),
                root,
                durable=True,
                synchronous="NORMAL",
                max_resident=max_resident,
            )

        st = store(1)
        try:
            for i, ns in enumerate(names):
                st.add(ns, texts[i * messages : (i + 1) * messages])
            st.close()
            st = store(1)
            before = emb.texts
            walls, cpus = [], []
            for r in range(reopens):
                w, c = _timed(lambda r=r: st.get(names[r % namespaces]))
                walls.append(w)
                cpus.append(c)
            reembedded = emb.texts - before
            st.close()
            rss = _resident_rss(kind, postgres if postgres is not None else root, names)
            disk = None
            if postgres is None:
                disk = sum(f.stat().st_size for f in Path(root).rglob("memory.sqlite*")) / (
                    messages * namespaces
                )
        finally:
            if postgres is not None:
                for ns in names:
                    with contextlib.suppress(Exception):
                        st.delete_namespace(ns)
            st.close()
    return {
        "kind": kind,
        "store": "sqlite" if postgres is None else "postgres",
        "messages": messages,
        "namespaces": namespaces,
        "cold_open": {"wall": _stats(walls), "cpu": _stats(cpus)},
        "embedded_texts_on_reopen": reembedded,
        "rss_per_resident_message_bytes": None if rss is None else rss / (messages * (namespaces - 1)),
        "sqlite_bytes_per_message": disk,
    }


def cold_open_bench(
    kinds: Sequence[str],
    sizes: Sequence[int],
    *,
    postgres: str | None = None,
    namespaces: int = 3,
    reopens: int = 6,
    seed: int = 0,
    progress: Any = None,
) -> dict[str, Any]:
    """``hiermem bench --cold-open``: :func:`namespace_profile` for each memory kind and namespace size, on
    SQLite and, with ``postgres``, on PostgreSQL as well.

    Args:
        kinds: memory kinds.
        sizes: messages per namespace (each >= 1).
        postgres: a ``postgresql://`` URL, default ``None`` (SQLite only).
        namespaces: namespaces written per run (>= 2), default 3.
        reopens: timed cold opens per run, default 6.
        seed: stream seed, default 0.
        progress: called with a line of text before each run, default ``None``.

    Returns:
        ``{"config": {...}, "runs": [namespace_profile(...), ...]}`` in kind, size, store order.

    Raises:
        InvalidInputError: see :func:`namespace_profile`.
        PersistenceError: the database cannot be reached.
    """
    runs = []
    targets: list[str | None] = [None] if postgres is None else [None, postgres]
    for kind in kinds:
        for n in sizes:
            for target in targets:
                if progress is not None:
                    progress(
                        f"{kind}: {n} messages per namespace, {'sqlite' if target is None else 'postgres'}"
                    )
                runs.append(
                    namespace_profile(
                        kind, n, namespaces=namespaces, reopens=reopens, seed=seed, postgres=target
                    )
                )
    return {
        "config": {
            "kinds": list(kinds),
            "sizes": [int(n) for n in sizes],
            "namespaces": namespaces,
            "reopens": reopens,
            "seed": seed,
            "postgres": postgres is not None,
        },
        "runs": runs,
    }


def cold_open_markdown(doc: dict[str, Any]) -> str:
    """A Markdown table of :func:`cold_open_bench`'s document."""
    lines = [
        "| memory | store | messages | cold open wall median ms | p90 ms | CPU median ms | texts embedded "
        "on reopen | RSS per resident message (bytes) | SQLite bytes per message |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        rss, disk = r["rss_per_resident_message_bytes"], r["sqlite_bytes_per_message"]
        lines.append(
            f"| {r['kind']} | {r['store']} | {r['messages']} | {r['cold_open']['wall']['median_ms']:.1f} | "
            f"{r['cold_open']['wall']['p90_ms']:.1f} | {r['cold_open']['cpu']['median_ms']:.1f} | "
            f"{r['embedded_texts_on_reopen']} | {'—' if rss is None else f'{rss:.0f}'} | "
            f"{'—' if disk is None else f'{disk:.0f}'} |"
        )
    return "\n".join(lines) + "\n"
