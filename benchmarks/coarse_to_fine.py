"""Coarse-to-fine retrieval on long memories: segments first, then the best leaf inside each.

Does a SegTreeMem segment's summary pick the right part of a long conversation better than the same rule
without a tree? Each RealMem persona is ingested online (the messages before each question, one ``add``
per session, as ``hiermem eval`` does) into a default ``SegTreeMem`` and a flat ``FlatFusion`` over the same
embedder, and each question's top-k messages are chosen by five rules, one best message per group and
group order first (a second pass takes the next best of each group when the groups run out):

* ``tree_best_leaf``: groups = SegTreeMem's lowest segments (a leaf's parent), ordered by their best
  leaf's ``top_down`` score (what ``segment_cap=1, segment_depth=99`` returns);
* ``tree_summary``: the same segments ordered by the relevance of the segment's own summary (coarse to
  fine: the summaries choose the segments);
* ``tree_summary+leaf``: ordered by the summary's relevance plus the best leaf's;
* ``flat_best_turn``: groups = sessions, ordered by their best turn's fusion score
  (``fusion[session_cap=1]``);
* ``flat_session_doc``: sessions ordered by a session document's fusion score (the cosine with the mean of
  the session's turn vectors, BM25 over the session's whole text): the flat control of ``tree_summary``;
* ``flat_session_doc+turn``: ordered by the session document's score plus the best turn's;

plus the plain rankings (``tree_top_down``: SegTreeMem's default; ``flat_fusion``). Session evidence
recall@k (a RealMem evidence id is a session), paired bootstrap 95% intervals of the differences.

Usage::

    python benchmarks/coarse_to_fine.py --realmem ../shared/data/realmem/Kenta_Tanaka_dialogues_256k.json \
        --out coarse_to_fine_kenta.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

RULES = (
    "tree_top_down",
    "tree_best_leaf",
    "tree_summary",
    "tree_summary+leaf",
    "flat_fusion",
    "flat_best_turn",
    "flat_session_doc",
    "flat_session_doc+turn",
)
PAIRS = (
    ("tree_summary", "flat_session_doc"),
    ("tree_summary+leaf", "flat_session_doc+turn"),
    ("tree_best_leaf", "flat_best_turn"),
    ("tree_summary", "tree_best_leaf"),
    ("flat_session_doc", "flat_best_turn"),
    ("tree_summary+leaf", "flat_best_turn"),
    ("tree_top_down", "flat_fusion"),
)


def one_per_group(key: dict, items: dict, k: int, texts: dict) -> list[int]:
    """``k`` items of distinct texts: the best of each group, groups by ``key`` descending (ties in the
    order of ``key``), then the second best of each, ...

    ``items[g]``: the group's item ids best first; ``texts[i]``: an item's text."""
    pos = {g: n for n, g in enumerate(key)}
    order = sorted(key, key=lambda g: (-key[g], pos[g]))
    out: list[int] = []
    seen: set[str] = set()
    rank = 0
    while len(out) < k:
        took = False
        for g in order:
            lst = items[g]
            if rank < len(lst):
                took = True
                i = lst[rank]
                if texts[i] not in seen:
                    seen.add(texts[i])
                    out.append(i)
                    if len(out) == k:
                        break
        if not took:
            break
        rank += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--realmem", required=True, action="append", help="RealMem persona JSON (repeatable)")
    ap.add_argument("--k", type=int, default=10, help="hits per question (default 10)")
    ap.add_argument("--weight", type=float, default=0.5, help="dense weight of the fusion (default 0.5)")
    ap.add_argument("--out", default=None, help="JSON output path")
    args = ap.parse_args()

    from shared_core.eval.baselines import FlatFusion
    from shared_core.eval.data import load_realmem
    from shared_core.eval.metrics import evidence_recall
    from shared_core.eval.protocol import paired_bootstrap
    from shared_core.eval.runner import CachingEmbedder
    from shared_core.memories.segtree import SegTreeMem
    from shared_core.models.local import LocalEmbedder
    from shared_core.scores import inner_products, normalize_rows
    from shared_core.search.lexical import LexicalIndex
    from shared_core.search.relevance import fuse

    emb = CachingEmbedder(LocalEmbedder())
    w, k = args.weight, args.k
    res: dict[str, list[float]] = {n: [] for n in RULES}
    for path in args.realmem:
        conv = load_realmem(path)
        mem, flat = SegTreeMem(emb), FlatFusion(emb, hybrid_weight=w)
        msgs = conv.messages
        done = 0
        for q in sorted(conv.queries, key=lambda q: q.position):
            while done < q.position:  # one add per session, never past the question
                end = done + 1
                while end < q.position and msgs[end].id == msgs[done].id:
                    end += 1
                mem.add(msgs[done:end])
                flat.add(msgs[done:end])
                done = end
            if not q.evidence or done == 0:
                continue
            n = done
            # --- tree
            ids, r = mem.relevance(q.question, "hybrid", w)
            _, s = mem.scores(q.question, "top_down")
            rel = dict(zip(ids.tolist(), np.asarray(r, dtype=np.float64).tolist()))
            score = dict(zip(ids.tolist(), np.asarray(s, dtype=np.float64).tolist()))
            nodes = mem._store.nodes
            leaves = [i for i in ids.tolist() if nodes[i].is_leaf]
            texts = {i: nodes[i].text for i in leaves}
            seg_items: dict[object, list[int]] = {}
            for i in sorted(leaves, key=lambda i: (-score[i], i)):
                seg_items.setdefault(
                    nodes[i].parent if nodes[i].parent is not None else ("leaf", i), []
                ).append(i)
            segs = list(seg_items)  # in the order of their best leaf
            best = {g: score[seg_items[g][0]] for g in segs}
            best_r = {g: rel[seg_items[g][0]] for g in segs}
            summ = {g: rel.get(g, 0.0) if not isinstance(g, tuple) else 0.0 for g in segs}

            src = {i: str(nodes[i].message.id) for i in leaves}
            seen: set[str] = set()
            top_down = []
            for i in sorted(leaves, key=lambda i: (-score[i], i)):
                if texts[i] not in seen:
                    seen.add(texts[i])
                    top_down.append(src[i])
                if len(top_down) == k:
                    break
            keys = {
                "tree_best_leaf": best,
                "tree_summary": summ,
                "tree_summary+leaf": {g: summ[g] + best_r[g] for g in segs},
            }
            got = {"tree_top_down": top_down}
            for name, key in keys.items():
                got[name] = [src[i] for i in one_per_group(key, seg_items, k, texts)]
            # --- flat: fusion over the turns, and session documents
            order_d, cos = flat.dense.ranking(q.question)
            fd = np.zeros(n, np.float32)
            fd[order_d] = np.maximum(cos, 0.0)
            fb = np.zeros(n, np.float32)
            bids, bsc = flat.bm25.index.scores(q.question)
            fb[bids] = bsc
            f = fuse(fd, fb, w).astype(np.float64)
            turn_text = {j: msgs[j].render() for j in range(n)}
            sess_items: dict[object, list[int]] = {}
            for j in np.lexsort((np.arange(n), -f)).tolist():
                sess_items.setdefault(msgs[j].id, []).append(j)
            sessions = list(sess_items)
            seen = set()
            flat_plain = []
            for j in np.lexsort((np.arange(n), -f)).tolist():
                if turn_text[j] not in seen:
                    seen.add(turn_text[j])
                    flat_plain.append(str(msgs[j].id))
                if len(flat_plain) == k:
                    break
            vec = normalize_rows(np.asarray(emb.embed([turn_text[j] for j in range(n)]), dtype=np.float32))
            qv = normalize_rows(np.asarray(emb.embed([q.question]), dtype=np.float32))[0]
            sdense, sdoc = [], []
            for g in sessions:
                rows = sorted(sess_items[g])
                m = normalize_rows(vec[rows].mean(axis=0, keepdims=True))[0]
                sdense.append(max(float(inner_products(m[None, :], qv)[0]), 0.0))
                sdoc.append("\n".join(turn_text[j] for j in rows))
            lex = LexicalIndex()
            lex.upsert(list(range(len(sessions))), sdoc)
            sb = np.zeros(len(sessions), np.float32)
            lid, lsc = lex.scores(q.question)
            sb[lid] = lsc
            sdoc_score = dict(
                zip(sessions, fuse(np.asarray(sdense, np.float32), sb, w).astype(np.float64).tolist())
            )
            best_turn = {g: float(f[sess_items[g][0]]) for g in sessions}

            keys = {
                "flat_best_turn": best_turn,
                "flat_session_doc": sdoc_score,
                "flat_session_doc+turn": {g: sdoc_score[g] + best_turn[g] for g in sessions},
            }
            got["flat_fusion"] = flat_plain
            for name, key in keys.items():
                got[name] = [str(msgs[j].id) for j in one_per_group(key, sess_items, k, turn_text)]
            for name in RULES:
                res[name].append(evidence_recall(got[name], q.evidence))
        print(f"{conv.id}: {len(res['tree_top_down'])} questions so far", flush=True)
    out: dict = {"k": k, "weight": w, "questions": len(res["tree_top_down"]), "recall": {}, "differences": {}}
    for name in RULES:
        out["recall"][name] = float(np.mean(res[name]))
        print(f"{name:24s} session recall@{k} {np.mean(res[name]):.4f}")
    for a, b in PAIRS:
        d = paired_bootstrap(res[a], res[b])
        assert d is not None
        out["differences"][f"{a} - {b}"] = d
        print(f"{a} - {b}: {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
