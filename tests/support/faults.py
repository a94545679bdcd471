"""Fault injection and snapshots of a memory's answers and index, for the commit / rollback tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shared_core import HierarchicalMemory
from tests.support.memory import (
    LLM_FREE_POLICIES,
)


class Fault:
    """One-shot fault: the first call of the patched function raises (before or after the real call)."""

    def __init__(self, exc: BaseException, after: bool = False) -> None:
        self.exc = exc
        self.after = after
        self.fired = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            if self.fired:
                return fn(*args, **kwargs)
            self.fired += 1
            if self.after:
                fn(*args, **kwargs)
            raise self.exc

        return patched


def index_snapshot(mem: HierarchicalMemory) -> tuple[list[int], np.ndarray] | None:
    """The index's ids in row order and its vectors (a copy)."""
    if mem._index is None:
        return None
    return mem._index.ids.tolist(), mem._index.get(mem._index.ids.tolist())


def answers(mem: HierarchicalMemory) -> list[Any]:
    out = []
    for policy in LLM_FREE_POLICIES[mem.kind]:
        hits = mem.retrieve("what about dogs and music", k=5, policy=policy)
        out.append([(h.node_id, round(h.score, 5), h.text) for h in hits])
    return out
