"""Where SegTreeMem's corpus share comes from: its dense and BM25 parts swapped one at a time with flat ones.

The corpus share of ``hiermem eval`` is ``segtree:collapsed`` (every message leaf ranked by the memory's
``hybrid`` relevance) minus flat ``fusion`` (the same formula over single messages). The two differ in
three places: the dense scores (the same embedder over the same rendered messages), the BM25 scores (the
memory's lexical index holds its summaries too, so document frequencies and the average length are taken
over every node) and the maxima the two parts are divided by (over every node against over the
messages). This script builds one SegTreeMem and one flat ``FlatFusion`` per LoCoMo conversation (every
message added, the questions asked after it, as ``hiermem eval`` asks LoCoMo's) and ranks the messages
by each combination, evidence recall@10 over distinct texts:

* ``tree_hybrid``: the memory's dense and BM25 leaf scores, divided by their maxima over every node
  (what ``segtree:collapsed`` ranks by);
* ``flat_fusion``: the flat dense and BM25 scores (``fusion``);
* ``flat_dense+tree_bm25`` / ``tree_dense+flat_bm25``: one part of each, both divided by their maxima
  over the messages.

Usage::

    python benchmarks/corpus_share.py --locomo ../shared/data/locomo/locomo_dev.json

Prints each ranking's recall and paired bootstrap 95% intervals of the differences (10,000 resamples of
the questions, seed 0).
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", required=True, help="LoCoMo JSON file (e.g. locomo_dev.json)")
    ap.add_argument("--k", type=int, default=10, help="hits per question (default 10)")
    ap.add_argument("--weight", type=float, default=0.5, help="dense weight w of hybrid (default 0.5)")
    args = ap.parse_args()

    from shared_core.eval.baselines import FlatFusion
    from shared_core.eval.data import load_locomo
    from shared_core.eval.metrics import evidence_recall
    from shared_core.eval.protocol import paired_bootstrap
    from shared_core.eval.runner import CachingEmbedder
    from shared_core.memories.segtree import SegTreeMem
    from shared_core.models.local import LocalEmbedder
    from shared_core.search.relevance import fuse

    emb = CachingEmbedder(LocalEmbedder())
    names = ("tree_hybrid", "flat_fusion", "flat_dense+tree_bm25", "tree_dense+flat_bm25")
    res: dict[str, list[float]] = {n: [] for n in names}
    w = args.weight
    for conv in load_locomo(args.locomo):
        mem = SegTreeMem(emb)
        mem.add(conv.messages)
        flat = FlatFusion(emb)
        flat.add(conv.messages)
        n = len(conv.messages)
        texts = [m.render() for m in conv.messages]

        def recall(scores: np.ndarray, evidence: list[str], conv=conv, texts=texts, n=n) -> float:
            seen: set[str] = set()
            got: list[str] = []
            for j in np.lexsort((np.arange(n), -scores)):  # ties by insertion order, as the baselines
                if texts[j] in seen:
                    continue
                seen.add(texts[j])
                got.append(str(conv.messages[j].id))
                if len(got) == args.k:
                    break
            return evidence_recall(got, evidence)

        for q in conv.queries:
            if not q.evidence:
                continue
            ids, dense = mem.relevance(q.question, "dense")
            _, bm = mem.relevance(q.question, "bm25")
            leaf = mem._leaf_mask(ids)
            tree_d = np.zeros(n, np.float32)
            tree_b = np.zeros(n, np.float32)
            for nid, dv, bv in zip(ids[leaf], dense[leaf], bm[leaf]):
                pos = mem._store.nodes[int(nid)].span[0]
                tree_d[pos], tree_b[pos] = dv, bv
            flat_d = np.zeros(n, np.float32)
            order, cos = flat.dense.ranking(q.question)
            flat_d[order] = np.maximum(cos, 0.0)
            flat_b = np.zeros(n, np.float32)
            bids, bsc = flat.bm25.index.scores(q.question)
            flat_b[bids] = bsc
            maxima = (float(dense.max()), float(bm.max()))
            res["tree_hybrid"].append(recall(fuse(tree_d, tree_b, w, maxima=maxima), q.evidence))
            res["flat_fusion"].append(recall(fuse(flat_d, flat_b, w), q.evidence))
            res["flat_dense+tree_bm25"].append(recall(fuse(flat_d, tree_b, w), q.evidence))
            res["tree_dense+flat_bm25"].append(recall(fuse(tree_d, flat_b, w), q.evidence))
    for name in names:
        print(f"{name:22s} evidence recall@{args.k} {np.mean(res[name]):.4f} ({len(res[name])} questions)")
    for a, b in (
        ("tree_hybrid", "flat_fusion"),
        ("flat_dense+tree_bm25", "flat_fusion"),
        ("tree_hybrid", "flat_dense+tree_bm25"),
        ("tree_dense+flat_bm25", "flat_fusion"),
    ):
        r = paired_bootstrap(res[a], res[b])
        assert r is not None
        print(f"{a} - {b}: {r['mean']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}]")


if __name__ == "__main__":
    main()
