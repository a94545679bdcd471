"""xMemory construction: episodes from a boundary detector, semantics distilled and deduplicated, themes
attached, split and merged by the sparsity-semantics objective, kNN graphs kept current (deletion:
:mod:`.forgetting`).

References:
    xMemory Sec. 3.2 (hierarchy, attach/split/merge, kNN graphs), Sec. 5.3, Appendix B and C.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ...arrays import lookup
from ...models.parsing import complete_parsed, parse_json_object
from ...prompts import xmemory as P
from ...search.ann import NeighbourSearch
from ...search.index import inner_products, normalize_rows
from ...types import AddReport, InvalidInputError, Message, MessageLike, Usage, as_messages, check_finite
from ..base import HierarchicalMemory
from .derived import _Derived, _Themes
from .knn import KNNGraph, Search
from .objective import bell_regularizer, candidate_splits, sparsity_score, theme_cohesion
from .rules import central_facts, extract_facts_rule, parse_timestamp, render_messages

__all__ = ["LEVEL_NAMES"]

#: Node ``level`` -> name reported in hits (``metadata["level"]``).
LEVEL_NAMES: dict[int, str] = {0: "message", 1: "episode", 2: "semantic", 3: "theme", 4: "root"}
MESSAGE, EPISODE, SEMANTIC, THEME, ROOT = 0, 1, 2, 3, 4
BOUNDARY_MODES = ("auto", "llm", "rule")


class _XMemoryConstruction(HierarchicalMemory):
    """The construction half of :class:`~shared_core.memories.xmemory.XMemory` (see there)."""

    def _count(self, key: str, n: int = 1) -> None:
        self._counts[key] = self._counts.get(key, 0) + n

    @property
    def boundary_mode(self) -> str:
        """The boundary detector in use: ``"llm"`` or ``"rule"``."""
        if self.boundary == "auto":
            return "llm" if self.llm is not None else "rule"
        return self.boundary

    # ------------------------------------------------------------------ store helpers
    def _ids_at(self, level: int) -> list[int]:
        """Ids of the internal nodes at ``level``, ascending (from the structure arrays)."""
        if level == MESSAGE:  # missing ids read as level 0 in the arrays
            return sorted(i for i, n in self._store.nodes.items() if n.level == level and not n.is_leaf)
        a = self._arrays
        a.sync(self._store)
        return np.flatnonzero((a.level == level) & ~a.leaf).tolist()

    def _messages(self, ep: int) -> list[Message]:
        st = self._store
        return [st.nodes[c].message for c in st.nodes[ep].children if st.nodes[c].message is not None]

    def _leaves_of(self, ep: int) -> list[int]:
        st = self._store
        return [c for c in st.nodes[ep].children if st.nodes[c].message is not None]

    def _fact_messages(self, s: int) -> list[int]:
        """Leaf ids of the messages semantic ``s`` was distilled from.

        Its ``messages`` list; for a semantic saved before that list existed, the messages of its linked
        episodes that contain its sentence (a rule fact), else all of them (an LLM-written fact).
        """
        st = self._store
        node = st.nodes[s]
        if "messages" in node.data:
            return [m for m in self._links(s, "messages") if m in st.nodes]
        leaves = [m for e in self._links(s, "episodes") if e in st.nodes for m in self._leaves_of(e)]
        sentence = node.text.split("] ", 1)[-1].split(": ", 1)[-1]
        exact = [m for m in leaves if sentence and sentence in st.nodes[m].text]
        return exact or leaves

    def _links(self, nid: int, key: str) -> list[int]:
        return [int(x) for x in self._store.nodes[nid].data.get(key, [])]

    def _derived(self) -> _Derived:
        if self._cache is not None:
            return self._cache
        st = self._store
        sem_ids = self._ids_at(SEMANTIC)
        sem_vec: dict[int, np.ndarray] = {}
        fresh = [i for i in sem_ids if i in self._pending or i in st.changed]
        stored = [i for i in sem_ids if i not in self._pending and i not in st.changed]
        if stored:
            assert self._index is not None
            sem_vec.update(zip(stored, np.asarray(self._index.get(stored), dtype=np.float32)))
        for i in fresh:
            sem_vec[i] = np.asarray(self._vector(i), dtype=np.float32)
        d = _Derived(
            sem_ids,
            sem_vec,
            {},
            KNNGraph(self.knn_k),
            KNNGraph(self.knn_k),
            sem_search=NeighbourSearch(self.exact_search_max),
            theme_search=NeighbourSearch(self.exact_search_max),
        )
        self._seed_fact_texts(sem_ids, sem_vec)  # as when each fact was added, after a load too
        for t in self._ids_at(THEME):
            members = [c for c in st.nodes[t].children if c in sem_vec]
            if members:
                d.theme_stats[t] = self._stats_of(d, members)
        if sem_ids:
            d.sem_graph.rebuild(d.sem_id_array(), d.sem_matrix(), d.sem_searcher())
        tids, tmat = d.theme_matrix()
        if tids:
            d.theme_graph.rebuild(tids, tmat, d.theme_searcher())
        ts = d.theme_stats
        assert isinstance(ts, _Themes)
        ts.changed, ts.dropped = set(), set()  # the theme graph is current
        self._cache = d
        return d

    @staticmethod
    def _stats_of(d: _Derived, members: Sequence[int]) -> tuple[int, float, np.ndarray]:
        coh, mu = theme_cohesion(np.stack([d.sem_vec[m] for m in members]))
        return len(members), coh, mu

    def _ensure_root(self) -> int:
        st = self._store
        if st.root is None:
            root = st.new_node(level=ROOT)
            st.set_root(root.id)
        assert st.root is not None
        return st.root

    # ------------------------------------------------------------------ construction
    def add(self, items: MessageLike | Iterable[MessageLike], **kw: Any) -> AddReport:
        """Add messages in order (see :meth:`HierarchicalMemory.add`, whose keyword arguments ``upsert``
        and ``allow_duplicate_ids`` it takes).

        The texts of all given messages are embedded in one batched call before they are inserted one
        by one (online: each boundary decision only sees the messages before it).

        Args:
            items: a string, a :class:`Message`, or an iterable of them (inserted in order).

        Returns:
            :class:`AddReport`; ``details[i]`` says whether message i closed an episode (``boundary``,
            ``boundary_by``: ``llm`` / ``gap`` / ``drift`` / ``cap`` / ``rule``) and what the closed
            episode produced (``semantics_created``, ``semantics_merged``, ``facts``).

        Raises:
            InvalidInputError, EmbeddingError, ModelError: as :meth:`HierarchicalMemory.add`; the memory is
                then unchanged.
        """
        messages = as_messages(items)
        self._prefetch = [m.render() for m in messages]
        try:
            return super().add(messages, **kw)
        finally:
            self._prefetch = None

    def _insert(self, message: Message, usage: Usage) -> dict[str, Any]:
        st = self._store
        if self._prefetch:
            self._embed(self._prefetch, usage)  # one batched call; _embed reuses these vectors
            self._prefetch = None
        root = self._ensure_root()
        text = message.render()  # "speaker: text", as every hiermem memory indexes a message
        leaf = st.new_node(text=text, is_leaf=True, message=message, level=MESSAGE)
        vec = self._embed([text], usage)[0]
        self._set_vector(leaf.id, vec)
        detail: dict[str, Any] = {"boundary": False}
        ep = self._open
        if ep is not None and st.nodes[ep].children:
            cut, reason, how = self._detect_boundary(ep, message, vec, usage)
            detail.update(boundary=cut, boundary_by=how)
            if cut:
                self._count(f"boundary_{how}")
                detail["closed_episode"] = ep
                detail.update(self._close_episode(ep, reason, usage))
                ep = None
        if ep is None:
            ep = st.new_node(level=EPISODE, data={"open": True, "raw": True}).id
            st.add_child(root, ep)
            self._open = ep
            self._count("episodes_opened")
        st.add_child(ep, leaf.id)
        st.refresh_span(ep)
        st.set_text(ep, render_messages(self._messages(ep)))
        if len(st.nodes[root].children) > 1:
            # only the open episode grew since the root's span was last refreshed (spans only grow
            # while adding): merge its span in instead of reading every child of the root
            (a, b), (ea, eb) = st.nodes[root].span, st.nodes[ep].span
            st.set_span(root, (min(a, ea), max(b, eb)))
        else:
            st.refresh_span(root)
        detail["episode"] = ep
        return detail

    def flush(self) -> AddReport:
        """Close the open episode now: write its record, distil its semantics, update the themes.

        Atomic like :meth:`add` (any error leaves the memory unchanged). Does nothing when no episode is
        open.

        Returns:
            :class:`AddReport` (no new leaves; ``details`` has one entry describing the closed episode).

        References:
            xMemory Sec. 3.2 (episode -> semantic -> theme construction).
        """
        report = AddReport()

        def close() -> None:
            ep = self._open
            report.details.clear()
            if ep is None or ep not in self._store.nodes:  # closed meanwhile by another process
                return
            details = {"closed_episode": ep, **self._close_episode(ep, "end of the stream", report.usage)}
            report.details.append(details)
            self._embed_pending(report.usage)

        with self._lock:
            self._sync_store()
            if self._open is None or self._open not in self._store.nodes:
                return report
            t0 = time.perf_counter()
            self._transaction(report.usage, close)
            self._record_seconds(report.usage, time.perf_counter() - t0)
        return report

    # ---- boundary detection
    def _detect_boundary(
        self, ep: int, message: Message, vec: np.ndarray, usage: Usage
    ) -> tuple[bool, str, str]:
        st = self._store
        children = list(st.nodes[ep].children)
        if len(children) >= self.max_episode_messages:
            return True, f"the episode reached {self.max_episode_messages} messages", "cap"
        if self.boundary_mode == "llm":
            assert self.llm is not None
            prompt = P.BOUNDARY_USER.format(
                history=render_messages(self._messages(ep)),
                new_messages=render_messages([message]),
                max_messages=self.max_episode_messages,
            )
            res = complete_parsed(
                self.llm,
                prompt,
                _parse_boundary,
                system=P.BOUNDARY_SYSTEM,
                max_tokens=128,
                fallback=None,
            )
            usage += res.usage
            if res.ok and res.value is not None:
                cut, reason = res.value
                return cut, reason or "topic change", "llm"
            self._count("boundary_parse_fallbacks")
        prev = st.nodes[children[-1]].message
        t_prev = parse_timestamp(prev.timestamp if prev is not None else None)
        t_new = parse_timestamp(message.timestamp)
        if t_prev is not None and t_new is not None:
            gap = abs((t_new - t_prev).total_seconds()) / 60.0
            if gap > self.time_gap_minutes:
                return True, f"{gap:.0f} minutes passed since the previous message", "gap"
        if len(children) >= self.min_episode_messages:
            centroid = normalize_rows(np.mean(self._vectors(children), axis=0, keepdims=True))[0]
            cos = float(centroid @ vec)
            if cos < self.drift_threshold:
                return True, f"topic drift (cosine {cos:.2f} to the episode)", "drift"
        return False, "", "rule"

    # ---- closing an episode
    def _close_episode(self, ep: int, reason: str, usage: Usage) -> dict[str, Any]:
        st = self._store
        leaves = self._leaves_of(ep)
        msgs = [st.nodes[c].message for c in leaves]
        st.set_data(ep, "open", False)
        if self._open == ep:
            self._open = None
        self._count("episodes")
        # 1. the episode record
        record = None
        if self.llm is not None:
            prompt = P.EPISODE_USER.format(
                conversation=render_messages(msgs), boundary_reason=reason or "not given"
            )
            res = complete_parsed(
                self.llm, prompt, _parse_episode, system=P.EPISODE_SYSTEM, max_tokens=1024, fallback=None
            )
            usage += res.usage
            record = res.value if res.ok else None
            if record is None:
                self._count("episode_parse_fallbacks")
        if record is not None:
            st.set_text(ep, f"{record['title']}\n{record['content']}")
            st.set_data(ep, "raw", False)
            st.set_data(ep, "title", record["title"])
            if record.get("timestamp"):
                st.set_data(ep, "timestamp", record["timestamp"])
        else:
            st.set_text(ep, render_messages(msgs))
            st.set_data(ep, "raw", True)
            if msgs and msgs[0].timestamp:
                st.set_data(ep, "timestamp", msgs[0].timestamp)
        # 2. semantic facts
        facts: list[tuple[str, str, list[int]]] | None = None
        if self.llm is not None:
            prompt = P.SEMANTIC_USER.format(episodes=st.nodes[ep].text, max_facts=self.max_facts)
            parse = _facts_parser(self.max_facts)
            res2 = complete_parsed(
                self.llm, prompt, parse, system=P.SEMANTIC_SYSTEM, max_tokens=1024, fallback=None
            )
            usage += res2.usage
            if res2.ok and res2.value is not None:
                facts = [(f, f, leaves) for f in res2.value]  # from the episode as a whole
            else:
                self._count("semantic_parse_fallbacks")
        if facts is None:
            facts = [(t, k, [leaves[j]]) for t, k, j in extract_facts_rule(msgs, self.max_facts)]
        linked, created, merged = self._add_semantics(ep, facts, usage)
        # 3. place the episode under its primary semantic
        if linked:
            st.detach(ep)
            st.add_child(linked[0], ep)
        else:
            self._count("unfiled_episodes")
        st.set_data(ep, "semantics", list(linked))
        themes_touched = {st.nodes[s].parent for s in created if st.nodes[s].parent is not None}
        for s in linked:
            self._refresh_semantic_span(s)
        # 4. theme maintenance
        themes_touched = self._restructure({t for t in themes_touched if t is not None}, usage)
        self._finish_themes(themes_touched, usage)
        for t in {st.nodes[s].parent for s in linked} - themes_touched:  # spans grown by a merged fact
            if t is not None:
                st.refresh_span(t)
        # closing moves the episode below the root and grows spans only up to the episode's own, which
        # the root's span already covers (the open episode's span is merged in at every insert)
        root = self._ensure_root()
        (a, b), (ea, eb) = st.nodes[root].span, st.nodes[ep].span
        st.set_span(root, (min(a, ea), max(b, eb)))
        return {"semantics_created": len(created), "semantics_merged": merged, "facts": len(facts)}

    def _add_semantics(
        self, ep: int, facts: list[tuple[str, str, list[int]]], usage: Usage
    ) -> tuple[list[int], list[int], int]:
        """Deduplicate facts against existing semantics, create the new ones and attach them to themes.

        ``facts`` are ``(text, key, sources)``: the stored text, the embedded text and the leaf ids of the
        messages the fact comes from (kept in the semantic's ``messages``, extended on a merge).
        """
        st = self._store
        facts = [(t.strip(), k.strip(), src) for t, k, src in facts if t.strip() and k.strip()]
        if not facts:
            return [], [], 0
        d = self._derived()
        vecs = self._embed([k for _, k, _ in facts], usage)
        linked: list[int] = []
        created: list[int] = []
        merged = 0
        for (text, _, sources), v in zip(facts, vecs):
            target = None
            search = d.sem_searcher()
            if search is not None:
                best = _nearest_candidate(search, v, d.sem_vec.__getitem__)
                if best is not None and best[1] >= self.dedup_threshold:
                    target = best[0]
            elif d.sem_ids:
                sims = inner_products(d.sem_matrix(), v)
                j = int(np.argmax(sims))
                if float(sims[j]) >= self.dedup_threshold:
                    target = d.sem_ids[j]
            if target is not None:
                eps_ = self._links(target, "episodes")
                if ep not in eps_:
                    st.set_data(target, "episodes", [*eps_, ep])
                if "messages" in st.nodes[target].data:
                    known = self._links(target, "messages")
                    st.set_data(target, "messages", [*known, *(m for m in sources if m not in known)])
                    self._fact_dirty.add(target)
                merged += 1
                self._count("semantic_merges")
                if target not in linked:
                    linked.append(target)
                continue
            node = st.new_node(
                text=text, level=SEMANTIC, data={"episodes": [ep], "messages": list(sources), "moves": 0}
            )
            self._set_vector(node.id, v)
            d.sem_ids.append(node.id)
            d.sem_vec[node.id] = np.asarray(v, dtype=np.float32)
            self._attach_to_theme(node.id, d)
            created.append(node.id)
            linked.append(node.id)
            self._count("semantics_created")
        if created:
            d.sem_graph.upsert(d.sem_id_array(), d.sem_matrix(), created, d.sem_searcher(), d.sem_positions())
            self._seed_fact_texts(created, d.sem_vec)
        return linked, created, merged

    def _seed_fact_texts(self, sems: list[int], vecs: Mapping[int, np.ndarray]) -> None:
        """Give the summariser each semantic's vector under its stored text, so a theme summary composed
        of facts (``"[date] speaker: sentence"``) reads each fact's own vector instead of embedding it."""
        seed = self._summarizer_hook("seed")
        if seed is not None and sems:
            seed([self._store.nodes[s].text for s in sems], np.stack([vecs[s] for s in sems]))

    def _attach_to_theme(self, sid: int, d: _Derived) -> int:
        st = self._store
        v = d.sem_vec[sid]
        search = d.theme_searcher()
        tids, tmat = d.theme_matrix()
        target = None
        if search is not None:
            best = _nearest_candidate(search, v, lambda t: tmat[d.theme_pos(t)])
            if best is not None and best[1] >= self.attach_threshold:
                target = best[0]
        elif tids:
            sims = inner_products(tmat, v)
            j = int(np.argmax(sims))
            if float(sims[j]) >= self.attach_threshold:
                target = tids[j]
        if target is None:
            target = st.new_node(level=THEME).id
            st.add_child(self._ensure_root(), target)
            self._count("themes_created")
        st.add_child(target, sid)
        d.theme_stats[target] = self._stats_of(d, st.nodes[target].children)
        return target

    def _sync_theme_graph(self, d: _Derived) -> tuple[list[int], np.ndarray, Search | None]:
        """Bring the theme kNN graph up to date with ``theme_stats``; returns ``d.theme_matrix()`` and
        the theme search (``None`` while exhaustive)."""
        search = d.theme_searcher()
        tids, tmat = d.theme_matrix()
        ts = d.theme_stats
        assert isinstance(ts, _Themes)
        gone = sorted(t for t in ts.dropped if t in d.theme_graph.rows and t not in ts)
        live = sorted(t for t in ts.changed if t in ts)
        ts.changed, ts.dropped = set(), set()
        if gone:
            d.theme_graph.remove(gone, d.theme_id_array(), tmat, search)
        if live:
            d.theme_graph.upsert(d.theme_id_array(), tmat, live, search, d.theme_positions())
        return tids, tmat, search

    def _objective_with(self, d: _Derived, replace: Mapping[int, list[list[int]]]) -> float:
        """``f(P)`` of the current partition with some themes replaced by lists of member groups.

        Eq. (1)-(3) over every theme, without the all-pairs product: each kept theme's nearest-neighbour
        similarity ``s_k`` comes from the theme kNN graph (the best entry of its row that is not
        replaced, recomputed when the row holds none) and from the new groups' centroids (one product
        of the groups against every theme); similarities are the graph's (float32 inner products of the
        normalised centroids). O(T d) per call instead of O(T^2 d). Above ``exact_search_max`` themes the
        nearest themes of a group (and of a row whose listed neighbours are all replaced) are found
        among the theme search's candidates.
        """
        tids, tmat, search = self._sync_theme_graph(d)
        g = d.theme_graph
        ids = d.theme_id_array()
        sizes, cohs = d.theme_sizes_cohesions()
        gone = [t for t in replace if d.theme_pos(t) >= 0]
        keep = np.ones(len(tids), dtype=bool)
        keep[[d.theme_pos(t) for t in gone]] = False
        stats = [self._stats_of(d, grp) for groups in replace.values() for grp in groups if grp]
        new_sizes = np.concatenate([sizes[keep], [n for n, _, _ in stats]])
        new_cohs = np.concatenate([cohs[keep], [c for _, c, _ in stats]])
        if len(new_sizes) == 1:
            return sparsity_score(new_sizes) + float(new_cohs[0])
        s = g.nearest(ids)
        gone_set = set(gone)
        for j in sorted(set().union(*(g.listed_by(t) for t in gone)) - gone_set):
            row, pj = g.rows[j], d.theme_pos(j)
            best = [v for u, v in row.items() if u not in gone_set]
            if best:
                s[pj] = max(best)
            elif search is not None and (got := self._best_kept(d, search, tmat[pj], keep, j)):
                s[pj] = got[0]
            elif keep.sum() > 1:  # every listed neighbour is replaced: the best of the others
                others = keep.copy()
                others[pj] = False
                s[pj] = float(inner_products(tmat[others], tmat[pj]).max())
            else:
                s[pj] = -np.inf
        s_keep = s[keep]
        if stats:
            G = normalize_rows(np.stack([mu for _, _, mu in stats]).astype(np.float32))
            if search is not None:  # each group against its candidates among the kept themes
                s_new = np.full(len(G), -np.inf)
                for gi in range(len(G)):
                    got = self._best_kept(d, search, G[gi], keep, None)
                    if got:
                        s_new[gi], (pos, sims) = got[0], got[1]
                        s[pos] = np.maximum(s[pos], sims)
                s_keep = s[keep]
            else:
                cross = inner_products(tmat[keep], G) if keep.any() else np.zeros((len(G), 0), np.float32)
                if cross.shape[1]:
                    s_keep = np.maximum(s_keep, cross.max(axis=0))
                s_new = cross.max(axis=1).astype(np.float64) if cross.shape[1] else np.full(len(G), -np.inf)
            if len(G) > 1:
                GG = inner_products(G, G).astype(np.float64)
                np.fill_diagonal(GG, -np.inf)
                s_new = np.maximum(s_new, GG.max(axis=1))
            s_keep = np.concatenate([s_keep, s_new])
        sem = float((new_cohs * bell_regularizer(s_keep, self.eps)).mean())
        return sparsity_score(new_sizes) + sem

    def _best_kept(
        self, d: _Derived, search: Search, v: np.ndarray, keep: np.ndarray | None, skip: int | None
    ) -> tuple[float, tuple[np.ndarray, np.ndarray]] | None:
        """Among the theme search's candidates for ``v``: the kept themes (``keep`` by position, ``None``:
        all; ``skip`` left out), as ``(best similarity, (positions, similarities))``, or ``None`` when
        none is kept."""
        cand = search(v, 2 * self.knn_k + 1)[0]
        cand = cand[(cand >= 0) & (cand != (-1 if skip is None else skip))]
        pos = lookup(d.theme_positions(), cand, -1)
        pos = pos[pos >= 0]
        if keep is not None:
            pos = pos[keep[pos]]
        if not len(pos):
            return None
        _, tmat = d.theme_matrix()
        sims = inner_products(tmat[pos], v).astype(np.float64)
        return float(sims.max()), (pos, sims)

    def _restructure(self, touched: set[int], usage: Usage) -> set[int]:
        """Split overcrowded and merge tiny themes among ``touched``; return every theme left touched."""
        st = self._store
        d = self._derived()
        touched = {t for t in touched if t in st.nodes}
        work = sorted(t for t in touched if len(st.nodes[t].children) > self.theme_size_cap)
        while self.split and work:
            t = work.pop(0)
            members = list(st.nodes[t].children)
            if len(members) <= self.theme_size_cap:
                continue
            X = np.stack([d.sem_vec[m] for m in members])
            best, best_f = None, -math.inf
            for labels in candidate_splits(X):
                groups = [[m for m, lab in zip(members, labels) if lab == g] for g in range(labels.max() + 1)]
                f = self._objective_with(d, {t: groups})
                if f > best_f:
                    best, best_f = groups, f
            assert best is not None
            new_themes = self._apply_split(t, best, d)
            self._count("theme_splits")
            touched.update(new_themes)
            work.extend(x for x in new_themes if len(st.nodes[x].children) > self.theme_size_cap)
        if self.merge:
            for t in sorted(touched):
                if t not in st.nodes or t not in d.theme_stats:
                    continue
                if len(st.nodes[t].children) > self.tiny_theme_size:
                    continue
                target = self._choose_merge(t, d)
                if target is not None:
                    self._apply_merge(t, target, d)
                    self._count("theme_merges")
                    touched.add(target)
        return {t for t in touched if t in st.nodes}

    def _apply_split(self, t: int, groups: list[list[int]], d: _Derived) -> list[int]:
        st = self._store
        groups = sorted(groups, key=lambda g: (-len(g), min(g)))  # the largest part keeps the theme node
        out = [t]
        for g in groups[1:]:
            nt = st.new_node(level=THEME).id
            st.add_child(self._ensure_root(), nt)
            for s in g:
                self._move_semantic(s, nt)
            d.theme_stats[nt] = self._stats_of(d, g)
            out.append(nt)
        d.theme_stats[t] = self._stats_of(d, groups[0])
        return out

    def _choose_merge(self, t: int, d: _Derived) -> int | None:
        st = self._store
        search = d.theme_searcher()
        tids, tmat = d.theme_matrix()
        if len(tids) < 2:
            return None
        me = d.theme_pos(t)
        m = self.merge_candidates
        if search is not None:  # the m most similar candidates, ties by position
            got = self._best_kept(d, search, tmat[me], None, t)
            pos, psims = got[1] if got else (np.zeros(0, dtype=np.int64), np.zeros(0))
            top = np.lexsort((pos, -psims))[:m]
            pairs = [(int(pos[i]), float(psims[i])) for i in top]
        else:
            sims = inner_products(tmat, tmat[me])
            sims[me] = -np.inf
            neg = -sims
            # the m most similar, ties by position: a stable sort of those at least the m-th best
            head = (
                np.nonzero(neg <= np.partition(neg, m - 1)[m - 1])[0] if len(neg) > m else np.arange(len(neg))
            )
            pairs = [(int(j), float(sims[j])) for j in head[np.argsort(neg[head], kind="stable")][:m]]
        n_t = len(st.nodes[t].children)
        best, best_f = None, -math.inf
        for j, sim in pairs:
            u = tids[j]
            if sim < self.merge_threshold:
                continue
            if n_t + len(st.nodes[u].children) > self.theme_size_cap:
                continue
            groups = [list(st.nodes[u].children) + list(st.nodes[t].children)]
            f = self._objective_with(d, {t: [], u: groups})
            if f > best_f:
                best, best_f = u, f
        return best

    def _apply_merge(self, t: int, target: int, d: _Derived) -> None:
        st = self._store
        for s in list(st.nodes[t].children):
            self._move_semantic(s, target)
        st.detach(t)
        st.delete_node(t)
        d.theme_stats.pop(t, None)
        d.theme_stats[target] = self._stats_of(d, st.nodes[target].children)

    def _move_semantic(self, s: int, theme: int) -> None:
        st = self._store
        st.detach(s)
        st.add_child(theme, s)
        st.set_data(s, "moves", int(st.nodes[s].data.get("moves", 0)) + 1)

    def _finish_themes(self, touched: set[int], usage: Usage) -> None:
        """Re-summarise touched themes, refresh their spans and update the theme kNN graph."""
        st = self._store
        d = self._derived()
        live = sorted(t for t in touched if t in st.nodes)
        for t in live:
            self._summarize_theme(t, usage)
            st.refresh_span(t)
        self._sync_theme_graph(d)

    def _summarize_theme(self, t: int, usage: Usage) -> None:
        st = self._store
        texts = [st.nodes[s].text for s in st.nodes[t].children if st.nodes[s].text]
        if not texts:
            return
        if len(texts) == 1:
            st.set_text(t, texts[0])
            return
        if self.llm is None and not self._custom_summarizer:
            d = self._derived()
            members = [s for s in st.nodes[t].children if st.nodes[s].text]
            vecs = np.stack([d.sem_vec[s] for s in members])
            st.set_text(t, central_facts(texts, vecs, self.summary_chars))
            return
        text, u = self.summarizer.summarize(texts)
        usage += u
        st.set_text(t, text)

    def _refresh_semantic_span(self, s: int) -> None:
        st = self._store
        spans = [st.nodes[e].span for e in self._links(s, "episodes") if e in st.nodes]
        if spans:
            st.set_span(s, (min(a for a, _ in spans), max(b for _, b in spans)))


# =========================================================================== parsers and checks
def _parse_boundary(text: str) -> tuple[bool, str]:
    obj = parse_json_object(text)
    b = obj.get("boundary")
    if not isinstance(b, bool):
        raise ValueError('The field "boundary" must be true or false (a JSON boolean).')
    reason = obj.get("reason", "")
    if not isinstance(reason, str):
        raise ValueError('The field "reason" must be a string.')
    return b, reason.strip()


def _parse_episode(text: str) -> dict[str, str]:
    obj = parse_json_object(text)
    out: dict[str, str] = {}
    for key in ("title", "content"):
        v = obj.get(key)
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f'The field "{key}" must be a non-empty string.')
        out[key] = v.strip()
    ts = obj.get("timestamp")
    if ts is not None:
        if not isinstance(ts, str):
            raise ValueError('The field "timestamp" must be a string in YYYY-MM-DDTHH:MM:SS format.')
        out["timestamp"] = ts.strip()
    return out


def _facts_parser(max_facts: int) -> Any:
    def parse(text: str) -> list[str]:
        obj = parse_json_object(text)
        facts = obj.get("facts")
        if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
            raise ValueError('The field "facts" must be a JSON list of strings.')
        clean = list(dict.fromkeys(f.strip() for f in facts if f.strip()))
        return clean[:max_facts]

    return parse


def _pos_int(x: Any, name: str, minimum: int = 1) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or int(x) < minimum:
        raise InvalidInputError(f"{name} must be an integer >= {minimum}, got {x!r}.")
    return int(x)


def _cosine(x: Any, name: str) -> float:
    v = check_finite(x, name)
    if not -1.0 <= v <= 1.0:
        raise InvalidInputError(f"{name} is a cosine and must be in [-1, 1], got {v}.")
    return v


def _nearest_candidate(
    search: Search, v: np.ndarray, vector_of: Any, k: int = 16
) -> tuple[int, float] | None:
    """The most similar of ``search``'s ``k`` candidates for ``v`` (exact similarity; ties: the smaller
    id) as ``(id, similarity)``, or ``None`` when there is no candidate. ``vector_of(id)`` gives a
    candidate's unit vector."""
    cand = [int(c) for c in search(v, k)[0] if c >= 0]
    if not cand:
        return None
    sims = inner_products(np.stack([vector_of(c) for c in cand]), v)
    j = int(np.lexsort((np.asarray(cand), -sims))[0])
    return cand[j], float(sims[j])
