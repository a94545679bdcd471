"""Time-to-live of the items of a :class:`~langchain_hiermem.store.HierMemStore`, as LangGraph defines it.

- ``put(..., ttl=minutes)`` (or the store's ``TTLConfig["default_ttl"]`` when ``ttl`` is not given) makes
  the item expire that many minutes after it was last written, or read with ``refresh_ttl``;
  ``ttl=None`` (the default without ``default_ttl``) keeps it forever. A put of an existing key sets
  the key's TTL anew (a put without one removes it), as LangGraph's ``SqliteStore`` does.
- ``get`` and ``search`` take ``refresh_ttl`` (default ``TTLConfig["refresh_on_read"]``, else ``True``):
  the items they return that have a TTL expire their TTL after that read.
- An expired item is not returned by ``get``, ``search`` or ``list_namespaces`` (unless
  ``TTLConfig["omit_expired"]`` is ``False``: then it is returned until it is swept, as LangGraph's SQL
  stores do), and ``sweep_ttl()`` deletes it, its text included: it is deleted from the namespace's
  memory as a ``delete`` of the key does, so no summary keeps it. ``start_ttl_sweeper()`` sweeps in a
  background thread every ``sweep_interval_minutes`` (default 5) until ``stop_ttl_sweeper()``.

References:
    LangGraph ``langgraph.store.base.TTLConfig`` and ``BaseStore.put(ttl=...)``;
    ``langgraph.store.sqlite.SqliteStore.sweep_ttl`` / ``start_ttl_sweeper`` / ``stop_ttl_sweeper``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from langgraph.store.base import PutOp, TTLConfig

from shared_core.types import InvalidInputError

__all__ = ["TTL_KEYS", "Expiry", "TTLMixin", "check_ttl", "check_ttl_config", "utc_now"]

logger = logging.getLogger(__name__)

#: The keys of LangGraph's ``TTLConfig``.
TTL_KEYS = ("refresh_on_read", "omit_expired", "default_ttl", "sweep_interval_minutes")
#: Sweep interval of :meth:`TTLMixin.start_ttl_sweeper` when neither it nor the config gives one (minutes).
DEFAULT_SWEEP_MINUTES = 5.0

#: An item's TTL in minutes and the moment it expires (UTC).
Expiry = tuple[float, datetime]


def utc_now() -> datetime:
    """The current time, timezone-aware UTC (the stores' default clock)."""
    return datetime.now(timezone.utc)


def _minutes(value: Any, what: str, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{what} is a positive number of minutes (or None), got {value!r}.")
    return float(value)


def check_ttl(ttl: Any) -> float | None:
    """A put's ``ttl`` in minutes (``None``: never expires).

    Raises:
        InvalidInputError: not ``None`` nor a positive, finite number.
    """
    return _minutes(ttl, "ttl")


def check_ttl_config(ttl: Any) -> TTLConfig | None:
    """A copy of a store's ``TTLConfig`` after checking it.

    Raises:
        InvalidInputError: not a mapping, an unknown key, ``default_ttl`` / ``sweep_interval_minutes`` not
            positive numbers (or ``None``), ``refresh_on_read`` / ``omit_expired`` not booleans.
    """
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise InvalidInputError(
            f"ttl must be a LangGraph TTLConfig dict such as {{'default_ttl': 60}}, got {type(ttl).__name__}."
        )
    unknown = sorted(set(ttl) - set(TTL_KEYS))
    if unknown:
        raise InvalidInputError(f"Unknown TTLConfig keys {unknown}; a TTLConfig has {', '.join(TTL_KEYS)}.")
    for name in ("refresh_on_read", "omit_expired"):
        if name in ttl and not isinstance(ttl[name], bool):
            raise InvalidInputError(f"ttl[{name!r}] must be True or False, got {ttl[name]!r}.")
    for name in ("default_ttl", "sweep_interval_minutes"):
        if name in ttl:
            _minutes(ttl[name], f"ttl[{name!r}]")
    return TTLConfig(**dict(ttl))  # type: ignore[typeddict-item]


class TTLMixin:
    """TTL bookkeeping of :class:`~langchain_hiermem.store.HierMemStore` (see the module docstring).

    The store keeps, per namespace space, ``expiry[key] = (ttl minutes, expires at)`` for the items that
    have a TTL; the store's clock is :attr:`_clock` (a function returning an aware UTC ``datetime``,
    replaceable in tests).
    """

    supports_ttl = True
    ttl_config: TTLConfig | None
    _lock: Any
    _spaces: dict[Any, Any]

    def _init_ttl(self, ttl: TTLConfig | None) -> None:
        self.ttl_config = check_ttl_config(ttl)
        self._clock: Callable[[], datetime] = utc_now
        self._sweeper: threading.Thread | None = None
        self._sweep_stop = threading.Event()

    # ------------------------------------------------------------------ reading
    @property
    def _omit_expired(self) -> bool:
        return bool((self.ttl_config or {}).get("omit_expired", True))

    def _expired_keys(self, space: Any, now: datetime) -> set[str]:
        """The keys of a space whose items have expired at ``now``."""
        return {key for key, (_, at) in space.expiry.items() if at <= now}

    def _hidden(self, space: Any, now: datetime) -> set[str]:
        """The keys reads leave out: the expired ones, unless ``omit_expired`` is ``False``."""
        return self._expired_keys(space, now) if self._omit_expired and space.expiry else set()

    def _refresh(self, touched: Mapping[Any, list[str]], now: datetime) -> None:
        """Extend the expiry of the read items that have a TTL (``touched``: namespace -> keys)."""
        changed: dict[Any, dict[str, Expiry]] = {}
        for ns, keys in touched.items():
            space = self._spaces.get(ns)
            if space is None:
                continue
            for key in keys:
                if key in space.expiry:
                    minutes = space.expiry[key][0]
                    changed.setdefault(ns, {})[key] = (minutes, now + timedelta(minutes=minutes))
        if not changed:
            return
        self._write_expiry(changed)
        for ns, new in changed.items():  # (the write may have reloaded the spaces: keys still there)
            space = self._spaces.get(ns)
            if space is not None:
                space.expiry.update({k: v for k, v in new.items() if k in space.items})

    def _write_expiry(self, changed: Mapping[Any, Mapping[str, Expiry]]) -> None:
        """Make refreshed expiries durable (nothing to do in RAM)."""

    @staticmethod
    def _expiry_of(op: PutOp, now: datetime) -> Expiry | None:
        """The TTL a put gives its item (``None``: no TTL)."""
        minutes = check_ttl(op.ttl)
        return None if minutes is None else (minutes, now + timedelta(minutes=minutes))

    # ------------------------------------------------------------------ sweeping
    def sweep_ttl(self) -> int:
        """Delete the expired items, their texts included (deleted from the namespaces' memories).

        Returns:
            The number of items deleted.

        Raises:
            HierMemError: a memory or the database failed; the items not yet deleted stay (expired items
                are still left out of reads) and the next sweep retries.
        """
        with self._lock:
            self._before_sweep()
            now = self._clock()
            ops = [
                PutOp(ns, key, None)
                for ns, space in list(self._spaces.items())
                for key in sorted(self._expired_keys(space, now))
                if key in space.items
            ]
            if ops:
                self._apply_puts(ops)  # type: ignore[attr-defined]
            return len(ops)

    async def asweep_ttl(self) -> int:
        """Async :meth:`sweep_ttl`, run in a worker thread."""
        import asyncio

        return await asyncio.to_thread(self.sweep_ttl)

    def _before_sweep(self) -> None:
        """Before a sweep (a durable store checks that it is open)."""

    def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Sweep expired items in a background thread, every ``sweep_interval_minutes``.

        Args:
            sweep_interval_minutes: default ``None``: the config's ``sweep_interval_minutes``, else 5.

        Returns:
            A future resolved when the sweeper stops (cancelling it stops the sweeper). A sweeper already
            running is kept; the future then stops it when cancelled.

        Raises:
            InvalidInputError: an interval that is not a positive number.
        """
        interval = _minutes(sweep_interval_minutes, "sweep_interval_minutes")
        if interval is None:
            interval = float((self.ttl_config or {}).get("sweep_interval_minutes") or DEFAULT_SWEEP_MINUTES)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.add_done_callback(lambda f: self._sweep_stop.set() if f.cancelled() else None)
        if self._sweeper is not None and self._sweeper.is_alive():
            return future
        self._sweep_stop.clear()
        stop = self._sweep_stop

        def loop() -> None:
            try:
                while not stop.wait(interval * 60):
                    try:
                        self.sweep_ttl()
                    except Exception:
                        logger.exception("A TTL sweep of the store failed; the next one retries.")
                if not future.done():
                    future.set_result(None)
            except BaseException as e:  # pragma: no cover - the loop itself does not raise
                if not future.done():
                    future.set_exception(e)

        self._sweeper = threading.Thread(target=loop, daemon=True, name="hiermem-ttl-sweeper")
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the background sweeper.

        Args:
            timeout: seconds to wait for it (default ``None``: until it stopped; a sweep under way ends
                first).

        Returns:
            ``True`` when no sweeper runs any more, ``False`` when it still ran after ``timeout``.
        """
        thread = self._sweeper
        if thread is None or not thread.is_alive():
            self._sweeper = None
            return True
        self._sweep_stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout)
        if thread.is_alive():
            return False
        self._sweeper = None
        return True
