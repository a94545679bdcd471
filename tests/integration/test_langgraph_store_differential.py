"""The durable PostgreSQL LangGraph store driven from two processes, differentially against LangGraph's
``InMemoryStore``.

Hypothesis draws runs of operations (put, delete, get, search with and without a query and with
filters, list_namespaces with prefix, suffix and ``max_depth``) over a few nested namespaces; each
operation is sent to one of two worker processes chosen by Hypothesis, each holding the same store open
the whole time, and its answer is compared with ``InMemoryStore`` replaying the operations in the same
global order. Listings without a query compare in order (namespaces in the order a put or delete first
touched them, as the store documents; ``InMemoryStore`` also counts a ``get`` as a touch, so its
namespaces are put in that order first; then insertion order within a namespace); a query
search compares the set of items (its ranking is the memory's, not ``InMemoryStore``'s cosine);
``list_namespaces`` leaves out namespaces whose items were all deleted (``InMemoryStore`` keeps them),
and both answers are checked against that rule.
"""

from __future__ import annotations

import itertools
import multiprocessing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.memory import InMemoryStore

from tests.support.langgraph_store import TEXTS, open_store
from tests.support.langgraph_workers import WAIT

SUBSPACES = [("a",), ("a", "b"), ("c",), ("c", "a")]
KEYS = ["k0", "k1", "k2"]
FILTERS = [None, {"tag": "x"}, {"n": {"$gte": 2}}, {"tag": "y", "n": {"$lt": 3}}]
_RUNS = itertools.count()


def _rows(items: list[Any]) -> list[tuple[Any, ...]]:
    return [(tuple(i.namespace), i.key, i.value) for i in items]


def _serve(url: str, conn: Any) -> None:
    """Open the store and answer the parent's operations until ``None``."""
    try:
        opened = open_store(url, fields=["text"])
        store = opened.__enter__()
    except Exception as e:  # reported to the parent, which fails the test
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    try:
        conn.send(("ready", None))
        while (msg := conn.recv()) is not None:
            kind, args = msg
            try:
                if kind == "put":
                    out: Any = store.put(*args)
                elif kind == "delete":
                    out = store.delete(*args)
                elif kind == "get":
                    item = store.get(*args)
                    out = None if item is None else _rows([item])[0]
                elif kind == "search":
                    prefix, query, flt = args
                    out = _rows(store.search(prefix, query=query, filter=flt, limit=100))
                else:
                    prefix, suffix, depth = args
                    out = store.list_namespaces(prefix=prefix, suffix=suffix, max_depth=depth, limit=100)
                conn.send(("ok", out))
            except Exception as e:  # reported to the parent, which fails the test
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        opened.__exit__(None, None, None)


class _Process:
    def __init__(self, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(url, child), daemon=True)
        self.proc.start()
        assert self._reply() == ("ready", None)

    def _reply(self) -> Any:
        for _ in range(WAIT):
            if self.conn.poll(1):
                return self.conn.recv()
            assert self.proc.is_alive(), f"the worker died (exit code {self.proc.exitcode})"
        raise AssertionError("the worker did not answer")

    def __call__(self, kind: str, *args: Any) -> Any:
        self.conn.send((kind, args))
        status, out = self._reply()
        assert status == "ok", out
        return out

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(WAIT)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(WAIT)


@pytest.fixture
def pair(pg_url: str):
    procs = [_Process(pg_url), _Process(pg_url)]
    yield procs
    for p in procs:
        p.stop()


values = st.fixed_dictionaries(
    {"text": st.sampled_from(TEXTS), "n": st.integers(0, 4), "tag": st.sampled_from(["x", "y"])}
)
operations = st.lists(
    st.tuples(
        st.integers(0, 1),  # the process that runs it
        st.one_of(
            st.tuples(st.just("put"), st.sampled_from(SUBSPACES), st.sampled_from(KEYS), values),
            st.tuples(st.just("delete"), st.sampled_from(SUBSPACES), st.sampled_from(KEYS)),
            st.tuples(st.just("get"), st.sampled_from(SUBSPACES), st.sampled_from(KEYS)),
            st.tuples(
                st.just("search"),
                st.sampled_from([(), ("a",), ("c",), ("a", "b")]),
                st.sampled_from([None, "dog", "beach walk"]),
                st.sampled_from(FILTERS),
            ),
            st.tuples(
                st.just("list"),
                st.sampled_from([None, ("a",), ("c",)]),
                st.sampled_from([None, ("a",), ("b",)]),
                st.sampled_from([None, 2, 3]),
            ),
        ),
    ),
    min_size=4,
    max_size=16,
)


def _listed(
    live: set[tuple[str, ...]], root: tuple[str, ...], prefix: Any, suffix: Any, depth: Any
) -> list[tuple[str, ...]]:
    """LangGraph's list_namespaces over the namespaces that hold items."""
    pre = (*root, *prefix) if prefix is not None else root
    names = {ns for ns in live if ns[: len(pre)] == pre}
    if suffix is not None:
        names = {ns for ns in names if ns[len(ns) - len(suffix) :] == tuple(suffix)}
    if depth is not None:
        names = {ns[:depth] for ns in names}
    return sorted(names)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations)
def test_two_processes_answer_as_in_memory_store(pair: list[_Process], ops: list[Any]) -> None:
    root = ("run", str(next(_RUNS)))  # every example in namespaces of its own
    ref = InMemoryStore()
    touched: list[tuple[str, ...]] = []  # namespaces in the order a put or delete first touched them

    def in_order(rows: list[Any]) -> list[Any]:
        return sorted(rows, key=lambda r: touched.index(r[0]))  # stable: keys keep their order

    for who, op in ops:
        proc, kind = pair[who], op[0]
        if kind in ("put", "delete", "get"):
            ns = (*root, *op[1])
            got = proc(kind, ns, *op[2:])
            if kind != "get" and ns not in touched:
                touched.append(ns)
            if kind == "put":
                ref.put(ns, op[2], op[3])
            elif kind == "delete":
                ref.delete(ns, op[2])
            else:
                item = ref.get(ns, op[2])
                assert got == (None if item is None else _rows([item])[0])
        elif kind == "search":
            prefix, query, flt = (*root, *op[1]), op[2], op[3]
            got = proc("search", prefix, query, flt)
            want = _rows(ref.search(prefix, filter=flt, limit=100))
            if query is None:
                assert got == in_order(want)
            else:
                assert sorted(got, key=repr) == sorted(want, key=repr)
        else:
            _, prefix, suffix, depth = op
            pre = (*root, *prefix) if prefix is not None else root
            got = [tuple(n) for n in proc("list", pre, suffix, None if depth is None else len(root) + depth)]
            live = {tuple(i.namespace) for i in ref.search(root, limit=1000)}
            mine = _listed(live, root, prefix, suffix, None if depth is None else len(root) + depth)
            ref_names = ref.list_namespaces(
                prefix=pre, suffix=suffix, max_depth=None if depth is None else len(root) + depth, limit=100
            )
            assert got == mine
            assert set(mine) <= set(ref_names)  # InMemoryStore lists the same, and emptied ones besides
    for proc in pair:  # both processes end with the same items as the reference
        assert proc("search", root, None, None) == in_order(_rows(ref.search(root, limit=100)))
