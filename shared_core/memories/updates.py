"""The LLM-free rule that says a newer statement updates an older one (supersession).

Two messages state the same thing with a different value when one sentence of each shares its subject
with the other (at least :data:`MIN_SHARED` content words, stemmed, that are not values) while their
values differ: the numbers (``"4"``, ``"twelve"``, ``"15th"``) or the named things (capitalised words
inside a sentence, ``"Bordeaux"``) one holds and the other does not. ``"I've watched 4 MCU films in the
last 3 months"`` and, later, ``"I've watched 12 films in the last 3 months, including 5 MCU"`` share
*watch*, *film*, *last* and *month* and differ in 4 / 12 / 5: an update. The same sentence said twice
(same values) and two sentences about different subjects are not.

:class:`~shared_core.memories.supersession.Supersession` runs the rule on a new message and its nearest
earlier messages by the memory's own similarity (the message vectors), of the same speaker and role.
Content words are the tokens of two or more word characters outside bm25s' extended English stop-word
list (``STOPWORDS_EN_PLUS``), stemmed with PyStemmer's English Snowball stemmer, as the lexical index
stems them.

The rule is a heuristic: its precision on the LongMemEval dev histories is measured and reported in
docs/evaluation.md ("Knowledge that changes"). An LLM judge replaces it when the memory has an LLM.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from bm25s.stopwords import STOPWORDS_EN_PLUS

from ..models.extractive import split_sentences

__all__ = [
    "MIN_SHARED",
    "Statement",
    "has_subject",
    "may_update",
    "shares_subject",
    "statement_of",
    "updates",
]

#: content words (stems) a sentence pair must share to have one subject
MIN_SHARED = 2
#: at most this many sentences of a message take part (the first ones): a long document is not a
#: statement of many values
MAX_SENTENCES = 32
#: and at least this share of the two sentences' subject stems (Jaccard)
MIN_OVERLAP = 0.2

_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_ORDINALS = [
    "zeroth",
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
#: number words (cardinal and ordinal) as the digits they name
_NUMBER_WORDS: dict[str, str] = {
    **{w: str(i) for i, w in enumerate(_UNITS)},
    **{w: str(i) for i, w in enumerate(_ORDINALS) if i},
    **{w: str(20 + 10 * i) for i, w in enumerate(_TENS)},
    "hundred": "100",
    "thousand": "1000",
    "dozen": "12",
    "once": "1",
    "twice": "2",
}
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_WORD = re.compile(r"[^\W\d_][\w'’]*", re.UNICODE)
_FIRST_PERSON = frozenset(["i", "me", "my", "mine", "we", "us", "our", "ours"])
_STOP = frozenset(w.lower() for w in STOPWORDS_EN_PLUS)


@lru_cache(maxsize=1)
def _stemmer() -> object:
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("english", 0)


def _stem(words: list[str]) -> list[str]:
    return list(_stemmer().stemWords(words)) if words else []  # type: ignore[attr-defined]


class Statement:
    """The sentences of one message as the rule reads them: per sentence, its subject stems and its
    values (numbers and named things, lower-cased)."""

    __slots__ = ("sentences",)

    def __init__(self, sentences: list[tuple[frozenset[str], frozenset[str]]]) -> None:
        self.sentences = sentences


def _sentence(sentence: str) -> tuple[frozenset[str], frozenset[str]]:
    """``(subject stems, values)`` of one sentence; both empty for a question or a sentence that does
    not speak of the speaker (no first-person word): those state nothing about the speaker to update."""
    words = [w.lower().replace("’", "'") for w in _WORD.findall(sentence)]
    if sentence.rstrip().endswith("?") or not any(w in _FIRST_PERSON or w.startswith("i'") for w in words):
        return frozenset(), frozenset()
    values = {n.replace(",", "") for n in _NUMBER.findall(sentence)}
    content: list[str] = []
    for w in words:
        if w in _NUMBER_WORDS:
            values.add(_NUMBER_WORDS[w])
        elif len(w) > 2 and w not in _STOP and "'" not in w:
            content.append(w)
    return frozenset(_stem(content)), frozenset(values)


def statement_of(text: str) -> Statement:
    """The :class:`Statement` of a message text (its first :data:`MAX_SENTENCES` sentences)."""
    return Statement([_sentence(s) for s in split_sentences(text)[:MAX_SENTENCES]])


def updates(older: Statement, newer: Statement) -> bool:
    """Whether ``newer`` restates something ``older`` said with a different value (see the module).

    A pair of sentences counts when they share at least :data:`MIN_SHARED` subject stems, the newer
    sentence holds a value, and their value sets differ.
    """
    for s_new, v_new in newer.sentences:
        if not v_new or len(s_new) < MIN_SHARED:
            continue
        for s_old, v_old in older.sentences:
            if not (v_new - v_old and v_old - v_new):
                continue  # the same values, or one only adds to the other
            shared = len(s_new & s_old)
            if shared >= MIN_SHARED and shared >= MIN_OVERLAP * len(s_new | s_old):
                return True
    return False


def may_update(statement: Statement) -> bool:
    """Whether the rule can find ``statement`` updating anything: a sentence with a value and at least
    :data:`MIN_SHARED` subject stems (most messages have none, and are not compared at all)."""
    return any(v and len(s) >= MIN_SHARED for s, v in statement.sentences)


def has_subject(statement: Statement) -> bool:
    """Whether ``statement`` states anything about its speaker (a first-person statement sentence)."""
    return any(s for s, _ in statement.sentences)


def shares_subject(older: Statement, newer: Statement) -> bool:
    """Whether a sentence of each shares a subject stem (the LLM judge reads only such earlier statements:
    two statements with no content word in common do not state one fact)."""
    new = frozenset().union(*(s for s, _ in newer.sentences))
    return any(s & new for s, _ in older.sentences)


def any_updates(older: Sequence[Statement], newer: Statement) -> list[int]:
    """The positions in ``older`` of the statements ``newer`` updates (see :func:`updates`)."""
    return [i for i, o in enumerate(older) if updates(o, newer)]
