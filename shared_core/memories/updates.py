"""The LLM-free rule that says a newer statement updates an older one (supersession).

Two messages state the same thing with a different value when a sentence of each shares its subject with
the other (at least :data:`MIN_SHARED` content words, stemmed, and :data:`MIN_OVERLAP` of the two
sentences' content words) and both count the same thing with different numbers: a *value* is a number
(digits, or a number word: ``"twelve"``, ``"fifth"``, ``"twice"``) with the content word that follows it
within :data:`UNIT_WINDOW` words (right after it for a number word: ``"one cup"``, but not the pronoun of
``"order one this week"``), its *unit*. ``"I've watched 4 MCU films in the last 3 months"`` and,
later, ``"I've watched 12 films in the last 3 months, including 5 MCU films"`` share *watch*, *film*,
*last*, *month* and count *MCU* 4 then 5: an update. The same sentence said twice (same values), a
sentence that only adds a count (``"2 cats"`` then ``"2 cats and 3 dogs"``), two counts of different
things (``"43 hours"`` then ``"12 movies"``) and two sentences about different subjects are not.

Only statements a speaker makes about themselves take part: sentences with a first-person word that do not
open as a question (``"How many ...?"``; ``"I'm thinking of two cups, do you think so?"`` states), of a
speaker other than an ``"assistant"`` role (an assistant's numbered lists and suggestions state nothing that
later changes). List numbering (``"2."`` opening a sentence) and times are not values: the day of a date (a
number beside a month name: ``"January 28th"``, ``"the 3rd of May"``, ``"the 22nd last month"``), a year
(``"in 2019 with my club"``; a number shaped like one is a count only of the word right after it: ``"2000
followers"``), a time of day (``"4:30"``, ``"7 am"``) and how long ago (``"2 months ago"``). A hyphenated
measure counts the word after it: ``"30-mile rides"`` is 30 *rides*, not miles.

:class:`~shared_core.memories.supersession.Supersession` runs the rule on a new message and its nearest
earlier messages by the memory's own similarity (the message vectors), of the same speaker and role.
Content words are the tokens of three or more characters outside bm25s' extended English stop-word list
(``STOPWORDS_EN_PLUS``), stemmed with PyStemmer's English Snowball stemmer, as the lexical index stems
them.

The rule is a heuristic: its precision on the LongMemEval dev histories is measured and reported in
docs/evaluation.md ("Knowledge that changes"). An LLM judge replaces it when the memory has an LLM.
"""

from __future__ import annotations

import re
from functools import lru_cache

from bm25s.stopwords import STOPWORDS_EN_PLUS

from ..models.extractive import split_sentences

__all__ = [
    "MIN_SHARED",
    "Statement",
    "has_subject",
    "may_state",
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
#: a number's unit is the first content word among the next this many words
UNIT_WINDOW = 3
#: roles whose messages the rule never reads
SKIPPED_ROLES = frozenset({"assistant"})

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
}
#: month names: a number beside one is a day of a date ("January 28th", "28 Jan", "the 28th of May"), not
#: a count
_MONTHS = frozenset(
    [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
    ]
)
#: number words that carry their unit
_TIMES = {"once": "1", "twice": "2", "thrice": "3"}
#: a number joined to the word after it by a hyphen ("5-day trip")
_HYPHENATED = re.compile(r"-[^\W\d_]")
#: words after a number that make it a time of day
_CLOCK = frozenset(["am", "pm"])
#: words before "month" that make an ordinal a day ("the 22nd last month")
_RELATIVE = frozenset(["last", "this", "next", "the"])
#: a number shaped like a year ("2019"): a count only of the word right after it ("2000 followers")
_YEAR = re.compile(r"^(?:19|20)\d\d$")
_TOKEN = re.compile(r"(\d+(?:[.,:/]\d+)*)|([^\W\d_][\w'’]*)", re.UNICODE)
_LIST_ITEM = re.compile(r"^\s*\(?\d+[.)]\s")
_ORDINAL_SUFFIX = frozenset(["st", "nd", "rd", "th", "s"])
#: the first words of a question
_ASKS = frozenset(
    [
        "what",
        "how",
        "why",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "can",
        "could",
        "would",
        "should",
        "do",
        "does",
        "did",
        "is",
        "are",
        "was",
        "were",
        "will",
        "shall",
        "may",
        "might",
        "have",
        "has",
        "am",
    ]
)
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
    values (``(unit stem, number)`` pairs)."""

    __slots__ = ("sentences",)

    def __init__(self, sentences: list[tuple[frozenset[str], frozenset[tuple[str, str]]]]) -> None:
        self.sentences = sentences


_NOTHING: tuple[frozenset[str], frozenset[tuple[str, str]]] = (frozenset(), frozenset())


def _sentence(sentence: str) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """``(subject stems, values)`` of one sentence; both empty for a question or a sentence that does
    not speak of the speaker (no first-person word): those state nothing about the speaker to update."""
    tokens: list[tuple[str, bool]] = []  # (lower-cased token, is a number)
    measures: set[int] = set()  # numbers joined to their word by a hyphen: "5-day", "30-mile"
    text = _LIST_ITEM.sub("", sentence, count=1)
    for m in _TOKEN.finditer(text):
        num, word = m.group(1), m.group(2)
        if num and _HYPHENATED.match(text, m.end()):
            measures.add(len(tokens))
        tokens.append((num.replace(",", ""), True) if num else (word.lower().replace("’", "'"), False))
    if not tokens or tokens[0][0] in _ASKS:
        return _NOTHING  # a question ("How many ...?"; "..., do you think so?" still states its first part)
    if not any(not n and (t in _FIRST_PERSON or t.startswith("i'")) for t, n in tokens):
        return _NOTHING
    content = [t for t, n in tokens if not n and len(t) > 2 and t not in _STOP and "'" not in t]
    stems = dict(zip(content, _stem(content)))
    values: set[tuple[str, str]] = set()
    for i, (t, n) in enumerate(tokens):
        if not n and t in _TIMES:
            values.add(("time", _TIMES[t]))
            continue
        if not n and t not in _NUMBER_WORDS:
            continue
        number = t if n else _NUMBER_WORDS[t]
        if _is_day(tokens, i) or _is_time(tokens, i):
            continue
        year = n and _YEAR.match(t) is not None  # "2019": a year unless a unit follows ("2000 followers")
        # a hyphenated measure qualifies the word after it: "30-mile rides" counts rides, not miles
        at = i + 1 if i in measures else i
        unit = _unit_after(tokens, at, stems, UNIT_WINDOW if n and not year else 1)
        if unit is not None:
            values.add((unit, number))
    return frozenset(stems.values()), frozenset(values)


def _unit_after(tokens: list[tuple[str, bool]], i: int, stems: dict[str, str], window: int) -> str | None:
    """The unit stem of the number at ``tokens[i]``: the first content word among the next ``window``
    words (``None``: none). A number word or a year counts only what directly follows it (``window`` 1:
    "one cup", not "order one this week"; "2000 followers", not "in 2019 with my club")."""
    seen = 0
    for u, un in tokens[i + 1 :]:
        if un or u in _ORDINAL_SUFFIX or u in _NUMBER_WORDS:
            continue  # a range ("3-4 days"), an ordinal's suffix ("5th")
        if u in stems:
            return stems[u]
        seen += 1
        if seen >= window:
            break
    return None


def _is_day(tokens: list[tuple[str, bool]], i: int) -> bool:
    """Whether the number at ``tokens[i]`` is the day of a date: a month name right before it, or right
    after it (past an ordinal's suffix and an "of"), or "last / this / next month" after it."""
    if i and tokens[i - 1][0] in _MONTHS:
        return True
    words = [t for t, _ in tokens[i + 1 : i + 5]]
    if words[:1] and words[0] in _ORDINAL_SUFFIX:
        words = words[1:]
    if words[:1] == ["of"]:
        words = words[1:]
    return bool(words) and (words[0] in _MONTHS or (words[0] in _RELATIVE and words[1:2] == ["month"]))


def _is_time(tokens: list[tuple[str, bool]], i: int) -> bool:
    """Whether the number at ``tokens[i]`` names a time rather than a count: a time of day ("4:30",
    "7 am") or how long ago something was ("2 months ago", "around 6 weeks ago")."""
    t, n = tokens[i]
    if n and ":" in t:
        return True
    after = [u for u, _ in tokens[i + 1 : i + 4]]  # "7 am"; "2 months ago", "6 more weeks ago"
    return (bool(after) and after[0] in _CLOCK) or "ago" in after


_SPEAKS_OF_SELF = re.compile(r"\b(?:i|me|my|mine|we|us|our|ours)\b|\bi['’]", re.IGNORECASE)
_COUNTS = re.compile(
    r"\d|\b(?:" + "|".join(sorted({*_NUMBER_WORDS, *_TIMES}, key=len, reverse=True)) + r")\b", re.IGNORECASE
)


def may_state(text: str, counted: bool) -> bool:
    """A cheap first look: whether ``text`` may hold a statement the rule reads (a first-person word and,
    with ``counted``, a digit or a number word). ``False`` means :func:`statement_of` would find none."""
    return _SPEAKS_OF_SELF.search(text) is not None and (not counted or _COUNTS.search(text) is not None)


def statement_of(text: str) -> Statement:
    """The :class:`Statement` of a message text (its first :data:`MAX_SENTENCES` sentences)."""
    return Statement([_sentence(s) for s in split_sentences(text)[:MAX_SENTENCES]])


def _counts(values: frozenset[tuple[str, str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for unit, number in values:
        out.setdefault(unit, set()).add(number)
    return out


def updates(older: Statement, newer: Statement) -> bool:
    """Whether ``newer`` restates something ``older`` said with a different value (see the module).

    A pair of sentences counts when they share at least :data:`MIN_SHARED` subject stems and
    :data:`MIN_OVERLAP` of their subjects, and count one unit with different numbers, each holding a
    number of it the other does not (``"$5 coupon"`` then ``"$1 and $5 coupons"`` only adds one).
    """
    for s_new, v_new in newer.sentences:
        if not v_new or len(s_new) < MIN_SHARED:
            continue
        c_new = _counts(v_new)
        for s_old, v_old in older.sentences:
            if not v_old or v_old == v_new:
                continue
            shared = len(s_new & s_old)
            if shared < MIN_SHARED or shared < MIN_OVERLAP * len(s_new | s_old):
                continue
            c_old = _counts(v_old)
            # one unit counted anew: a number of it replaced (not only another number added)
            if any(c_old[u] - n and n - c_old[u] for u, n in c_new.items() if u in c_old):
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
