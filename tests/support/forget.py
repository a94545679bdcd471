"""Memories with every cache exercised, and a search for leftover traces of deleted texts."""

from __future__ import annotations

import gc
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from shared_core import HierarchicalMemory
from shared_core.memories.xmemory import rules
from tests.support.memory import HashEmbedder, make_memory

_NO_TEXT = (int, float, complex, bool, type(None), np.ndarray, np.generic, type)
# objects whose referents are code and module state, not data the memory holds
_NOT_ENTERED = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
)


def reachable_strings(root: Any, skip: tuple[Any, ...] = ()) -> list[tuple[str, str]]:
    """``(path, text)`` of every string (bytes decoded) reachable from ``root`` through dicts,
    sequences, sets, instance attributes and, for objects without attributes (extension objects such
    as PyStemmer's stemmer and its word cache), the objects the garbage collector says they hold;
    objects in ``skip`` (the caller's models) are not entered, nor functions and modules."""
    skipped = {id(o) for o in skip}
    seen: set[int] = set()
    out: list[tuple[str, str]] = []
    todo: list[tuple[Any, str]] = [(root, "mem")]
    while todo:
        obj, path = todo.pop()
        if id(obj) in seen or id(obj) in skipped:
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            out.append((path, obj))
        elif isinstance(obj, (bytes, bytearray)):
            out.append((path, bytes(obj).decode("utf-8", "replace")))
        elif isinstance(obj, _NO_TEXT + _NOT_ENTERED):
            continue
        elif isinstance(obj, dict):
            for k, v in list(obj.items()):
                todo += [(k, f"{path}.<key>"), (v, f"{path}[{k!r}]"[:160])]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += [(v, f"{path}[{i}]") for i, v in enumerate(list(obj))]
        else:
            if hasattr(obj, "__dict__"):
                todo.append((vars(obj), f"{path}.{type(obj).__name__}"))
            for name in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, name):
                    todo.append((getattr(obj, name), f"{path}.{name}"))
            if not hasattr(obj, "__dict__") and not hasattr(type(obj), "__slots__"):
                todo += [(v, f"{path}.<{type(obj).__name__} holds>") for v in gc.get_referents(obj)]
    return out


def traces_of(mem: HierarchicalMemory, secrets: Iterable[str]) -> list[str]:
    """:func:`traces` of several secrets, in one walk."""

    secrets = list(secrets)
    if not secrets:
        return []
    texts = reachable_strings(mem, skip=(mem.embedder, mem.llm))
    texts += [("has_fact_sentence cache", k) for k in list(rules._fact_cache)]
    return [f"{path}: {text[:80]!r}" for path, text in texts if any(x in text for x in secrets)]


KINDS4 = ["segtree", "memtree", "hat", "xmemory"]


def cache_memory(kind: str, emb: Any = None, **kw: Any) -> HierarchicalMemory:
    """A small memory whose summaries are composed from the summariser's sentence vectors."""
    if kind == "memtree":
        kw.setdefault("base_threshold", -1.0)  # every message descends: it is summarised somewhere
    return make_memory(kind, emb if emb is not None else HashEmbedder(), annotation_vectors="composed", **kw)


def exercise(mem: HierarchicalMemory, query: str) -> None:
    """Every LLM-free policy once (and a budget), so the lexical index and the fact rule's cache fill."""
    for policy in mem.policies:
        if policy not in mem.llm_policies:
            mem.retrieve(query, k=20, policy=policy)
            mem.retrieve(query, k=20, policy=policy, max_tokens=400)
    mem.relevance(query, kind="bm25")
