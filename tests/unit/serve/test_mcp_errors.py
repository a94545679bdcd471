"""The MCP tools' errors: no client ever reads a name or text of a namespace its token does not hold.

A copied or tampered namespace directory is left out of ``list_namespaces`` (every token keeps listing
its own namespaces) and logged once for the operator, with its path and the reason; it is never
opened as the namespace it stands for. An error of the server's side (store, model, internal check)
reaches the client as a fixed sentence and a reference, its message only the server's log; an error
about the caller's own arguments keeps its message.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason='the MCP SDK is not installed (pip install "hiermem[mcp]")')

from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

from shared_core.namespaces import MemoryStore, NamespaceDeletedError  # noqa: E402
from shared_core.serve.mcp_auth import Grant  # noqa: E402
from shared_core.serve.mcp_server import HierMemTools, memory_factory  # noqa: E402
from shared_core.tree.nodes import TreeInvariantError  # noqa: E402
from shared_core.types import (  # noqa: E402
    CommitUnknownError,
    EmbeddingError,
    ModelError,
    NamespaceBusyError,
    PersistenceError,
    VersionMismatchError,
)
from tests.support.memory import HashEmbedder  # noqa: E402
from tests.support.namespaces import copy_namespace, tamper_record  # noqa: E402

#: a namespace only the "*" token holds, and what it keeps
HIDDEN = "eve-private-ledger"
SECRET = "the vault code is 8675309"
LOGGER = "shared_core.serve.mcp_server"
GRANTS: dict[str, Grant | None] = {
    "alice": Grant("token-1", frozenset({"alice"})),
    "bob": Grant("token-2", frozenset({"bob", "team"})),
    "carol": Grant("token-3", frozenset({"carol"})),
    "star": Grant("token-4", frozenset(), every=True),
    "no tokens": None,
}


def _store(root: Path) -> MemoryStore:
    return MemoryStore(memory_factory("segtree", HashEmbedder()), root, durable=True)  # type: ignore[arg-type]


def _tools(store: MemoryStore, grant: Grant | None) -> HierMemTools:
    return HierMemTools(store, access=None if grant is None else (lambda: grant))


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A store with alice, bob, team and the hidden namespace, each holding one message."""
    store = _store(tmp_path)
    admin = _tools(store, None)
    for ns in ("alice", "bob", "team", HIDDEN):
        admin.remember(ns, SECRET if ns == HIDDEN else f"{ns} likes green tea")
    store.close()
    yield tmp_path


def _no_leak(text: str, *paths: Path) -> None:
    assert HIDDEN not in text and "8675309" not in text, text
    for p in paths:
        assert str(p) not in text and p.name not in text, text


def test_list_namespaces_skips_copied_and_tampered_directories(root: Path, caplog: Any) -> None:
    bad = {
        tamper_record(root, ("team",), [HIDDEN]): "does not belong",  # tampered: names another
        copy_namespace(root, (HIDDEN,), ("carol",)): "does not belong",  # copied under carol's name
        tamper_record(root, ("dave",), {"not": "a list"}): "not a valid namespace record",
        tamper_record(root, ("erin",), [f"{HIDDEN}\u0000"]): "not a valid namespace record",
    }
    (root / "ns-garbage" / "namespace.json").mkdir(parents=True)  # not even a file: not a namespace
    store = _store(root)  # as after a restart: nothing open, everything read from the directories
    expect = {
        "alice": ["alice"],
        "bob": ["bob"],  # "team" is in a tampered directory
        "carol": [],  # the copy in carol's directory is another namespace's
        "star": ["alice", "bob", HIDDEN],
        "no tokens": ["alice", "bob", HIDDEN],
    }
    now: list[Grant | None] = [None]
    with_tokens = HierMemTools(store, access=lambda: now[0])  # one server, a grant per request
    without = _tools(store, None)  # another server, without tokens
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            for who, grant in GRANTS.items():
                now[0] = grant
                assert (without if grant is None else with_tokens).list_namespaces() == expect[who], who
    skipped = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    for d, reason in bad.items():  # each server tells the operator each bad directory once
        mine = [m for m in skipped if str(d) in m]
        assert len(mine) == 2 and all(reason in m for m in mine), skipped
    assert len(skipped) == 2 * len(bad), skipped
    with pytest.raises(PersistenceError):  # the library itself still refuses
        store.list_namespaces()


@pytest.mark.parametrize("tool", ["remember", "recall", "forget", "memory_stats"])
def test_a_copied_directory_is_never_opened_as_its_folder(root: Path, tool: str, caplog: Any) -> None:
    """Carol's directory holds a copy of the hidden namespace's: carol's token gets an error that names
    neither it nor its text, and the hidden namespace is unchanged."""
    copy = copy_namespace(root, (HIDDEN,), ("carol",))
    store = _store(root)
    carol = _tools(store, GRANTS["carol"])
    args = {"remember": ("x",), "recall": ("vault code",), "forget": ("x",), "memory_stats": ()}[tool]
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(ToolError) as info:
        getattr(carol, tool)("carol", *args)
    msg = str(info.value)
    _no_leak(msg, copy)
    assert msg.startswith("The server could not read or write this namespace's store."), msg
    ref = re.search(r"Reference ([0-9a-f]{12})", msg)
    assert ref, msg
    logged = [r.getMessage() for r in caplog.records if ref.group(1) in r.getMessage()]
    assert len(logged) == 1 and "does not belong" in logged[0] and HIDDEN in logged[0], logged
    star = _tools(store, GRANTS["star"])
    assert star.memory_stats(HIDDEN)["messages"] == 1
    assert [h.text for h in star.recall(HIDDEN, "vault code")] == [SECRET]


SERVER_ERRORS = [
    (PersistenceError, "could not read or write"),
    (VersionMismatchError, "could not read or write"),
    (NamespaceDeletedError, "deleted by another process"),
    (NamespaceBusyError, "busy"),
    (CommitUnknownError, "may or may not be stored"),
    (ModelError, "model"),
    (EmbeddingError, "embedder"),
    (TreeInvariantError, "failed to complete"),
]
#: the store method each tool calls, and the tool's arguments after the namespace
CALLS = {
    "remember": ("add", ("hello",)),
    "recall": ("get", ("hello",)),
    "forget": ("get", ("an-id",)),
    "memory_stats": ("get", ()),
    "list_namespaces": ("list_namespaces", None),
}


@pytest.mark.parametrize(("cls", "told"), SERVER_ERRORS, ids=[c.__name__ for c, _ in SERVER_ERRORS])
@pytest.mark.parametrize("tool", list(CALLS))
def test_server_errors_reach_a_client_without_their_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any, tool: str, cls: type, told: str
) -> None:
    """The store raising an error whose message names another namespace, its text and a path: the
    client reads a fixed sentence and a reference, the server's log the message under that reference."""
    store = _store(tmp_path)
    leak = f"{tmp_path}/ns-x: {HIDDEN!r} holds {SECRET!r}"
    method, args = CALLS[tool]

    def fail(*_: Any, **__: Any) -> Any:
        raise cls(leak)

    monkeypatch.setattr(store, method, fail)
    tools = _tools(store, GRANTS["alice"])
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(ToolError) as info:
        getattr(tools, tool)(*(() if args is None else ("alice", *args)))
    msg = str(info.value)
    _no_leak(msg, tmp_path)
    assert told in msg, msg
    ref = re.search(r"\(Reference ([0-9a-f]{12}) in the server's log\.\)$", msg)
    assert ref, msg
    logged = [r for r in caplog.records if ref.group(1) in r.getMessage()]
    assert len(logged) == 1 and leak in logged[0].getMessage() and tool in logged[0].getMessage()
    assert logged[0].levelno == (
        logging.WARNING
        if cls in (NamespaceDeletedError, NamespaceBusyError, CommitUnknownError)
        else logging.ERROR
    )


def test_errors_about_the_callers_arguments_keep_their_message(tmp_path: Path) -> None:
    """What the caller sent, and its own memory's choices, are still named in the error."""
    store = _store(tmp_path)
    alice = _tools(store, GRANTS["alice"])
    mid = alice.remember("alice", "alice likes green tea")
    with pytest.raises(ToolError, match="no-such-policy") as info:
        alice.recall("alice", "tea", policy="no-such-policy")
    assert "collapsed" in str(info.value)
    with pytest.raises(ToolError, match="empty"):
        alice.remember("alice", "   ")
    with pytest.raises(ToolError, match="not-an-id"):
        alice.forget("alice", "not-an-id")
    assert alice.forget("alice", mid) == 1
