"""xMemory deletion: a forgotten message takes with it every text and vector made from it.

Deleting messages repairs the hierarchy bottom-up, in one transaction:

* **episodes**: an episode that lost messages gets its record again from the messages left (LLM-free:
  the rendered messages; with an LLM: the episode prompt again, falling back to the rendered
  messages), with the title and timestamp of that record; an emptied episode is removed;
* **semantics**: a semantic lives as long as a message it comes from. One that survives but whose
  *text* was written from a deleted message is written again from its surviving support
  (:meth:`_XMemoryForgetting._rewrite_fact`): a rule fact (``"[date] speaker: sentence"``, distilled
  from one message and kept when a repeat merged into it) takes the sentence of the next supporting
  message that is nearest to it, with that message's date and speaker and the vector of that
  sentence's key; an LLM-written fact (written from a whole episode) is distilled again from each
  surviving supporting episode in turn and takes the new fact nearest to it when that is at least
  ``dedup_threshold`` similar, else that episode no longer supports it. Without support it is
  removed;
* **themes** of changed semantics are summarised again (emptied themes removed), over fresh
  semantic vectors;
* **caches**: after the commit, the shared cleanup of :meth:`HierarchicalMemory.delete
  <shared_core.memories.base.HierarchicalMemory.delete>` takes out of the summariser's sentence cache every
  sentence of the deleted messages and (``forget_rewritten``: records and facts may be an LLM's
  words) of every text the deletion removed or rewrote that no live node still holds (the cache is
  seeded with message and fact vectors and would otherwise keep the forgotten words), and the
  lexical index drops the removed and rewritten texts; the fact rule's answers cached by message
  text drop the deleted messages' texts.

References:
    xMemory Sec. 3.2 (the hierarchy); the deletion itself is this library's, the paper does not forget.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...models.parsing import complete_parsed
from ...prompts import xmemory as P
from ...search.index import inner_products
from ...tree.nodes import NodeStore
from ...types import Message, Usage
from .construction import _facts_parser, _parse_episode, _XMemoryConstruction
from .rules import extract_facts_rule, forget_fact_sentences, render_messages

__all__: list[str] = []

#: no cap on the sentences a message may offer when a fact is written again from it
_ALL_FACTS = 1 << 30

#: a fact's origin: ``"rule"`` (its text is a sentence of one message) or ``"llm"`` (written from an
#: episode), and the leaf ids of the messages its text was written from
_Origin = tuple[str, list[int]]
_Fact = tuple[str, str, list[int]]  # (stored text, embedded key, leaf ids of its messages)


class _XMemoryForgetting(_XMemoryConstruction):
    """The deletion half of :class:`~shared_core.memories.xmemory.XMemory` (see the module)."""

    #: episode records and facts may be written by an LLM (not made of their messages' sentences): a
    #: deletion's caches forget the sentences of every text it rewrites or removes
    forget_rewritten = True

    # ------------------------------------------------------------------ the repair
    def _delete_leaves(self, leaves: Sequence[int], usage: Usage) -> None:
        st = self._store
        gone = [lid for lid in dict.fromkeys(leaves) if lid in st.nodes]
        gone_set = set(gone)
        episodes = sorted({p for p in (st.nodes[lid].parent for lid in gone) if p is not None})
        semantics = sorted({s for e in episodes for s in self._links(e, "semantics") if s in st.nodes})
        # what each affected fact's text was written from, read while all its messages are here
        origins: dict[int, _Origin] = {}
        for s in semantics:
            if "messages" not in st.nodes[s].data:  # saved before the list existed: settle it now
                st.set_data(s, "messages", self._fact_messages(s))
            origins[s] = self._text_origin(s)
        for lid in gone:
            st.detach(lid)
            st.delete_node(lid)
        for ep in episodes:
            if st.nodes[ep].children:
                self._rewrite_record(ep, usage)
                st.refresh_span(ep)
                continue
            st.detach(ep)
            st.delete_node(ep)
            if self._open == ep:
                self._open = None
        themes: set[int] = set()
        rewritten: list[int] = []
        candidates: dict[tuple[str, tuple[int, ...]], list[_Fact]] = {}  # one extraction per group
        for s in semantics:
            sources = [m for m in self._links(s, "messages") if m in st.nodes]
            kind, origin = origins[s]
            if sources and gone_set.intersection(origin):
                sources = self._rewrite_fact(s, kind, sources, candidates, usage)
                if sources:
                    rewritten.append(s)
            st.set_data(s, "messages", sources)
            self._fact_dirty.add(s)
            holders = {st.nodes[m].parent for m in sources}
            kept = [e for e in self._links(s, "episodes") if e in holders]
            for e in self._links(s, "episodes"):
                if e not in kept and e in st.nodes:
                    self._unlink_episode(e, s)
            st.set_data(s, "episodes", kept)
            parent = st.nodes[s].parent
            if parent is not None:
                themes.add(parent)
            if kept:
                self._refresh_semantic_span(s)  # episodes whose primary semantic survives keep their place
            else:
                st.detach(s)
                st.delete_node(s)
        if rewritten:  # a theme summary composed of facts reads each fact's own vector
            self._seed_fact_texts(rewritten, {s: self._vector(s) for s in rewritten})
        for t in sorted(themes):
            if not st.nodes[t].children:
                st.detach(t)
                st.delete_node(t)
        # the derived structures (semantic vectors, theme centroids) are rebuilt from here on, so a
        # theme summary ranks its facts by their current vectors
        self._cache = None
        for t in sorted(t for t in themes if t in st.nodes):
            self._summarize_theme(t, usage)
            st.refresh_span(t)
        root = st.root
        if root is not None and root in st.nodes:
            if not st.nodes[root].children:
                st.delete_node(root)
            else:
                st.refresh_span(root)

    def _unlink_episode(self, e: int, s: int) -> None:
        """Drop semantic ``s`` from episode ``e``'s links; ``e`` moves under its next semantic (or the
        root) when it hung under ``s``."""
        st = self._store
        sems = [x for x in self._links(e, "semantics") if x != s]
        st.set_data(e, "semantics", sems)
        if st.nodes[e].parent == s:
            st.detach(e)
            st.add_child(sems[0] if sems else self._ensure_root(), e)

    # ------------------------------------------------------------------ episodes
    def _rewrite_record(self, ep: int, usage: Usage) -> None:
        """Write episode ``ep``'s record again from its messages: the rendered messages for a raw
        (LLM-free) record, else the episode prompt (the rendered messages when its answer is unusable);
        its title and timestamp follow the new record."""
        st = self._store
        msgs = self._messages(ep)
        data = st.nodes[ep].data
        record = None
        if not data.get("raw", True) and self.llm is not None:
            prompt = P.EPISODE_USER.format(
                conversation=render_messages(msgs), boundary_reason="rewritten after a deletion"
            )
            res = complete_parsed(
                self.llm, prompt, _parse_episode, system=P.EPISODE_SYSTEM, max_tokens=1024, fallback=None
            )
            usage += res.usage
            record = res.value if res.ok else None
        if record is not None:
            st.set_text(ep, f"{record['title']}\n{record['content']}")
            st.set_data(ep, "title", record["title"])
            stamp = record.get("timestamp")
        else:
            st.set_text(ep, render_messages(msgs))
            st.set_data(ep, "raw", True)
            if data.get("title") is not None:
                st.set_data(ep, "title", None)  # the old title may name the forgotten message
            stamp = msgs[0].timestamp if msgs else None
        if "timestamp" in data:  # a closed episode's date is its record's (or its first message's)
            st.set_data(ep, "timestamp", stamp or None)

    # ------------------------------------------------------------------ semantics
    def _text_origin(self, s: int) -> _Origin:
        """Where semantic ``s``'s text was written from: ``("rule", [leaf])`` when it is the rule's
        rendering of a sentence of its first message (the message it was created from), else
        ``("llm", leaves)``: the messages it comes from in that message's episode (an LLM fact is
        written from its episode's record)."""
        st = self._store
        sources = [m for m in self._links(s, "messages") if m in st.nodes]
        if not sources:
            return "rule", []
        first = sources[0]
        text = st.nodes[s].text
        if any(t == text for t, _, _ in self._rule_facts([first])):
            return "rule", [first]
        ep = st.nodes[first].parent
        return "llm", [m for m in sources if st.nodes[m].parent == ep]

    def _rule_facts(self, leaves: Sequence[int]) -> list[_Fact]:
        """Every sentence of these messages the fact rule accepts (no cap), as ``(text, key, [leaf])``."""
        st = self._store
        live = [m for m in leaves if st.nodes[m].message is not None]
        msgs: list[Message] = [st.nodes[m].message for m in live]  # type: ignore[misc]
        return [(t, k, [live[j]]) for t, k, j in extract_facts_rule(msgs, _ALL_FACTS)]

    def _rewrite_fact(
        self,
        s: int,
        kind: str,
        sources: list[int],
        candidates: dict[tuple[str, tuple[int, ...]], list[_Fact]],
        usage: Usage,
    ) -> list[int]:
        """Write semantic ``s`` again from its surviving ``sources`` (its text came from a deleted
        message); returns the messages it now comes from (empty: nothing supports it any more).

        The sources are tried in their order, one message at a time for a rule fact, one episode at a
        time for an LLM fact. Each offers candidate facts (a rule fact: the rule's sentences of that
        message; an LLM fact: the semantic prompt on that episode, else the rule's sentences); the one
        whose key's vector is nearest to ``s``'s current vector becomes ``s``'s text and vector. A
        message supporting a rule fact had a sentence merged into it, so its nearest sentence is taken
        as it is; an LLM fact must find one at least ``dedup_threshold`` similar, else the episode
        stops supporting it.
        """
        st = self._store
        old = self._indexed_vector(s)
        groups: dict[int, list[int]] = {}
        for m in sources:
            groups.setdefault(m if kind == "rule" else st.nodes[m].parent, []).append(m)  # type: ignore[arg-type]
        order = list(groups.values())
        for i, group in enumerate(order):
            ck = (kind, tuple(group))
            if ck not in candidates:
                candidates[ck] = self._fact_candidates(kind, group, usage)
            cands = candidates[ck]
            if not cands:
                continue
            vecs = self._embed([k for _, k, _ in cands], usage)
            sims = inner_products(vecs, old) if old is not None else np.zeros(len(cands))
            j = int(np.argmax(sims))  # ties: the first
            if kind == "llm" and float(sims[j]) < self.dedup_threshold:
                continue
            text, _, src = cands[j]
            st.set_text(s, text)
            self._set_vector(s, vecs[j])
            self._count("semantics_rewritten")
            rest = [m for g in order[i:] for m in g]
            return [*src, *(m for m in rest if m not in src)]
        return []

    def _fact_candidates(self, kind: str, group: list[int], usage: Usage) -> list[_Fact]:
        """Facts of one group of messages for :meth:`_rewrite_fact`: for an LLM fact the semantic prompt
        on their episode's record (on the rendered messages when they are not the whole episode), else
        (or when its answer is unusable) the rule's sentences."""
        st = self._store
        if kind == "llm" and self.llm is not None:
            ep = st.nodes[group[0]].parent
            assert ep is not None
            whole = set(self._leaves_of(ep)) == set(group)
            msgs = [st.nodes[m].message for m in group if st.nodes[m].message is not None]
            text = st.nodes[ep].text if whole else render_messages(msgs)  # type: ignore[arg-type]
            prompt = P.SEMANTIC_USER.format(episodes=text, max_facts=self.max_facts)
            res = complete_parsed(
                self.llm,
                prompt,
                _facts_parser(self.max_facts),
                system=P.SEMANTIC_SYSTEM,
                max_tokens=1024,
                fallback=None,
            )
            usage += res.usage
            if res.ok and res.value:
                return [(f, f, list(group)) for f in res.value]
            self._count("semantic_parse_fallbacks")
        return self._rule_facts(group)

    def _indexed_vector(self, nid: int) -> np.ndarray | None:
        """The vector node ``nid`` had before this transaction (``None`` when it has none)."""
        if self._index is not None and nid in self._index:
            return np.asarray(self._index.get([nid])[0], dtype=np.float32)
        return None

    # ------------------------------------------------------------------ caches
    def _forget_texts(self, texts: Sequence[str], changed: set[int], gone: set[int]) -> None:
        """After a committed deletion: the shared cleanup (the summariser's sentence cache, the lexical
        index; see :meth:`HierarchicalMemory._forget_texts`), and the fact rule's answers cached by
        message text (:func:`~shared_core.memories.xmemory.rules.forget_fact_sentences`)."""
        super()._forget_texts(texts, changed, gone)
        forget_fact_sentences(texts)

    def _forget_all(self, old: NodeStore) -> None:
        """After ``clear()``: the shared cleanup, and the fact rule's cached answers of every text of
        the cleared store."""
        super()._forget_all(old)
        forget_fact_sentences(
            [t for n in old.nodes.values() for t in (n.text, n.message.text if n.message else "") if t]
        )
