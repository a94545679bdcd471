"""Namespaces: one memory per (user, agent, session), never mixed, stored under safe directory names."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from shared_core import HAT, MemTree, Message, SegTreeMem
from shared_core.namespaces import MemoryStore, namespace_dirname, normalize_namespace
from shared_core.types import InvalidInputError, NodeNotFoundError, PersistenceError
from tests.support.memory import LLM_FREE_POLICIES, HashEmbedder, check_tree
from tests.support.namespaces import copy_namespace, tamper_record

EMB = HashEmbedder()
CLASSES = [SegTreeMem, MemTree, HAT]
COLORS = ["red", "green", "blue", "amber", "violet"]
ANIMALS = ["otter", "falcon", "lynx", "heron", "bison", "gecko", "marten", "ibis", "tapir", "wombat"]


def factory(ns):
    """A different memory kind per namespace (by the user number), all sharing one embedder."""
    cls = CLASSES[int(ns[0][4:]) % len(CLASSES)]
    return cls(EMB)


def ns_of(i: int) -> tuple[str, str, str]:
    return (f"user{i:02d}", "assistant", f"session{i % 3}")


def facts(i: int) -> list[Message]:
    tok = f"tok{i:03d}"
    color, animal = COLORS[i % 5], ANIMALS[i % 10]
    return [
        Message(f"[{tok}] My favourite animal is the {color} {animal}.", id=f"{tok}-a"),
        Message(f"[{tok}] I travel to the garden with my dogs every weekend.", id=f"{tok}-b"),
        Message(f"[{tok}] The access code for my locker is {tok.upper()}-{i * 37 % 1000}.", id=f"{tok}-c"),
        Message(f"[{tok}] Cooking and music are my hobbies at work.", id=f"{tok}-d"),
    ]


QUERIES = ["favourite animal", "access code for the locker", "dogs and the garden", "hobbies at work"]


def tokens(text: str) -> set[str]:
    return set(re.findall(r"tok\d{3}", text, flags=re.IGNORECASE))


def assert_isolated(store: MemoryStore, n: int) -> int:
    checked = 0
    for i in range(n):
        ns = ns_of(i)
        own = {f"tok{i:03d}"}
        mem = store.get(ns)
        assert mem is not None
        for q in [*QUERIES, f"tok{(i + 1) % n:03d} locker code", f"the {ANIMALS[(i + 1) % 10]}"]:
            for policy in LLM_FREE_POLICIES[mem.kind]:
                extra = {"threshold": -1.0} if mem.kind == "memtree" else {}  # every node qualifies
                hits = store.retrieve(ns, q, k=10, policy=policy, **extra)
                assert hits, f"{ns}: nothing found for {q!r}"
                for h in hits:
                    assert {t.lower() for t in tokens(h.text)} == own, f"{ns} returned {h.text!r}"
                    assert all(s.startswith(f"tok{i:03d}-") for s in h.source_ids)
                    checked += 1
    return checked


def test_fifty_namespaces_never_mix(tmp_path):
    store = MemoryStore(factory, tmp_path / "root")
    for i in range(50):
        store.add(ns_of(i), facts(i))
    assert store.list_namespaces() == sorted(ns_of(i) for i in range(50))
    assert store.list_namespaces(("user07",)) == [ns_of(7)]
    checked = assert_isolated(store, 50)
    assert checked > 50 * len(QUERIES)
    # saved and reloaded in a new process-like store: still separate, same answers
    written = store.save()
    assert len(written) == 50
    again = MemoryStore(factory, tmp_path / "root")
    assert again.list_namespaces() == store.list_namespaces()
    assert_isolated(again, 50)
    for i in (0, 13, 49):
        a, b = store.get(ns_of(i)), again.get(ns_of(i))
        assert b.to_dict()["tree"] == a.to_dict()["tree"]
        assert type(a) is type(b)


def test_durable_namespaces(tmp_path):
    store = MemoryStore(factory, tmp_path, durable=True, synchronous="NORMAL")
    for i in range(6):
        store.add(ns_of(i), facts(i))
    store.delete(ns_of(2), "tok002-c")
    store.close()
    again = MemoryStore(factory, tmp_path, durable=True)
    assert again.list_namespaces() == sorted(ns_of(i) for i in range(6))
    assert_isolated(again, 6)
    mem = again.get(ns_of(2))
    assert len(mem) == 3 and not any("locker" in h.text for h in mem.retrieve("locker code", k=10))
    check_tree(mem, deleted=True)
    again.close()


HOSTILE = [
    "..",
    ".",
    "../../etc/passwd",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "C:\\Windows\\system32",
    "~",
    "~root",
    "$HOME",
    "ns-evil",
    " leading space",
    "名前/..",
]


def test_hostile_names_stay_inside_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside.txt").write_text("keep")
    store = MemoryStore(lambda: SegTreeMem(EMB), root)
    for j, name in enumerate(HOSTILE):
        for ns in ((name,), ("user", name), (name, name, "s")):
            store.add(ns, f"fact number {j} for {ns!r}")
    store.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.txt", "root"]
    dirs = list(root.iterdir())
    assert len(dirs) == 3 * len(HOSTILE)
    for d in dirs:
        assert re.fullmatch(r"ns-[A-Za-z0-9_-]+", d.name), d.name
        assert d.resolve().parent == root.resolve()
    again = MemoryStore(lambda: SegTreeMem(EMB), root)
    assert again.list_namespaces() == store.list_namespaces()
    for j, name in enumerate(HOSTILE):
        hits = again.retrieve(("user", name), "fact number", k=5)
        assert [h.text for h in hits] == [f"fact number {j} for {('user', name)!r}"]
    assert again.delete_namespace(("..",)) is True
    assert ("..",) not in again and again.retrieve(("..",), "fact", k=3) == []
    assert (tmp_path / "outside.txt").read_text() == "keep"
    assert len(list(root.iterdir())) == 3 * len(HOSTILE) - 1


def test_similar_names_do_not_collide(tmp_path):
    store = MemoryStore(lambda: HAT(EMB), tmp_path)
    names = [("a/b",), ("a", "b"), ("a_b",), ("a b",), ("A_B",), ("a", "b", "c")]
    assert len({namespace_dirname(n) for n in names}) == len(names)
    for j, ns in enumerate(names):
        store.add(ns, f"only in namespace {j}")
    store.save()
    for j, ns in enumerate(names):
        assert [h.text for h in MemoryStore(lambda: HAT(EMB), tmp_path).retrieve(ns, "namespace", k=5)] == [
            f"only in namespace {j}"
        ]


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        ("a", ""),
        (),
        ("x",) * 9,
        "nul\x00byte",
        ("ok", "tab\there"),
        "new\nline",
        "\ud800",
        5,
        [3],
        None,
        "x" * 257,
    ],
)
def test_bad_namespace_names_are_rejected(bad, tmp_path):
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path)
    with pytest.raises(InvalidInputError):
        store.add(bad, "text")
    with pytest.raises(InvalidInputError):
        normalize_namespace(bad)
    assert list(tmp_path.iterdir()) == []


def test_reads_never_create_and_deletes(tmp_path):
    store = MemoryStore(lambda: MemTree(EMB), tmp_path)
    assert store.retrieve(("nobody",), "anything") == []
    assert store.get("nobody") is None and "nobody" not in store
    assert store.list_namespaces() == [] and list(tmp_path.iterdir()) == []
    with pytest.raises(NodeNotFoundError):
        store.delete("nobody", "x")
    store.add("alice", [Message("alice likes tea", id="t"), Message("alice has a cat", id="c")])
    assert store.delete("alice", "t") == 1
    assert [h.text for h in store.retrieve("alice", "alice likes", k=5, threshold=-1.0)] == [
        "alice has a cat"
    ]
    assert store.delete_namespace("alice") is True
    assert store.delete_namespace("alice") is False
    assert len(store) == 0


def test_tampered_namespace_record(tmp_path):
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path)
    store.add(("alice",), "alice's secret")
    store.add(("bob",), "bob's note")
    store.save()
    meta = store.path_of(("bob",)) / "namespace.json"
    meta.write_text(json.dumps({"format": 1, "namespace": ["alice"], "kind": "segtree"}))
    with pytest.raises(PersistenceError, match="does not belong"):
        MemoryStore(lambda: SegTreeMem(EMB), tmp_path).list_namespaces()
    meta.write_text('{"format": 1, "namespace": ["bob\\u0000"]}')
    with pytest.raises(PersistenceError):
        MemoryStore(lambda: SegTreeMem(EMB), tmp_path).list_namespaces()


def test_list_namespaces_can_skip_bad_directories(tmp_path):
    """With ``on_invalid`` a tampered, copied or unreadable directory is reported and left out."""
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=True)
    for ns in (("alice",), ("bob",), ("carol", "x")):
        store.add(ns, f"{ns[0]} likes tea")
    store.close()
    tampered = tamper_record(tmp_path, ("bob",), ["alice"])
    copied = copy_namespace(tmp_path, ("alice",), ("dave",))
    garbled = tamper_record(tmp_path, ("erin",), ["x"])
    (garbled / "namespace.json").write_text("{not json")
    bad: list[tuple[Path, PersistenceError]] = []
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=True)
    got = store.list_namespaces(on_invalid=lambda d, e: bad.append((d, e)))
    assert got == [("alice",), ("carol", "x")]
    assert store.list_namespaces(("carol",), on_invalid=lambda d, e: None) == [("carol", "x")]
    assert sorted(d for d, _ in bad) == sorted([tampered, copied, garbled])
    reasons = {d: str(e) for d, e in bad}
    assert "does not belong" in reasons[tampered] and "does not belong" in reasons[copied]
    assert "not a valid namespace record" in reasons[garbled]
    assert all(isinstance(e, PersistenceError) for _, e in bad)
    with pytest.raises(PersistenceError):  # without on_invalid: as before
        store.list_namespaces()


@pytest.mark.parametrize("durable", [True, False])
def test_a_copied_directory_is_never_opened_as_its_folder(tmp_path, durable):
    """Dave's directory holds a copy of alice's (its record names alice): dave's namespace refuses to
    open from it, for reads and writes, and neither directory changes."""
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=durable)
    store.add(("alice",), "alice's locker code is 4921")
    if not durable:
        store.save()
    store.close()
    copy = copy_namespace(tmp_path, ("alice",), ("dave",))
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=durable)
    for call in (
        lambda: store.retrieve(("dave",), "locker code"),
        lambda: store.get(("dave",)),
        lambda: store.add(("dave",), "dave's note"),
        lambda: store.delete(("dave",), "x"),
    ):
        with pytest.raises(PersistenceError, match="does not belong"):
            call()
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before
    assert [h.text for h in store.retrieve(("alice",), "locker code")] == ["alice's locker code is 4921"]


def test_factory_checks(tmp_path):
    with pytest.raises(InvalidInputError):
        MemoryStore("not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="root_dir"):
        MemoryStore(lambda: SegTreeMem(EMB), durable=True)
    shared = SegTreeMem(EMB)
    shared.add("already used")
    with pytest.raises(InvalidInputError, match="empty"):
        MemoryStore(lambda: shared).add("x", "text")
    with pytest.raises(InvalidInputError, match="not a hiermem memory"):
        MemoryStore(lambda: object()).add("x", "text")  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidInputError, match="root_dir"):
        MemoryStore(lambda: SegTreeMem(EMB)).save()


def test_concurrent_first_access_builds_one_memory():
    store = MemoryStore(lambda: SegTreeMem(EMB))
    got = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        got.append(store.get_or_create(("same", "ns")))
        store.add(("same", "ns"), f"thread {i} wrote this")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len({id(m) for m in got}) == 1
    assert len(store.get(("same", "ns"))) == 8


def test_dirname_is_stable_and_safe():
    assert namespace_dirname(("alice", "bot")) == namespace_dirname(["alice", "bot"])
    assert namespace_dirname("alice") == namespace_dirname(("alice",))
    name = namespace_dirname(("../../x", "/abs"))
    assert re.fullmatch(r"ns-[A-Za-z0-9_-]+", name) and ".." not in name and Path(name).name == name
