"""A memory's management operations on a durable store (SQLite in the unit tests, PostgreSQL in the
integration tests): unique ids, upsert, get_all and close survive a reopen."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared_core import DuplicateIdError, HierarchicalMemory, MemoryClosedError, Message
from tests.support.memory import message_text


def check_durable_management(open_: Callable[[], HierarchicalMemory]) -> None:
    """``open_()`` opens (or reopens) the same durable memory. Checks that a duplicate id is refused and
    nothing is written, that an upsert is one durable replacement, that ``get_all`` reads the reopened
    store, and that ``with`` closes the memory so the store can be opened again in this process."""
    msgs = [Message(message_text(i), id=f"m{i}", speaker="Ann", metadata={"i": i}) for i in range(4)]
    with open_() as mem:
        mem.add(msgs[:3])
        with pytest.raises(DuplicateIdError, match="'m1'"):
            mem.add([msgs[3], Message("again", id="m1")])
        new = Message("The dog is called Rex now.", id="m1", timestamp="2025-05-09", metadata={"v": 2})
        mem.add([new, msgs[3]], upsert=True)
        expected = [msgs[0], msgs[2], new, msgs[3]]
        assert mem.get_all() == expected
    assert mem.closed
    with pytest.raises(MemoryClosedError):
        mem.get_all()
    with open_() as back:  # the store was released: it opens again in this process
        assert back.get_all() == expected
        assert back.get_all(where={"i": {"$gte": 2}}) == [msgs[2], msgs[3]]
        assert len(back) == 4
        with pytest.raises(DuplicateIdError, match="'m0'"):
            back.add(Message("other", id="m0"))
        assert back.delete("m1") == 1
    back.close()  # idempotent
    with open_() as again:
        assert again.get_all() == [msgs[0], msgs[2], msgs[3]]
