"""``add(items, progress=...)``: a callable gets monotone ``(done, total)`` up to ``total``; the default
prints nothing; ``True`` draws a bar only on a terminal; a bad value is refused before anything changes."""

from __future__ import annotations

import io

import pytest

from shared_core import InvalidInputError
from shared_core.namespaces import MemoryStore
from shared_core.progress import progress_reporter
from tests.support.memory import KINDS, HashEmbedder, make_memory, message_text, stripped


@pytest.mark.parametrize("kind", KINDS)
def test_callable_gets_monotone_counts_up_to_total(kind):
    mem = make_memory(kind)
    calls: list[tuple[int, int]] = []
    mem.add([message_text(i) for i in range(12)], progress=lambda done, total: calls.append((done, total)))
    assert calls, "the callable was never called"
    assert {t for _, t in calls} == {12}
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(set(done)) == len(done)
    assert done[-1] == 12 and done[0] >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_default_and_false_print_nothing(kind, capsys):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(6)])
    mem.add([message_text(i) for i in range(6, 9)], progress=False)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


@pytest.mark.parametrize("bad", ["yes", 1, 0.5, object(), [print]])
@pytest.mark.parametrize("kind", KINDS)
def test_bad_progress_is_refused_and_the_memory_unchanged(kind, bad):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(4)])
    before = stripped(mem.to_dict())
    with pytest.raises(InvalidInputError, match="progress"):
        mem.add([message_text(i) for i in range(4, 8)], progress=bad)
    assert stripped(mem.to_dict()) == before


def test_true_draws_a_bar_only_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def __init__(self, tty: bool) -> None:
            super().__init__()
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    for tty in (False, True):
        err = Tty(tty)
        monkeypatch.setattr("sys.stderr", err)
        with progress_reporter(True, 5) as tick:
            for i in range(1, 6):
                tick(i)
        assert ("5/5" in err.getvalue()) is tty, err.getvalue()


def test_a_recomputed_transaction_does_not_report_backwards():
    calls: list[int] = []
    with progress_reporter(lambda d, t: calls.append(d), 3) as tick:
        for d in (1, 2, 1, 2, 3):  # a retried transaction starts over
            tick(d)
    assert calls == [1, 2, 3]


def test_memory_store_add_passes_progress_and_refuses_a_bad_one():
    store = MemoryStore(lambda: make_memory("segtree", HashEmbedder()))
    calls: list[tuple[int, int]] = []
    store.add(("u",), [message_text(i) for i in range(5)], progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (5, 5)
    with pytest.raises(InvalidInputError, match="progress"):
        store.add(("v",), [message_text(0)], progress="bar")
    assert store.list_namespaces() == [("u",)]
