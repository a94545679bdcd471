"""``evaluate_online`` scores hits as ``hiermem eval`` does: evidence recall over leaf hits, span recall
over what a hit's text shows, subtree recall over every message below a hit."""

from __future__ import annotations

import pytest

from shared_core.eval import evaluate_online
from shared_core.eval.data import Conversation, Query
from shared_core.types import Hit, Message

MSGS = [
    Message("I adopted a dog named Luna.", speaker="Ann", id="m0"),
    Message("Luna loves the beach.", speaker="Ann", id="m1"),
    Message("I paint sunsets.", speaker="Bob", id="m2"),
    Message("Bob sold a painting of a lake.", speaker="Bob", id="m3"),
]


class SummaryOnly:
    """Returns one summary hit over m0..m3 whose text quotes only m1's sentence."""

    def add(self, messages):
        pass

    def retrieve(self, query, k=10):
        text = "Ann: Luna loves the beach. Ann and Bob talk about pets and painting."
        ids = ["m0", "m1", "m2", "m3"]
        return [Hit(node_id=9, text=text, score=1.0, depth=1, is_leaf=False, span=(0, 3), source_ids=ids)]


def test_a_summary_is_credited_with_what_it_quotes_only():
    conv = Conversation("c", MSGS, [Query("Where does Luna go?", "the beach", ["m1", "m3"], 1, 4, "q")])
    row = evaluate_online(conv, {"s": SummaryOnly}, k=1, progress=False).methods["s"].queries[0]
    assert row.evidence_recall == 0.0  # no leaf hit
    assert row.span_recall == pytest.approx(0.5)  # it quotes m1, not m3
    assert row.subtree_recall == 1.0  # both lie below it
