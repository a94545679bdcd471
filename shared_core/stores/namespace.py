"""Namespaces: tuples of strings naming one memory each (a user, an agent, a session...).

Shared by :class:`~shared_core.namespaces.MemoryStore`, the LangGraph store and the PostgreSQL store,
which keys its rows by namespace. :class:`NamespaceDeletedError` is what a store raises when another
process deleted its namespace: ``MemoryStore`` catches it, drops its stale memory of the namespace and
opens the namespace as it now is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Union

from ..types import InvalidInputError, PersistenceError

__all__ = [
    "MAX_PARTS",
    "MAX_PART_CHARS",
    "Namespace",
    "NamespaceDeletedError",
    "NamespaceLike",
    "namespace_key",
    "normalize_namespace",
]

Namespace = tuple[str, ...]
NamespaceLike = Union[str, Sequence[str]]

#: Longest namespace part in characters.
MAX_PART_CHARS = 256
#: Most parts in a namespace.
MAX_PARTS = 8
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class NamespaceDeletedError(PersistenceError):
    """The namespace a store was opened on was deleted by another process (and maybe created again
    since, as a new namespace of the same name). The memory that held it is stale: nothing was changed;
    open the namespace again (``MemoryStore`` does so by itself)."""


def normalize_namespace(ns: NamespaceLike) -> Namespace:
    """Validate a namespace and return it as a tuple of strings.

    Args:
        ns: a string (one part) or a sequence of 1 to 8 strings.

    Returns:
        The namespace tuple.

    Raises:
        InvalidInputError: not a string or sequence of strings, no parts or more than 8, an empty part,
            a part over 256 characters, or a part with a control character (NUL included) or a lone
            surrogate.
    """
    if isinstance(ns, str):
        parts: tuple[Any, ...] = (ns,)
    elif isinstance(ns, (tuple, list)):
        parts = tuple(ns)
    else:
        raise InvalidInputError(
            "A namespace is a string or a tuple of strings such as ('user', 'agent'), "
            f"got {type(ns).__name__}."
        )
    if not 1 <= len(parts) <= MAX_PARTS:
        raise InvalidInputError(f"A namespace has 1 to {MAX_PARTS} parts, got {len(parts)}.")
    for i, p in enumerate(parts):
        if not isinstance(p, str):
            raise InvalidInputError(f"Namespace part {i} is a {type(p).__name__}; every part must be a str.")
        if not p.strip():
            raise InvalidInputError(f"Namespace part {i} is empty; give every part some text.")
        if len(p) > MAX_PART_CHARS:
            raise InvalidInputError(
                f"Namespace part {i} has {len(p)} characters; the limit is {MAX_PART_CHARS}."
            )
        if _CONTROL.search(p):
            raise InvalidInputError(
                f"Namespace part {i} contains a control character (e.g. NUL); use printable text only."
            )
        try:
            p.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInputError(
                f"Namespace part {i} contains a lone surrogate; use valid text."
            ) from None
    return parts  # type: ignore[return-value]


def namespace_key(ns: NamespaceLike) -> str:
    """The canonical text of a namespace: ASCII JSON of its parts (distinct namespaces, distinct keys).

    Raises:
        InvalidInputError: see :func:`normalize_namespace`.
    """
    return json.dumps(list(normalize_namespace(ns)), ensure_ascii=True, separators=(",", ":"))
