"""Strict parsing of LLM decisions: one corrective retry, then a safe fallback.

LLM outputs that drive tree construction or retrieval (a merge label, an action, a JSON record) are
parsed strictly: a parser raises ``ValueError`` on anything it cannot use, :func:`complete_parsed`
asks again with the parse error appended to the prompt, and after ``retries`` failed retries it returns
the caller's ``fallback`` with ``ok=False``, so a memory never stores a guessed decision silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..types import InvalidInputError, Usage
from .base import LLM

__all__ = [
    "ParsedResult",
    "acomplete_parsed",
    "complete_parsed",
    "corrective_prompt",
    "parse_json_object",
    "parse_label",
]

T = TypeVar("T")

_MAX_ECHO_CHARS = 500


@dataclass
class ParsedResult(Generic[T]):
    """The outcome of :func:`complete_parsed`.

    Attributes:
        value: the parsed value, or the caller's ``fallback`` when ``ok`` is ``False``.
        usage: usage summed over every attempt (``llm_calls`` = number of attempts).
        ok: whether some attempt parsed.
        raw: the raw answer of every attempt, in order.
    """

    value: T
    usage: Usage = field(default_factory=Usage)
    ok: bool = True
    raw: list[str] = field(default_factory=list)


def corrective_prompt(prompt: str, answer: str, error: Exception | str) -> str:
    """The prompt of a retry: the original prompt, the unusable answer and why it was unusable.

    Args:
        prompt: the original prompt.
        answer: the previous raw answer (echoed, cut to 500 characters).
        error: the parser's error (its message should say what format is expected).

    Returns:
        The new prompt (a string).

    References:
        DESIGN "Models": strict parsing with one retry and a safe fallback.
    """
    shown = answer.strip()
    if len(shown) > _MAX_ECHO_CHARS:
        shown = shown[:_MAX_ECHO_CHARS] + " ..."
    return (
        f"{prompt}\n\n"
        f"Your previous answer could not be parsed.\nPrevious answer: {shown or '(empty)'}\n"
        f"Problem: {error}\n"
        "Answer again with exactly the requested format and nothing else."
    )


def _check_args(prompt: str, parse: Callable[[str], Any], retries: int) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("prompt must be a non-empty string.")
    if not callable(parse):
        raise InvalidInputError("parse must be a callable taking the answer text.")
    if not (isinstance(retries, int) and retries >= 0):
        raise InvalidInputError(f"retries must be an int >= 0, got {retries!r}.")


def complete_parsed(
    llm: LLM,
    prompt: str,
    parse: Callable[[str], T],
    *,
    system: str | None = None,
    max_tokens: int | None = None,
    retries: int = 1,
    fallback: T,
) -> ParsedResult[T]:
    """Ask ``llm`` and parse the answer strictly, retrying with a corrective suffix.

    Args:
        llm: any :class:`~shared_core.models.base.LLM`.
        prompt: the user prompt.
        parse: strict parser ``parse(text) -> value`` that raises ``ValueError`` on unusable text
            (e.g. ``lambda t: parse_label(t, ["MERGE_1", "SPLIT"])``).
        system: optional system prompt, sent with every attempt.
        max_tokens: completion cap per attempt, default ``None``.
        retries: extra attempts after the first unparseable answer, default 1 (so at most 2 calls).
        fallback: the value returned (with ``ok=False``) when no attempt parses.

    Returns:
        :class:`ParsedResult` with the value, the summed usage, ``ok`` and the raw answers.

    Raises:
        InvalidInputError: empty prompt, non-callable ``parse`` or negative ``retries``.
        ModelError: the provider failed (not a parse failure; it propagates unchanged).

    References:
        DESIGN "Models": LLM decisions are parsed strictly with one retry and a safe fallback
        (SegTreeMem App. G batch labels; HAT agent actions; xMemory App. C prompts).
    """
    _check_args(prompt, parse, retries)
    usage = Usage()
    raw: list[str] = []
    current = prompt
    for _ in range(retries + 1):
        c = llm.complete(current, system=system, max_tokens=max_tokens)
        usage += c.usage
        raw.append(c.text)
        try:
            return ParsedResult(parse(c.text), usage, True, raw)
        except ValueError as e:
            current = corrective_prompt(prompt, c.text, e)
    return ParsedResult(fallback, usage, False, raw)


async def acomplete_parsed(
    llm: LLM,
    prompt: str,
    parse: Callable[[str], T],
    *,
    system: str | None = None,
    max_tokens: int | None = None,
    retries: int = 1,
    fallback: T,
) -> ParsedResult[T]:
    """Async :func:`complete_parsed` (uses ``llm.acomplete``). Args / Returns / Raises: the same."""
    _check_args(prompt, parse, retries)
    usage = Usage()
    raw: list[str] = []
    current = prompt
    for _ in range(retries + 1):
        c = await llm.acomplete(current, system=system, max_tokens=max_tokens)
        usage += c.usage
        raw.append(c.text)
        try:
            return ParsedResult(parse(c.text), usage, True, raw)
        except ValueError as e:
            current = corrective_prompt(prompt, c.text, e)
    return ParsedResult(fallback, usage, False, raw)


# --------------------------------------------------------------------------- parsers
def _label_pattern(label: str) -> re.Pattern[str]:
    # Whole word: no letter, digit or underscore may touch the label on either side.
    return re.compile(r"(?<![0-9A-Za-z_])" + re.escape(label) + r"(?![0-9A-Za-z_])", re.IGNORECASE)


def parse_label(text: str, labels: Sequence[str]) -> str:
    """Extract exactly one label from an LLM answer.

    Matching is case-insensitive and whole-word (``MERGE_1`` does not match inside ``MERGE_12`` or
    ``XMERGE_1``; ``sufficient`` does not match inside ``insufficient``). A label found only inside a
    longer matched label (``SUFFICIENT`` inside ``NOT SUFFICIENT``) does not count. The same label
    repeated is fine; two different labels are ambiguous.

    Args:
        text: the answer.
        labels: the valid labels (non-empty strings, distinct ignoring case).

    Returns:
        The matched label, spelled as in ``labels``.

    Raises:
        InvalidInputError: ``labels`` is empty, has a non-string/empty entry or case-insensitive duplicates.
        ValueError: no valid label, or more than one distinct label, in ``text``.

    References:
        SegTreeMem App. G (batch compatibility: exactly one of MERGE_1..MERGE_m or SPLIT);
        HAT §3.2 (agent actions).
    """
    labels = list(labels)
    if not labels:
        raise InvalidInputError("parse_label needs at least one label.")
    if any(not isinstance(lb, str) or not lb.strip() for lb in labels):
        raise InvalidInputError("Every label must be a non-empty string.")
    if len({lb.strip().lower() for lb in labels}) != len(labels):
        raise InvalidInputError(f"Labels must be distinct ignoring case: {labels}.")
    if not isinstance(text, str):
        raise ValueError(f"Expected answer text, got {type(text).__name__}.")
    expected = ", ".join(labels)
    spans: list[tuple[int, int, str]] = []
    for lb in labels:
        spans += [(m.start(), m.end(), lb) for m in _label_pattern(lb.strip()).finditer(text)]
    # Drop matches that lie inside a longer match of another label.
    kept = [
        (s, e, lb)
        for s, e, lb in spans
        if not any(s2 <= s and e <= e2 and (e2 - s2) > (e - s) for s2, e2, _ in spans)
    ]
    found = sorted({lb for _, _, lb in kept}, key=labels.index)
    if not found:
        raise ValueError(f"No valid label in the answer; answer with exactly one of: {expected}.")
    if len(found) > 1:
        raise ValueError(
            f"The answer names several labels ({', '.join(found)}); answer with exactly one of: {expected}."
        )
    return found[0]


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def _reject_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"non-standard constant {name}", name, 0)


def parse_json_object(text: str) -> dict[str, Any]:
    """Parse a JSON object from an LLM answer: the whole answer, or the one fenced code block in it.

    Accepted: a bare object (surrounding whitespace allowed) or exactly one fenced block
    (```` ```json ... ``` ```` or ```` ``` ... ``` ````) holding an object, with any prose around the fence.

    Args:
        text: the answer.

    Returns:
        The object as a ``dict``.

    Raises:
        ValueError: no object, invalid JSON (``NaN`` / ``Infinity`` included), a JSON value that is
            not an object, or several fenced blocks.

    References:
        RFC 8259 (JSON); structured outputs of the extraction prompts (e.g. xMemory App. C).
    """
    if not isinstance(text, str):
        raise ValueError(f"Expected answer text, got {type(text).__name__}.")
    stripped = text.strip()
    blocks = _FENCE.findall(stripped)
    if len(blocks) > 1:
        raise ValueError("The answer has several code blocks; answer with exactly one JSON object.")
    body = blocks[0].strip() if blocks else stripped
    if not body:
        raise ValueError("The answer is empty; answer with one JSON object.")
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"The answer is not valid JSON ({e.msg} at char {e.pos}); answer with one JSON object."
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"Expected a JSON object {{...}}, got a JSON {type(value).__name__}.")
    return value
