"""Managing a memory, every kind in RAM: a source id names one message (DuplicateIdError, upsert),
get_all lists the stored messages in insertion order, close() and the context manager. The same with
durable stores: tests/unit/stores/test_management_stores.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core import DuplicateIdError, InvalidInputError, MemoryClosedError, Message
from tests.support.memory import KINDS, check_tree, make_memory, message_text, stripped


def _msg(i: int, sid: str | None = None, **kw) -> Message:
    return Message(message_text(i), id=sid if sid is not None else f"m{i}", **kw)


def _fields(messages: list[Message]) -> list[dict]:
    return [m.to_dict() for m in messages]


# --------------------------------------------------------------------------- unique ids
@pytest.mark.parametrize("kind", KINDS)
def test_an_id_already_stored_raises_naming_it_and_adds_nothing(kind):
    mem = make_memory(kind)
    mem.add([_msg(0), _msg(1)])
    before = stripped(mem.to_dict())
    with pytest.raises(DuplicateIdError, match="'m1'") as err:
        mem.add([_msg(2), _msg(3, "m1")])
    assert err.value.ids == ("m1",)
    assert isinstance(err.value, InvalidInputError)
    assert stripped(mem.to_dict()) == before
    assert mem.delete("m1") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_an_id_twice_in_one_add_raises_and_adds_nothing(kind):
    mem = make_memory(kind)
    mem.add(_msg(0))
    before = stripped(mem.to_dict())
    with pytest.raises(DuplicateIdError, match="'d'"):
        mem.add([_msg(1, "d"), _msg(2), _msg(3, "d")])
    with pytest.raises(DuplicateIdError, match="'d'"):  # also with upsert: which one would win?
        mem.add([_msg(1, "d"), _msg(3, "d")], upsert=True)
    assert stripped(mem.to_dict()) == before


@pytest.mark.parametrize("kind", KINDS)
def test_upsert_replaces_the_stored_message_of_an_id(kind):
    mem = make_memory(kind)
    mem.add([_msg(i) for i in range(6)])
    new = Message("The dog is called Rex now.", id="m2", speaker="Ann", metadata={"v": 2})
    mem.add([new, _msg(6)], upsert=True)
    got = mem.get_all()
    assert [m.id for m in got] == ["m0", "m1", "m3", "m4", "m5", "m2", "m6"]
    assert got[5] == new
    assert all(message_text(2) not in h.text for h in mem.retrieve(message_text(2), k=20))
    check_tree(mem, deleted=True)
    assert mem.delete("m2") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_messages_without_ids_are_never_duplicates(kind):
    mem = make_memory(kind)
    mem.add(["same text", "same text"])
    mem.add("same text")
    assert [m.text for m in mem.get_all()] == ["same text"] * 3


def test_allow_duplicate_ids_keeps_several_messages_under_one_id_and_not_with_upsert():
    mem = make_memory("segtree")
    mem.add([_msg(0, "k"), _msg(1, "k")], allow_duplicate_ids=True)
    assert mem.delete("k") == 2
    with pytest.raises(InvalidInputError, match="allow_duplicate_ids"):
        mem.add(_msg(2), upsert=True, allow_duplicate_ids=True)


# --------------------------------------------------------------------------- get_all
@pytest.mark.parametrize("kind", KINDS)
def test_get_all_lists_every_field_in_insertion_order(kind):
    mem = make_memory(kind)
    assert mem.get_all() == []
    msgs = [
        Message(message_text(i), role="user", speaker=f"S{i % 2}", timestamp=f"2025-05-0{i + 1}", id=f"m{i}")
        for i in range(5)
    ]
    msgs = [
        Message(m.text, m.role, m.speaker, m.timestamp, m.id, {"i": i, "even": i % 2 == 0})
        for i, m in enumerate(msgs)
    ]
    mem.add(msgs[:3])
    mem.add(msgs[3:])
    mem.delete("m1")
    kept = [m for m in msgs if m.id != "m1"]
    assert _fields(mem.get_all()) == _fields(kept)
    assert mem.get_all(where={"even": True}) == [m for m in kept if m.metadata["even"]]
    assert mem.get_all(where={"i": {"$gte": 2}}, limit=2, offset=1) == kept[2:4]
    assert mem.get_all(limit=0) == [] and mem.get_all(offset=10) == []
    assert mem.get_all(where=lambda m: m.speaker == "S0") == [m for m in kept if m.speaker == "S0"]
    got = mem.get_all()
    got[0].metadata["i"] = 99  # a copy: nothing stored changes
    assert mem.get_all()[0].metadata["i"] == 0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"limit": -1}, "-1"),
        ({"limit": 2.5}, "2.5"),
        ({"limit": True}, "True"),
        ({"offset": -3}, "-3"),
        ({"offset": None}, "None"),
        ({"offset": "1"}, "'1'"),
        ({"where": {"i": {"$near": 1}}}, r"\$near"),
        ({"where": 3}, "3"),
    ],
)
def test_get_all_refuses_bad_arguments_naming_them(kwargs, named):
    mem = make_memory("segtree")
    mem.add(_msg(0))
    with pytest.raises(InvalidInputError, match=named):
        mem.get_all(**kwargs)


_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "add_batch", "upsert", "delete", "dup"]), st.integers(0, 7)),
    min_size=1,
    max_size=14,
)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_get_all_after_adds_upserts_and_deletes_equals_a_list_of_live_messages(kind, ops):
    mem = make_memory(kind)
    model: list[Message] = []  # the live messages in insertion order
    for n, (op, key) in enumerate(ops, start=1):
        sid = f"id{key}"
        stored = any(m.id == sid for m in model)
        if op == "add" or op == "dup":
            m = Message(f"{message_text(n)} Version {n}.", id=sid, metadata={"n": n})
            if stored:
                with pytest.raises(DuplicateIdError):
                    mem.add(m)
            else:
                mem.add(m)
                model.append(m)
        elif op == "add_batch":  # an id-less message and a fresh id in one call
            batch = [Message(f"{message_text(n)} Note {n}."), Message(f"Fresh {n}.", id=f"fresh{n}")]
            mem.add(batch)
            model.extend(batch)
        elif op == "upsert":
            m = Message(f"{message_text(n)} Replaced {n}.", id=sid, speaker="Bo")
            mem.add(m, upsert=True)
            model = [x for x in model if x.id != sid] + [m]
        elif stored:
            assert mem.delete(sid) == 1
            model = [x for x in model if x.id != sid]
        assert mem.get_all() == model
    assert len(mem) == len(model)


# --------------------------------------------------------------------------- close
@pytest.mark.parametrize("kind", KINDS)
def test_a_closed_memory_raises_a_typed_error_and_close_is_idempotent(kind, tmp_path):
    with make_memory(kind) as mem:
        mem.add([_msg(0), _msg(1)])
        assert not mem.closed
    assert mem.closed
    mem.close()  # again: nothing happens
    for call in (
        lambda: mem.add(_msg(2)),
        lambda: mem.retrieve("dogs"),
        lambda: mem.delete("m0"),
        lambda: mem.get_all(),
        lambda: len(mem),
        lambda: mem.stats(),
        lambda: mem.clear(),
        lambda: mem.refresh(),
        lambda: mem.attach_store(tmp_path / "m.sqlite"),
    ):
        with pytest.raises(MemoryClosedError, match="closed"):
            call()
    assert "closed" in repr(mem)
    with pytest.raises(MemoryClosedError), mem:
        pass
