"""Extractive summaries skip sentences without a content word (greetings, assents, numbered-list stubs)
whenever a sentence with one is there; a node whose sentences all lack one keeps them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core.models.extractive import ExtractiveSummarizer, has_content, split_sentences
from tests.support.memory import HashEmbedder

NOISE = ["User: Yes, please.", "1.", "3.", "2.", "User: Hello.", "Thanks!", "Okay, sure."]
CONTENT = [
    "User: I booked the flight to Lisbon for May 3rd.",
    "Assistant: The museum opens at nine on Sundays.",
    "Caroline: Hey Mel!",
    "I ran a 5K in 24 minutes.",
]


@pytest.mark.parametrize("sentence", NOISE)
def test_noise_has_no_content(sentence):
    assert not has_content(sentence)


@pytest.mark.parametrize("sentence", CONTENT)
def test_content(sentence):
    assert has_content(sentence)


def test_a_short_summary_drops_the_noise_around_its_content():
    s = ExtractiveSummarizer(HashEmbedder())
    text, _ = s.summarize(["User: Yes, please. 1. 3. 2.", CONTENT[0], "User: Hello."])
    assert text == CONTENT[0]


def test_a_summary_of_noise_only_keeps_it():
    s = ExtractiveSummarizer(HashEmbedder())
    assert s.summarize(["User: Yes, please.", "User: Hello."])[0] == "User: Yes, please. User: Hello."


@settings(max_examples=40, deadline=None)
@given(
    picks=st.lists(st.sampled_from(NOISE + CONTENT), min_size=1, max_size=30),
    budget=st.integers(40, 400),
)
def test_the_summary_holds_no_noise_sentence_when_any_content_is_there(picks, budget):
    s = ExtractiveSummarizer(HashEmbedder(), max_chars=budget)
    text, _ = s.summarize(picks)
    assert len(text) <= budget
    sentences = [x for p in picks for x in split_sentences(p)]
    if any(has_content(x) for x in sentences):
        kept = split_sentences(text.rstrip("…"))
        assert not any(x in NOISE for x in kept), text
    # a pool built one child at a time gives the same summary
    pool = s.pool()
    for p in picks:
        pool.append(p)
    assert pool.summary()[0] == text
