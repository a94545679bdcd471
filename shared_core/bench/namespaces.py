"""Evicted namespaces in ``hiermem bench`` (:func:`namespace_profile`).

A ``MemoryStore`` of durable SQLite namespaces on the stub models of :mod:`shared_core.bench.stubs`: the
time to open an evicted namespace again (its rows and vectors read back, its index rebuilt; the texts
embedded meanwhile are counted and must be none), the RSS each resident message costs (measured in a
fresh interpreter) and the SQLite bytes per message.
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
kind, root, names = sys.argv[1], sys.argv[2], [tuple(n) for n in json.loads(sys.argv[3])]
emb = ReplayEmbedder({})
st = MemoryStore(lambda: stub_memory(kind, emb), root, durable=True, max_resident=None)
st.get(names[0])  # libraries loaded, caches warm
r0 = _resident_bytes()
for ns in names[1:]:
    st.get(ns)
r1 = _resident_bytes()
print(json.dumps(None if r0 is None or r1 is None else r1 - r0))
"""


def _resident_rss(kind: str, root: str, names: list[tuple[str, ...]]) -> int | None:
    """RSS added by opening ``names[1:]`` after ``names[0]``, in a fresh interpreter (so that memory freed
    earlier in this process does not hide the growth); ``None`` when it cannot be measured."""
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
    kind: str, messages: int = 1_000, *, namespaces: int = 8, reopens: int = 8, seed: int = 0
) -> dict[str, Any]:
    """A :class:`~shared_core.namespaces.MemoryStore` of durable SQLite namespaces on stub models: the cold
    open of an evicted namespace, and RSS per resident message.

    ``namespaces`` namespaces of ``messages`` messages each (one ``add`` each) are written to SQLite stores
    in a temporary directory. Cold open: with ``max_resident=1`` the namespaces are opened in turn
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

    Returns:
        ``{"kind", "messages", "namespaces", "cold_open": {"wall", "cpu"} (median_ms, p90_ms, mean_ms),
        "embedded_texts_on_reopen", "rss_per_resident_message_bytes" (``None`` without a way to read
        RSS), "sqlite_bytes_per_message"}``.

    Raises:
        InvalidInputError: an unknown kind, or counts out of range.
    """
    import tempfile

    from ..namespaces import MemoryStore

    if messages < 1 or namespaces < 2 or reopens < 1:
        raise InvalidInputError("messages and reopens must be >= 1 and namespaces >= 2.")
    texts, table = topical_stream(messages * namespaces, seed)
    emb = _CountingReplay(table)
    names = [("bench", f"user{i}") for i in range(namespaces)]
    with tempfile.TemporaryDirectory(prefix="hiermem-ns-") as root:

        def store(max_resident: int | None) -> MemoryStore:
            return MemoryStore(
                lambda: stub_memory(kind, emb),
                root,
                durable=True,
                synchronous="NORMAL",
                max_resident=max_resident,
            )

        st = store(1)
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
        rss = _resident_rss(kind, root, names)
        disk = sum(f.stat().st_size for f in Path(root).rglob("memory.sqlite*"))
    n = messages * namespaces
    return {
        "kind": kind,
        "messages": messages,
        "namespaces": namespaces,
        "cold_open": {"wall": _stats(walls), "cpu": _stats(cpus)},
        "embedded_texts_on_reopen": reembedded,
        "rss_per_resident_message_bytes": None if rss is None else rss / (messages * (namespaces - 1)),
        "sqlite_bytes_per_message": disk / n,
    }
