"""Checks of what a memory is given: every message of an ``add`` before anything changes, and query
texts."""

from __future__ import annotations

from ..types import InvalidInputError, Message, check_message_fields

__all__ = ["check_message", "check_unicode"]


def check_unicode(text: str, what: str) -> None:
    """Raise :class:`~shared_core.types.InvalidInputError` naming ``what`` when ``text`` holds a lone
    surrogate (not valid Unicode, so neither storable nor embeddable)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInputError(
            f"The {what} contains a lone surrogate code point ({text[e.start]!r}), which is not valid "
            "Unicode text; decode the input with errors='replace' or remove that character."
        ) from None


def check_message(m: Message, max_chars: int, i: int = 0) -> None:
    """Check that a message can be stored and saved.

    Args:
        m: the message.
        max_chars: longest accepted text in characters.
        i: its position in the call (for the error message).

    Raises:
        InvalidInputError: text longer than ``max_chars``; a stored field over its limit (naming the
            field and the limit: :func:`~shared_core.types.check_message_fields`); a lone surrogate in
            any field; metadata that is not JSON-serialisable.
    """
    if len(m.text) > max_chars:
        raise InvalidInputError(
            f"Item {i}: the message text has {len(m.text):,} characters; the limit is {max_chars:,} "
            "(max_message_chars). Split long documents into smaller messages (e.g. paragraphs) before "
            "adding them, or raise max_message_chars on the memory."
        )
    payload = check_message_fields(m, i)
    check_unicode(payload, f"message (item {i})")
