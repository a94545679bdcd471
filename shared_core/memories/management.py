"""Managing what a memory holds: unique source ids, listing, closing.

A mixin of :class:`~shared_core.memories.base.HierarchicalMemory` (one implementation for the four
memories):

- a source id (``Message.id``) names one stored message: ``add`` refuses an id the memory holds, or the
  same id twice in one call, with :class:`~shared_core.types.DuplicateIdError`; ``add(...,
  upsert=True)`` deletes the stored message of each such id and adds the new one in the same transaction
  (as LangGraph's ``BaseStore.put`` replaces an item);
- :meth:`Management.get_all` lists the stored messages in insertion order;
- :meth:`Management.close` releases the durable store (file lock, connections); a closed memory raises
  :class:`~shared_core.types.MemoryClosedError`; ``with SegTreeMem.open(path) as mem:`` closes it at the end
  of the block.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..search.filters import MessageFilter, message_filter
from ..tree.nodes import NodeStore
from ..types import DuplicateIdError, InvalidInputError, MemoryClosedError, Message, Usage

Self = TypeVar("Self", bound="Management")

__all__ = ["Management", "check_listing"]


def _count(value: Any, name: str, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidInputError(
            f"{name} must be a non-negative integer{' or None' if allow_none else ''}, got {value!r}."
        )
    return int(value)


def check_listing(where: Any, limit: Any, offset: Any) -> tuple[MessageFilter | None, int | None, int]:
    """Validate the arguments of :meth:`Management.get_all`: the filter (``None`` = all), ``limit``
    (``None`` = all) and ``offset``.

    Raises:
        InvalidInputError: a bad ``where``, or a ``limit`` / ``offset`` that is not a non-negative integer.
    """
    lim = _count(limit, "limit", allow_none=True)
    off = _count(offset, "offset", allow_none=False)
    assert off is not None
    return message_filter(None, where), lim, off


class Management:
    """Mixin: unique source ids, :meth:`get_all`, :meth:`close` and the context manager (see the module)."""

    # set by HierarchicalMemory.__init__
    _store: NodeStore
    _lock: threading.RLock
    _closed: bool = False

    if TYPE_CHECKING:

        def _sync_store(self) -> None: ...
        def close_store(self) -> None: ...
        def _delete_leaves(self, leaves: Sequence[int], usage: Usage) -> None: ...

    # ------------------------------------------------------------------ unique ids
    def _make_room(self, messages: Sequence[Message], upsert: bool, usage: Usage) -> None:
        """Inside an add's transaction, before anything is inserted: refuse duplicate ids, or (``upsert``)
        delete the stored messages the new ones replace.

        Raises:
            DuplicateIdError: an id twice in ``messages``, or (without ``upsert``) an id already stored.
        """
        seen: set[str] = set()
        twice: list[str] = []
        for m in messages:
            if m.id is not None:
                if m.id in seen and m.id not in twice:
                    twice.append(m.id)
                seen.add(m.id)
        if twice:
            raise DuplicateIdError(
                f"The id(s) {', '.join(map(repr, twice))} appear more than once in this add; a source id "
                "names one message. Nothing was added.",
                ids=tuple(twice),
            )
        stored = [m.id for m in messages if m.id is not None and m.id in self._store.by_source]
        if not stored:
            return
        if not upsert:
            raise DuplicateIdError(
                f"The memory already holds a message with id(s) {', '.join(map(repr, stored))}; nothing "
                "was added. Pass upsert=True to replace them, or delete them first.",
                ids=tuple(stored),
            )
        old = [lid for sid in stored for lid in self._store.by_source[sid]]
        self._delete_leaves(old, usage)

    # ------------------------------------------------------------------ listing
    def get_all(self, where: Any = None, limit: int | None = None, offset: int = 0) -> list[Message]:
        """The stored messages, oldest first (insertion order), after catching up with a shared store.

        Args:
            where: optional condition on ``Message.metadata`` (the language of ``retrieve(where=...)``,
                see :mod:`shared_core.search.filters`) or a callable ``Message -> bool``; default all.
            limit: at most this many messages (a non-negative int), default ``None`` = all.
            offset: skip this many matching messages first (a non-negative int), default 0.

        Returns:
            Copies of the stored :class:`~shared_core.types.Message` objects (text, role, speaker,
            timestamp, id, metadata as added; changing them changes nothing stored).

        Raises:
            InvalidInputError: a bad ``where`` (unknown operator, wrong type), ``limit`` or ``offset``
                (negative, not an integer), naming the value.
            MemoryClosedError: the memory was closed.
            PersistenceError: a shared store cannot be read (the memory is unchanged).
        """
        flt, lim, off = check_listing(where, limit, offset)
        with self._lock:
            self._sync_store()
            st = self._store
            stored = [st.nodes[lid].message for lid in st.leaves()]
        out: list[Message] = []
        skipped = 0
        for m in stored:
            if lim is not None and len(out) >= lim:
                break
            if m is None or (flt is not None and not flt.matches(m)):
                continue
            if skipped < off:
                skipped += 1
                continue
            out.append(Message.from_dict(m.to_dict()))
        return out

    # ------------------------------------------------------------------ closing
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise MemoryClosedError(
                f"This {type(self).__name__} was closed; open it again (e.g. with .open(path))."
            )

    def close(self) -> None:
        """Release the durable store (SQLite file lock, PostgreSQL connections) and close the memory.

        Idempotent. Afterwards every operation that reads or changes the memory (``add``, ``delete``,
        ``retrieve``, ``get_all``, ``len()``, ``stats()``, ``clear``, ``refresh``) raises
        :class:`~shared_core.types.MemoryClosedError`; the store can be opened again, in this process or
        another. Every acknowledged change is already committed, so nothing is lost.
        """
        with self._lock:
            self._closed = True
            self.close_store()

    def __enter__(self: Self) -> Self:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
