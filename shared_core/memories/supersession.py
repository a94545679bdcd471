"""Knowledge that changes: a newer message that restates an earlier one with another value supersedes it.

A mixin of :class:`~shared_core.memories.base.HierarchicalMemory` (one implementation for the four
memories):

- **Marking.** Each ``add`` looks at every new message's :attr:`Supersession.supersession_neighbours`
  nearest earlier messages by the memory's own similarity (cosine of the message vectors), of the same
  speaker and role, and marks those it updates (an ``"assistant"`` message is never read: it states
  nothing about its speaker that later changes): by the LLM-free rule of
  :mod:`shared_core.memories.updates` (``supersession="rule"``), or by one LLM call per new message that
  has such neighbours sharing a content word with it (``"llm"``: the judge reads up to
  :data:`JUDGE_CANDIDATES` of them and answers with the ids it supersedes; an answer that does not parse,
  or a model error, falls back to the rule). ``"auto"`` (default) is the judge when the memory
  has an LLM, else the rule; ``"off"`` marks nothing. The mark is a list of earlier leaf ids on the newer
  leaf (``Node.data[SUPERSEDES]``), so it is saved, stored (SQLite, PostgreSQL) and caught up with the
  leaf itself, and deleting the newer message makes the older current again. Nothing is deleted.
- **Reading.** A leaf is superseded *as of* ``t`` when a live newer leaf names it and that leaf was said
  at or before ``t`` (a message without a readable timestamp counts as said at its insertion, so it
  supersedes as of any ``t``). :meth:`Supersession._current_first` moves, among a retrieval's
  candidates, the current successor of a superseded statement up to the place of the statement it
  replaces (when the retrieval found the successor at all), so the newer statement ranks first and the
  older stays, right after it; :meth:`Supersession._with_marks` fills :attr:`Hit.superseded_by`,
  :attr:`Hit.valid_from` and :attr:`Hit.valid_to`. :meth:`Supersession.history` returns a statement's
  chain, oldest first.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from ..prompts import fence
from ..prompts.updates import JUDGE_ITEM, JUDGE_SYSTEM, JUDGE_USER
from ..search.filters import MessageFilter
from ..tree.nodes import SUPERSEDES
from ..types import (
    Hit,
    InvalidInputError,
    Message,
    ModelError,
    NodeNotFoundError,
    Usage,
    parse_timestamp,
)
from .updates import (
    SKIPPED_ROLES,
    Statement,
    has_subject,
    may_state,
    may_update,
    shares_subject,
    statement_of,
    updates,
)

if TYPE_CHECKING:
    from ..models.base import LLM
    from ..search.ann import NeighbourSearch
    from ..search.index import NodeIndex
    from ..tree.nodes import NodeStore
    from ..tree.structure import NodeArrays

__all__ = ["SUPERSESSION_MODES", "Supersession"]

#: the values of :attr:`Supersession.supersession`
SUPERSESSION_MODES = ("auto", "rule", "llm", "off")
#: most earlier messages one LLM judgement reads
JUDGE_CANDIDATES = 5


def _ids_in(text: str, allowed: set[int]) -> list[int] | None:
    """The ids of a judge's answer: a JSON list of allowed ints; ``None`` when it does not parse."""
    m = re.search(r"\[[^\[\]]*\]", text)
    if m is None:
        return None
    try:
        got = json.loads(m.group(0))
    except ValueError:
        return None
    if not isinstance(got, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in got):
        return None
    if any(i not in allowed for i in got):
        return None
    return sorted(set(got))


class Supersession:
    """Mixin: supersession marks, the current-first order, hit marks and :meth:`history` (see the module)."""

    # set by HierarchicalMemory.__init__
    llm: LLM | None
    _store: NodeStore
    _lock: threading.RLock
    _index: NodeIndex | None
    _arrays: NodeArrays
    _version: int

    if TYPE_CHECKING:

        def _sync_store(self) -> None: ...
        def _vectors(self, nids: Sequence[int]) -> np.ndarray: ...
        def _node_search(self) -> NeighbourSearch | None: ...

    #: how new messages are checked against earlier ones: ``"auto"`` (default: the LLM judge when the
    #: memory has an LLM, else the rule), ``"rule"``, ``"llm"`` or ``"off"``
    supersession: str = "auto"
    #: the nearest earlier messages (same speaker and role) a new message is checked against
    supersession_neighbours: int = 10
    #: judgements whose answer did not parse or whose model call failed (the rule decided them)
    judge_fallbacks: int = 0
    #: ``(version, {older leaf: [newer leaves, ascending]})`` of :meth:`_newer_map`
    _newer_cache: tuple[int, int, dict[int, list[int]]] | None = None

    # ------------------------------------------------------------------ marking (inside an add)
    def _supersession_mode(self) -> str:
        mode = self.supersession
        if mode not in SUPERSESSION_MODES:
            raise InvalidInputError(
                f"supersession must be one of {', '.join(SUPERSESSION_MODES)}, got {mode!r}."
            )
        if mode == "auto":
            return "llm" if self.llm is not None else "rule"
        if mode == "llm" and self.llm is None:
            return "rule"
        return mode

    def _earlier_neighbours(self, new: Sequence[int]) -> list[list[int]]:
        """For each new leaf, up to :attr:`supersession_neighbours` earlier leaves of the same speaker and
        role, nearest by cosine first (ties by node id): committed leaves from the node search (the IVF
        index past ``exact_search_max``, else exact), leaves of this add from their vectors."""
        st = self._store
        n = int(self.supersession_neighbours)
        if n <= 0 or not new:
            return [[] for _ in new]
        Q = self._vectors(list(new))
        fetch = 4 * n
        found: list[list[int]] = [[] for _ in new]
        idx = self._index
        if idx is not None and len(idx):
            ns = self._node_search()
            if ns is not None:
                rows = ns.search(Q, fetch)
                found = [[int(i) for i in r if i >= 0] for r in rows]
            else:
                found = [[int(i) for i in idx.search(q, fetch)[0]] for q in Q]
        adding = set(new)
        out: list[list[int]] = []
        for j, lid in enumerate(new):
            me = st.nodes[lid]
            key = (me.message.speaker, me.message.role) if me.message is not None else (None, None)
            cands = [c for c in found[j] if c not in adding]
            cands += list(new[:j])
            ok = []
            for c in dict.fromkeys(cands):
                node = st.nodes.get(c)
                if node is None or not node.is_leaf or node.message is None:
                    continue
                if (node.message.speaker, node.message.role) != key or node.span[0] >= me.span[0]:
                    continue
                ok.append(c)
            if not ok:
                out.append([])
                continue
            V = self._vectors(ok)
            sims = V @ Q[j]
            order = np.lexsort((np.asarray(ok), -sims))[:n]
            out.append([ok[i] for i in order])
        return out

    def _mark_supersession(self, new: Sequence[int], usage: Usage) -> None:
        """Inside an add, after the new leaves have vectors: mark the earlier leaves each new one
        supersedes (``Node.data[SUPERSEDES]``; see the module)."""
        mode = self._supersession_mode()
        if mode == "off" or not new:
            return
        st = self._store
        counted = mode == "rule"
        new = [
            lid
            for lid in new
            if st.nodes[lid].message.role not in SKIPPED_ROLES  # type: ignore[union-attr]
            and may_state(st.nodes[lid].message.text, counted)  # type: ignore[union-attr]
        ]
        mine = {lid: statement_of(st.nodes[lid].message.text) for lid in new}  # type: ignore[union-attr]
        asks = may_update if counted else has_subject  # the judge also reads statements without numbers
        want = [lid for lid in new if asks(mine[lid])]
        seen: dict[int, Statement] = dict(mine)  # this call's statements (kept nowhere after it)

        def statement(nid: int) -> Statement:
            got = seen.get(nid)
            if got is None:
                got = seen[nid] = statement_of(st.nodes[nid].message.text)  # type: ignore[union-attr]
            return got

        for lid, near in zip(want, self._earlier_neighbours(want)):
            if not near:
                continue
            chosen: list[int] | None = None
            if mode == "llm":
                judged = [c for c in near if shares_subject(statement(c), mine[lid])][:JUDGE_CANDIDATES]
                text = st.nodes[lid].message.text  # type: ignore[union-attr]
                chosen = self._judge(text, judged, usage) if judged else []
            if chosen is None:
                chosen = [c for c in near if updates(statement(c), mine[lid])]
            if chosen:
                st.set_data(lid, SUPERSEDES, sorted(chosen))

    def _judge(self, text: str, near: list[int], usage: Usage) -> list[int] | None:
        """The LLM judge's answer for one new message: the ids among ``near`` it supersedes, or ``None``
        (the answer did not parse, or the model failed after its retries) so the rule decides."""
        llm = self.llm
        assert llm is not None
        st = self._store
        earlier = "\n".join(JUDGE_ITEM.format(id=c, text=fence(st.nodes[c].text)) for c in near)
        prompt = JUDGE_USER.format(earlier=earlier, new=fence(text))
        try:
            c = llm.complete(prompt, system=JUDGE_SYSTEM, max_tokens=64)
        except ModelError:
            self.judge_fallbacks += 1
            return None
        usage += c.usage
        got = _ids_in(c.text, set(near))
        if got is None:
            self.judge_fallbacks += 1
        return got

    # ------------------------------------------------------------------ reading
    def _newer_map(self) -> dict[int, list[int]]:
        """``{older leaf: [live newer leaves that name it, ascending]}`` (cached per committed version)."""
        st = self._store
        c = self._newer_cache
        if c is not None and c[0] == self._version and c[1] == id(st):
            return c[2]
        arrays = self._arrays
        arrays.sync(st)
        out: dict[int, list[int]] = {}
        for nid in np.flatnonzero(arrays.supersedes).tolist():
            node = st.nodes.get(nid)
            if node is None:
                continue
            for old in node.data.get(SUPERSEDES) or ():
                if old in st.nodes:
                    out.setdefault(int(old), []).append(nid)
        for v in out.values():
            v.sort()
        self._newer_cache = (self._version, id(st), out)
        return out

    def _said_by(self, nid: int, as_of: datetime | None) -> bool:
        """Whether leaf ``nid`` was said at or before ``as_of`` (always without ``as_of`` or a timestamp)."""
        if as_of is None:
            return True
        return MessageFilter(as_of=as_of).matches(self._store.nodes[nid].message)

    def _newer_of(self, nid: int, as_of: datetime | None) -> list[int]:
        """The newer leaves that supersede leaf ``nid`` as of ``as_of`` (ascending)."""
        return [n for n in self._newer_map().get(nid, ()) if self._said_by(n, as_of)]

    def _superseded_among(
        self, cands: list[tuple[int, float, dict[str, Any]]], as_of: datetime | None
    ) -> bool:
        """Whether a candidate is superseded as of ``as_of`` (its successors are then looked for deeper)."""
        newer = self._newer_map()
        return bool(newer) and any(c[0] in newer and self._newer_of(c[0], as_of) for c in cands)

    def _current_first(
        self,
        cands: list[tuple[int, float, dict[str, Any]]],
        as_of: datetime | None,
        pool: list[tuple[int, float, dict[str, Any]]] | None = None,
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Candidates with each superseded statement's successors (those among the candidates or the
        deeper ``pool`` of the same retrieval, the chain's later statements transitively) moved up to just
        before it, newest first; everything else keeps its order. The policy's own hits are thus kept
        (a policy whose top-k depends on k, MemTree's ``traversal`` or HAT's ``greedy``, is asked for k),
        and a successor it ranked lower or not at all among its k joins them."""
        newer = self._newer_map()
        if not newer:
            return cands
        present = {c[0]: c for c in pool or ()}
        present.update({c[0]: c for c in cands})
        out: list[tuple[int, float, dict[str, Any]]] = []
        placed: set[int] = set()
        for c in cands:
            if c[0] in placed:
                continue
            succ: list[int] = []
            stack = list(self._newer_of(c[0], as_of))
            while stack:  # the chain's later statements, transitively
                s = stack.pop()
                if s in succ:
                    continue
                succ.append(s)
                stack.extend(self._newer_of(s, as_of))
            for s in sorted(succ, key=lambda i: -self._store.nodes[i].span[0]):
                if s in present and s not in placed:
                    out.append(present[s])
                    placed.add(s)
            out.append(c)
            placed.add(c[0])
        return out

    def _with_marks(self, hits: list[Hit], as_of: datetime | None) -> list[Hit]:
        """The hits with :attr:`Hit.superseded_by` and :attr:`Hit.valid_to` (``valid_from`` comes with
        the hit: :meth:`~shared_core.search.ranking.Ranking.hit`)."""
        newer = self._newer_map()
        if not newer:
            return hits
        st = self._store
        out = []
        for h in hits:
            by = self._newer_of(h.node_id, as_of) if h.node_id in newer else []
            if not by:
                out.append(h)
                continue
            stamps = [st.nodes[n].message.timestamp for n in by]  # type: ignore[union-attr]
            dated = min(((t, s) for s in stamps if (t := parse_timestamp(s)) is not None), default=None)
            names = tuple(_name(st, n) for n in by)
            out.append(replace(h, superseded_by=names, valid_to=dated[1] if dated else None))
        return out

    def history(self, key: int | str) -> list[Message]:
        """The chain of statements a message belongs to, oldest first.

        The chain is every message linked to it by supersession, either way and transitively (the
        statements it replaced and those that replaced it), in insertion order; a message nothing
        supersedes and that supersedes nothing is a chain of one.

        Args:
            key: a source id (``Message.id``, str) or a leaf's node id (int), as :meth:`delete` takes.

        Returns:
            Copies of the stored :class:`~shared_core.types.Message` objects.

        Raises:
            NodeNotFoundError: no such source id or leaf (the error :meth:`delete` raises).
            InvalidInputError: a key that is neither (a bool, a float).
        """
        if isinstance(key, bool) or not isinstance(key, (str, int, np.integer)):
            raise InvalidInputError("history takes a node id (int) or a source id (str).")
        with self._lock:
            self._sync_store()
            st = self._store
            if isinstance(key, str):
                start = list(st.by_source.get(key, ()))
            else:
                start = [int(key)] if int(key) in st.nodes and st.nodes[int(key)].is_leaf else []
            if not start:
                raise NodeNotFoundError(f"No node or source id {key!r} in this memory.")
            newer = self._newer_map()
            older: dict[int, list[int]] = {}
            for o, ns in newer.items():
                for n in ns:
                    older.setdefault(n, []).append(o)
            seen: set[int] = set()
            stack = start
            while stack:
                nid = stack.pop()
                if nid in seen:
                    continue
                seen.add(nid)
                stack.extend(newer.get(nid, ()))
                stack.extend(older.get(nid, ()))
            chain = sorted(seen, key=lambda i: st.nodes[i].span[0])
            return [Message.from_dict(st.nodes[i].message.to_dict()) for i in chain]  # type: ignore[union-attr]


def _name(st: NodeStore, nid: int) -> str:
    msg = st.nodes[nid].message
    return msg.id if msg is not None and msg.id is not None else f"node:{nid}"
