"""SegTreeMem retrieval quality on the LoCoMo dev conversations: a construction x retrieval grid.

Each conversation is ingested online, in order, one message per ``add``, into one SegTreeMem per
construction setting (leaf text format, cosine threshold, extractive summary length), with the embedded
defaults (``LocalEmbedder``, ``llm=None``, extractive annotations). Each tree is built once; the retrieval
grid is evaluated on it from the per-node relevance vectors of every query:

* relevance: ``dense`` (max(cos, 0)), ``bm25`` (English stop words + Snowball stemming) and ``hybrid``
  with several fusions of the two (``max``: each divided by its maximum, as ``HierarchicalMemory.relevance``
  does; ``minmax``; ``z``: z-scores clipped at 0; ``rrf``: reciprocal-rank fusion, k = 60) and weights;
* policy: ``collapsed``, ``top_down``, ``bottom_up`` (Algorithm 2 with the library's
  ``propagation_matrix`` / ``propagate`` arithmetic), plus ``top_down_full``, a prototype in which a parent
  passes its whole mass to every child (binary, not column-normalised);
* alpha, horizon H, admissible set (``leaves`` or ``all``).

Metric: evidence recall@10, the share of a query's evidence turns (``dia_id``) among the 10 retrieved
turns, averaged over the 231 queries of categories 1-4 with resolvable evidence. With ``admissible=all``
only hits that cover a single turn (a leaf or a single-child chain node) count as retrieved turns; the span
recall (evidence covered by any retrieved node's span) is reported beside it. Flat baselines (dense, BM25,
stemmed BM25, reciprocal-rank fusions) are computed over the same leaf texts in the same run.

LoCoMo turn text is the turn's ``text`` with an image caption appended as `` [image: <caption>]``; with
the ``speaker`` leaf format (``"<speaker>: <text>"``) the flat baselines reproduce the reference figures
of ``shared/data/README.md`` (dense 0.456, BM25 0.511, stemmed BM25 0.580).

Usage: ``python benchmarks/segtree_quality.py [--out results.json] [--quick]``. The data is read from
``../shared/data/locomo/locomo_dev.json`` (relative to the repository root) or ``--data``.

Tree shapes: ``python benchmarks/segtree_quality.py --shapes [--branching 8,none] [--realmem PATH]``
builds the library's ``SegTreeMem`` on the embedded defaults (only ``branching`` varies) over the LoCoMo
dev conversations, the bundled RealMem excerpt and any ``--realmem`` persona file, each up to its last
query as ``hiermem eval`` does, and prints per tree: height, Algorithm 1's nodes and the stored nodes per
leaf, mean branching, the widest node, the compatibility decisions, texts embedded per insert and CPU
milliseconds per insert outside the embedder.

References:
    SegTreeMem paper (shared/seeds/segtreemem-paper.txt), Sec. 4.2-4.3, Appendix A Algorithms 1-2,
    Sec. 5.4 and Appendix D.3 (alpha / H sweeps); LoCoMo (Maharana et al., 2024).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import scipy.sparse as sp
import Stemmer

from shared_core import Message, SegTreeMem
from shared_core.models.base import Embedder
from shared_core.models.extractive import split_sentences
from shared_core.tree.propagation import propagation_matrix
from shared_core.types import Usage

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo_dev.json"
K = 10
RRF_K = 60
CATEGORIES = (1, 2, 3, 4)

LEAF_FORMATS: dict[str, str] = {
    "plain": "{text}",
    "speaker": "{speaker}: {text}",
    "speaker_date": "[{timestamp}] {speaker}: {text}",
}

# ---------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Query:
    """One LoCoMo question with its resolvable evidence turn ids."""

    question: str
    evidence: frozenset[str]
    category: int


@dataclass
class Conversation:
    """One LoCoMo conversation: messages in order and its evaluable queries."""

    sample_id: str
    messages: list[Message]
    queries: list[Query]
    skipped_evidence: int = 0


def _normalise_evidence(raw: Sequence[str]) -> list[str]:
    """Split and repair LoCoMo evidence ids (``"D8:6; D9:17"``, ``"D:11:26"``, ``"D30:05"``)."""
    out: list[str] = []
    for item in raw:
        for tok in re.split(r"[;,\s]+", str(item)):
            m = re.fullmatch(r"D:?(\d+):0*(\d+)", tok.strip())
            if m:
                out.append(f"D{int(m.group(1))}:{int(m.group(2))}")
    return out


def turn_text(turn: dict[str, Any]) -> str:
    """A LoCoMo turn's text, with its image caption (if any) appended as ``" [image: <caption>]"``."""
    text = str(turn["text"]).strip()
    caption = turn.get("blip_caption")
    return f"{text} [image: {caption}]" if caption else text


def load_conversations(path: Path) -> list[Conversation]:
    """Parse a LoCoMo-format file into conversations of messages and category 1-4 queries.

    Evidence ids are normalised; ids that name no turn are skipped (counted); a query left without
    evidence is dropped.
    """
    convs = []
    for item in json.loads(path.read_text(encoding="utf-8")):
        conv = item["conversation"]
        sessions = sorted(
            (k for k in conv if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1])
        )
        messages = [
            Message(turn_text(t), speaker=t["speaker"], timestamp=conv.get(f"{s}_date_time"), id=t["dia_id"])
            for s in sessions
            for t in conv[s]
        ]
        ids = {m.id for m in messages}
        queries, skipped = [], 0
        for qa in item["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            ev = _normalise_evidence(qa.get("evidence") or [])
            good = frozenset(e for e in ev if e in ids)
            skipped += len(set(ev) - good)
            if good:
                queries.append(Query(str(qa["question"]), good, int(qa["category"])))
        convs.append(Conversation(str(item["sample_id"]), messages, queries, skipped))
    return convs


# ---------------------------------------------------------------------------------------------- models


class CachedEmbedder:
    """Wraps an embedder with a text -> vector cache, so repeated texts are embedded once per run.

    ``cpu_seconds`` is the process CPU time spent in the wrapped embedder.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.cache: dict[str, np.ndarray] = {}
        self.cpu_seconds = 0.0

    @property
    def dim(self) -> int:
        return int(self.inner.dim)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
        if missing:
            c0 = time.process_time()
            self.cache.update(zip(missing, np.asarray(self.inner.embed(missing), dtype=np.float32)))
            self.cpu_seconds += time.process_time() - c0
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.cache[t] for t in texts])

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)

    def warm(self, texts: Sequence[str], batch: int = 256) -> None:
        """Embed ``texts`` ahead of time in large batches (fewer, cheaper model calls later)."""
        todo = list(dict.fromkeys(t for t in texts if t not in self.cache))
        for i in range(0, len(todo), batch):
            self.embed(todo[i : i + batch])


def leaf_text(message: Message, leaf_format: str) -> str:
    """The leaf text of a message under a format (``{text}``, ``{speaker}``, ``{timestamp}``, ``{role}``)."""
    return leaf_format.format(
        text=message.text,
        speaker=message.speaker or "",
        timestamp=message.timestamp or "",
        role=message.role or "",
    ).strip()


class FormattedSegTreeMem(SegTreeMem):
    """SegTreeMem whose leaf text is ``leaf_format`` filled from the message (prototype of an option).

    Placeholders: ``{text}``, ``{speaker}``, ``{timestamp}``, ``{role}``; a missing field becomes "".
    """

    def __init__(self, *args: Any, leaf_format: str = "{text}", **kwargs: Any) -> None:
        self.leaf_format = leaf_format
        super().__init__(*args, **kwargs)

    def _insert(self, message: Message, usage: Usage) -> dict[str, Any]:
        text = leaf_text(message, self.leaf_format)
        return super()._insert(dataclasses.replace(message, text=text), usage)


class StemmedBM25:
    """BM25 (bm25s, English stop words, Snowball stemming) over a fixed list of texts."""

    def __init__(self, texts: Sequence[str], stem: bool = True) -> None:
        self.stemmer = Stemmer.Stemmer("english") if stem else None
        self.stopwords = "en" if stem else None
        self.n = len(texts)
        self.model = bm25s.BM25()
        self.model.index(self._tok(list(texts)), show_progress=False)

    def _tok(self, texts: list[str]) -> Any:
        return bm25s.tokenize(texts, stopwords=self.stopwords, stemmer=self.stemmer, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every text, ``float32 (n,)``."""
        toks = bm25s.tokenize(
            [query], stopwords=self.stopwords, stemmer=self.stemmer, show_progress=False, return_ids=False
        )[0]
        if not toks:
            return np.zeros(self.n, dtype=np.float32)
        return np.asarray(self.model.get_scores(toks), dtype=np.float32)


# ---------------------------------------------------------------------------------------------- scoring


def _rank_score(x: np.ndarray) -> np.ndarray:
    """Reciprocal-rank score ``1 / (RRF_K + rank)`` (rank 1 = best; ties broken by position)."""
    order = np.argsort(-x, kind="stable")
    out = np.empty(len(x), dtype=np.float64)
    out[order] = 1.0 / (RRF_K + np.arange(1, len(x) + 1))
    return out


def fuse(dense: np.ndarray, bm: np.ndarray, fusion: str, w: float) -> np.ndarray:
    """Hybrid local relevance ``>= 0`` from dense ``max(cos, 0)`` and BM25 scores; ``w`` weighs dense."""
    d = dense.astype(np.float64)
    b = bm.astype(np.float64)
    if fusion == "max":  # HierarchicalMemory.relevance
        d = d / d.max() if d.max() > 0 else d
        b = b / b.max() if b.max() > 0 else b
        return w * d + (1 - w) * b
    if fusion == "minmax":
        d = (d - d.min()) / (np.ptp(d) or 1.0)
        b = (b - b.min()) / (np.ptp(b) or 1.0)
        return w * d + (1 - w) * b
    if fusion == "z":
        d = (d - d.mean()) / (d.std() or 1.0)
        b = (b - b.mean()) / (b.std() or 1.0)
        return np.maximum(w * d + (1 - w) * b, 0.0)
    if fusion == "rrf":
        return w * _rank_score(d) + (1 - w) * _rank_score(b)
    raise ValueError(f"unknown fusion {fusion!r}")


@dataclass
class TreeView:
    """A built tree seen as arrays in the memory's index row order."""

    ids: np.ndarray  # int64 (n,), node ids
    parent: np.ndarray  # int64 (n,), parent position or -1
    leaf: np.ndarray  # bool (n,)
    turn: np.ndarray  # int64 (n,), turn index for single-turn nodes, -1 otherwise
    span: np.ndarray  # int64 (n, 2), first/last turn index covered
    group: np.ndarray  # int64 (n,), equal for nodes with equal text (hits are deduplicated by text)
    texts: list[str]
    W: dict[str, sp.csr_matrix] = field(default_factory=dict)


def tree_view(mem: SegTreeMem, dia_ids: Sequence[str]) -> TreeView:
    """Arrays of the memory's tree, aligned with the rows of ``mem.relevance``."""
    ids, _ = mem.relevance("x", "dense")
    nodes = {n["id"]: n for n in mem.to_dict()["tree"]["nodes"]}
    pos = {int(i): j for j, i in enumerate(ids.tolist())}
    n = len(ids)
    parent = np.full(n, -1, dtype=np.int64)
    leaf = np.zeros(n, dtype=bool)
    span = np.zeros((n, 2), dtype=np.int64)
    texts = []
    for j, i in enumerate(ids.tolist()):
        nd = nodes[i]
        if nd["parent"] is not None:
            parent[j] = pos.get(nd["parent"], -1)
        leaf[j] = nd["is_leaf"]
        span[j] = nd["span"]
        texts.append(nd["text"])
    turn = np.where(span[:, 0] == span[:, 1], span[:, 0], -1)
    _, group = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    assert len(dia_ids) == int(leaf.sum())
    W = {p: propagation_matrix(parent, p) for p in ("top_down", "bottom_up")}
    W["top_down_full"] = W["bottom_up"].T.tocsr()  # parent -> every child with weight 1
    return TreeView(ids, parent, leaf, turn, span, group.astype(np.int64), texts, W)


@dataclass(frozen=True)
class RetrievalGrid:
    """The retrieval settings evaluated on every tree."""

    relevances: tuple[tuple[str, str, float], ...]  # (relevance, fusion, dense weight)
    policies: tuple[str, ...]
    alphas: tuple[float, ...]
    horizons: tuple[int, ...]
    admissible: tuple[str, ...]
    all_relevances: tuple[tuple[str, str, float], ...] = ()  # also scored with admissible="all"

    @classmethod
    def full(cls) -> RetrievalGrid:
        hyb = tuple(
            ("hybrid", f, w) for f in ("max", "minmax", "z", "rrf") for w in (0.3, 0.4, 0.5, 0.6, 0.7)
        )
        base = (("dense", "-", 1.0), ("bm25", "-", 0.0), ("hybrid", "max", 0.5))
        return cls(
            relevances=(*base[:2], *hyb),
            policies=("collapsed", "top_down", "bottom_up", "top_down_full"),
            alphas=(0.05, 0.1, 0.2, 0.3, 0.5, 0.7),
            horizons=(1, 2, 3),
            admissible=("leaves",),
            all_relevances=base,
        )

    @classmethod
    def quick(cls) -> RetrievalGrid:
        hyb = tuple(("hybrid", f, w) for f in ("max", "rrf") for w in (0.3, 0.5))
        return cls(
            relevances=(("dense", "-", 1.0), ("bm25", "-", 0.0), *hyb),
            policies=("collapsed", "top_down", "bottom_up"),
            alphas=(0.1, 0.5),
            horizons=(1, 2),
            admissible=("leaves",),
        )

    def settings(self, policy: str) -> list[tuple[float, int]]:
        """``(alpha, H)`` rows for a policy (``collapsed`` has the single row ``(0, 0)``)."""
        if policy == "collapsed":
            return [(0.0, 0)]
        return list(itertools.product(self.alphas, self.horizons))


def _top_turns(view: TreeView, s: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first K hits (best first, one per distinct text) among candidate positions ``cand``.

    Returns:
        ``(turn index of each hit or -1, positions of the hits)``.
    """
    want = min(len(cand), 3 * K + 8)
    sc = s[cand]
    top = cand[np.argpartition(-sc, want - 1)[:want]] if want < len(cand) else cand
    top = top[np.lexsort((view.ids[top], -s[top]))]
    _, first = np.unique(view.group[top], return_index=True)
    hits = top[np.sort(first)][:K]
    return view.turn[hits], hits


def evaluate_tree(
    view: TreeView,
    dense: list[np.ndarray],
    bm: list[np.ndarray],
    evidence: list[np.ndarray],
    grid: RetrievalGrid,
) -> dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]]:
    """Per-query evidence recall@K and span recall for every retrieval setting on one tree.

    Args:
        view: the tree.
        dense: per query, ``max(cos, 0)`` of every node, ``(n,)``.
        bm: per query, stemmed BM25 of every node, ``(n,)``.
        evidence: per query, the evidence turn indices.
        grid: the settings.

    Returns:
        ``{(relevance, fusion, w, policy, alpha, H, admissible): (recall (q,), span_recall (q,))}``.
    """
    leaves = np.nonzero(view.leaf)[0]
    every = np.arange(len(view.ids))
    nq = len(evidence)
    out: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
    for qi in range(nq):
        ev = evidence[qi]
        for rel, fusion, w in grid.relevances:
            if rel == "dense":
                r = dense[qi].astype(np.float64)
            elif rel == "bm25":
                r = bm[qi].astype(np.float64)
            else:
                r = fuse(dense[qi], bm[qi], fusion, w)
            tot = r.sum()
            s0 = r / tot if tot > 0 else np.full(len(r), 1.0 / len(r))
            for policy in grid.policies:
                hops = [s0]
                if policy != "collapsed":
                    for _ in range(max(grid.horizons)):
                        hops.append(view.W[policy] @ hops[-1])
                for alpha, H in grid.settings(policy):
                    coef = alpha ** np.arange(H + 1)
                    s = sum(c * h for c, h in zip(coef, hops)) / coef.sum()
                    adms = (
                        (*grid.admissible, "all")
                        if (rel, fusion, w) in grid.all_relevances
                        else grid.admissible
                    )
                    for adm in adms:
                        turns, hits = _top_turns(view, s, leaves if adm == "leaves" else every)
                        rec = np.isin(ev, turns).mean()
                        sp_ = view.span[hits]
                        covered = ((ev[:, None] >= sp_[None, :, 0]) & (ev[:, None] <= sp_[None, :, 1])).any(1)
                        key = (rel, fusion, w, policy, alpha, H, adm)
                        if key not in out:
                            out[key] = (np.zeros(nq), np.zeros(nq))
                        out[key][0][qi] = rec
                        out[key][1][qi] = covered.mean()
    return out


def check_against_library(
    mem: SegTreeMem, view: TreeView, conv: Conversation, bm: list[np.ndarray], n: int = 20
) -> dict[str, float]:
    """Compare this script's scoring with the library's on one tree (first ``n`` queries).

    Returns:
        ``bm25_max_abs_diff``: largest |script BM25 - ``mem.relevance(q, "bm25")``|;
        ``retrieve_agreement``: share of (query, setting) pairs whose top-K turn ids from
        ``mem.retrieve`` equal this script's, over ``collapsed`` / ``top_down`` / ``bottom_up`` with the
        library's hybrid relevance and leaves.
    """
    leaves = np.nonzero(view.leaf)[0]
    diff, agree, total = 0.0, 0, 0
    for qi, q in enumerate(conv.queries[:n]):
        ids, lib_bm = mem.relevance(q.question, "bm25")
        assert np.array_equal(ids, view.ids)
        diff = max(diff, float(np.abs(lib_bm - bm[qi]).max()))
        dense = mem.relevance(q.question, "dense")[1]
        r = fuse(dense, bm[qi], "max", 0.5)
        s0 = r / r.sum()
        for policy in ("collapsed", "top_down", "bottom_up"):
            H = 0 if policy == "collapsed" else 2
            s = s0.copy()
            hop = s0
            for k in range(1, H + 1):
                hop = view.W[policy] @ hop
                s = s + 0.1**k * hop
            mine = [conv.messages[t].id for t in _top_turns(view, s, leaves)[0]]
            hits = mem.retrieve(
                q.question, k=K, policy=policy, relevance="hybrid", hybrid_weight=0.5, admissible="leaves"
            )
            agree += int(mine == [h.source_ids[0] for h in hits])
            total += 1
    return {"bm25_max_abs_diff": diff, "retrieve_agreement": agree / max(total, 1)}


# ---------------------------------------------------------------------------------------------- baselines


def flat_baselines(
    leaf_texts: list[str], leaf_vecs: np.ndarray, qvecs: np.ndarray, queries: list[str], ev: list[np.ndarray]
) -> dict[str, np.ndarray]:
    """Per-query recall@K of flat retrieval over the leaf texts (the turns as the memory stores them)."""
    plain, stem = StemmedBM25(leaf_texts, stem=False), StemmedBM25(leaf_texts, stem=True)
    out: dict[str, list[float]] = {}
    for qi, q in enumerate(queries):
        sc = {"dense": leaf_vecs @ qvecs[qi], "bm25": plain.scores(q), "bm25_stemmed": stem.scores(q)}
        sc["rrf_dense_bm25"] = _rank_score(sc["dense"]) + _rank_score(sc["bm25"])
        sc["rrf_dense_bm25_stemmed"] = _rank_score(sc["dense"]) + _rank_score(sc["bm25_stemmed"])
        for w in (0.3, 0.5, 0.7):  # the memory's "max" fusion applied to flat turns
            dense = np.maximum(sc["dense"], 0.0)
            sc[f"hybrid_max_w{w}"] = fuse(dense, sc["bm25_stemmed"], "max", w)
        for name, s in sc.items():
            top = np.argsort(-s, kind="stable")[:K]
            out.setdefault(name, []).append(float(np.isin(ev[qi], top).mean()))
    return {k: np.asarray(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------- driver


@dataclass(frozen=True)
class Construction:
    """One construction setting."""

    leaf_format: str
    threshold: float
    summary_chars: int

    @property
    def name(self) -> str:
        return f"{self.leaf_format}/thr={self.threshold}/chars={self.summary_chars}"


def constructions(quick: bool) -> list[Construction]:
    """The construction settings: threshold sweep, then one-factor variations around the default."""
    if quick:
        return [Construction("speaker", 0.3, 600)]
    out = [Construction("speaker", t, 600) for t in (0.2, 0.3, 0.4)]
    out += [Construction("speaker", 0.3, 300), Construction("plain", 0.3, 600)]
    return out


def build(conv: Conversation, c: Construction, embedder: CachedEmbedder) -> tuple[SegTreeMem, float]:
    """Ingest a conversation online (one ``add`` per message) into a fresh memory; return it and seconds."""
    mem = FormattedSegTreeMem(
        embedder,
        None,
        threshold=c.threshold,
        summary_chars=c.summary_chars,
        leaf_format=LEAF_FORMATS[c.leaf_format],
    )
    texts = [leaf_text(m, mem.leaf_format) for m in conv.messages]
    embedder.warm(texts + [s for t in texts for s in split_sentences(t)])
    t0 = time.perf_counter()
    for m in conv.messages:
        mem.add(m)
    return mem, time.perf_counter() - t0


def _key_dict(key: tuple[Any, ...]) -> dict[str, Any]:
    rel, fusion, w, policy, alpha, H, adm = key
    return {
        "relevance": rel,
        "fusion": fusion,
        "hybrid_weight": w,
        "policy": policy,
        "alpha": alpha,
        "horizon": H,
        "admissible": adm,
    }


def run(data: Path, quick: bool) -> dict[str, Any]:
    """Build every tree, evaluate the grid, return plain results (see the module docstring)."""
    import torch

    from shared_core.models.local import LocalEmbedder

    torch.set_num_threads(1)  # the machine is shared: one thread avoids oversubscription
    convs = load_conversations(data)
    embedder = CachedEmbedder(LocalEmbedder())
    grid = RetrievalGrid.quick() if quick else RetrievalGrid.full()
    questions = [q.question for c in convs for q in c.queries]
    categories = np.asarray([q.category for c in convs for q in c.queries])
    embedder.warm(questions)
    results: dict[str, Any] = {
        "queries": len(questions),
        "skipped_evidence_ids": sum(c.skipped_evidence for c in convs),
        "constructions": [],
    }
    flat_done: set[str] = set()
    for c in constructions(quick):
        per_conv: list[dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]]] = []
        flat_parts: list[dict[str, np.ndarray]] = []
        tree_stats = {}
        for conv in convs:
            mem, secs = build(conv, c, embedder)
            turn_of = {m.id: i for i, m in enumerate(conv.messages)}
            ev = [np.asarray(sorted(turn_of[e] for e in q.evidence)) for q in conv.queries]
            view = tree_view(mem, [m.id or "" for m in conv.messages])
            qtexts = [q.question for q in conv.queries]
            dense = [mem.relevance(q, "dense")[1] for q in qtexts]
            lex = StemmedBM25(view.texts)
            bm = [lex.scores(q) for q in qtexts]
            per_conv.append(evaluate_tree(view, dense, bm, ev, grid))
            if "library_check" not in results:
                results["library_check"] = check_against_library(mem, view, conv, bm)
            st = mem.stats()
            tree_stats[conv.sample_id] = {
                "build_seconds": round(secs, 1),
                **{k: st[k] for k in ("nodes", "leaves", "height", "mean_branching", "chain_nodes")},
                "mean_depth": st["mean_depth"],
                "decisions": st["decisions"],
            }
            if c.leaf_format not in flat_done:
                order = np.argsort(view.turn[view.leaf])
                leaf_pos = np.nonzero(view.leaf)[0][order]
                leaf_texts = [view.texts[j] for j in leaf_pos]
                flat_parts.append(
                    flat_baselines(leaf_texts, embedder.embed(leaf_texts), embedder.embed(qtexts), qtexts, ev)
                )
            print(f"  built {c.name} {conv.sample_id}: {secs:.1f}s, {st['nodes']} nodes", flush=True)
        rows = []
        for key in per_conv[0]:
            rec = np.concatenate([p[key][0] for p in per_conv])
            span = np.concatenate([p[key][1] for p in per_conv])
            rows.append(
                {
                    **_key_dict(key),
                    "recall@10": float(rec.mean()),
                    "span_recall@10": float(span.mean()),
                    "by_category": {int(k): float(rec[categories == k].mean()) for k in CATEGORIES},
                }
            )
        entry: dict[str, Any] = {**dataclasses.asdict(c), "name": c.name, "trees": tree_stats, "grid": rows}
        if flat_parts:
            flat_done.add(c.leaf_format)
            entry["flat_baselines"] = {
                k: float(np.concatenate([p[k] for p in flat_parts]).mean()) for k in flat_parts[0]
            }
        results["constructions"].append(entry)
    return results


def best_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Best row per (policy, relevance, admissible) over all constructions."""
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in results["constructions"]:
        for r in c["grid"]:
            key = (r["policy"], r["relevance"], r["admissible"])
            if key not in best or r["recall@10"] > best[key]["recall@10"]:
                best[key] = {**r, "construction": c["name"]}
    return [best[k] for k in sorted(best)]


def print_tables(results: dict[str, Any]) -> None:
    """Print the flat baselines, the tree shapes and the best settings per policy x relevance."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    t = Table(title="Flat baselines over the same leaf texts (recall@10)")
    t.add_column("leaf format")
    names = sorted({k for c in results["constructions"] for k in c.get("flat_baselines", {})})
    for n in names:
        t.add_column(n)
    for c in results["constructions"]:
        if "flat_baselines" in c:
            t.add_row(c["leaf_format"], *(f"{c['flat_baselines'][n]:.3f}" for n in names))
    con.print(t)
    t = Table(title="Trees and best setting per construction")
    for col in (
        "construction",
        "nodes",
        "height",
        "branching",
        "decisions",
        "best recall@10",
        "best setting",
    ):
        t.add_column(col)
    for c in results["constructions"]:
        b = max(c["grid"], key=lambda r: r["recall@10"])
        trees = c["trees"].values()
        t.add_row(
            c["name"],
            "/".join(str(s["nodes"]) for s in trees),
            "/".join(str(s["height"]) for s in trees),
            "/".join(f"{s['mean_branching']:.2f}" for s in trees),
            "/".join(str(s["decisions"].get("none", 0)) for s in trees),
            f"{b['recall@10']:.3f}",
            _setting(b),
        )
    con.print(t)
    t = Table(title="Best per policy x relevance x admissible (over all constructions)")
    for col in ("policy", "relevance", "admissible", "recall@10", "span@10", "setting", "construction"):
        t.add_column(col)
    for r in best_rows(results):
        t.add_row(
            r["policy"],
            r["relevance"],
            r["admissible"],
            f"{r['recall@10']:.3f}",
            f"{r['span_recall@10']:.3f}",
            _setting(r),
            r["construction"],
        )
    con.print(t)


def _setting(r: dict[str, Any]) -> str:
    return (
        f"{r['relevance']}/{r['fusion']}/w={r['hybrid_weight']} {r['policy']} "
        f"a={r['alpha']} H={r['horizon']} {r['admissible']}"
    )


def _decision_kinds(decisions: dict[str, int]) -> dict[str, int]:
    """Decision counts by kind (``merge_3`` and ``merge_5`` are ``merge``, ``segment_3`` is ``segment``)."""
    out: dict[str, int] = {}
    for key, n in decisions.items():
        kind = key.split("_")[0]
        out[kind] = out.get(kind, 0) + n
    return out


def tree_shapes(
    locomo: Path | None, realmem: Sequence[Path], branchings: Sequence[int | None]
) -> list[dict[str, Any]]:
    """Shapes of the library's default ``SegTreeMem`` per conversation and ``branching`` value.

    Args:
        locomo: a LoCoMo-format file (its conversations are built), or ``None``.
        realmem: RealMem persona files; the bundled excerpt is always built.
        branchings: the ``branching`` values (``None``: the paper's rule).

    Returns:
        One row per (conversation, branching): ``height``, ``leaves``, ``tree_nodes_per_leaf``,
        ``stored_nodes_per_leaf``, ``mean_branching``, ``max_children``, ``decisions`` (by kind),
        ``embedded_texts_per_insert`` (the memory's embedding requests, the model cost of an insert)
        and ``cpu_ms_per_insert`` (process CPU of ``add`` less the time spent computing embeddings).

    References:
        SegTreeMem paper, Appendix C.1 Table 5 (the same shape statistics) and C.3.
    """
    import torch

    from shared_core.eval.data import load_locomo, load_realmem, load_realmem_excerpt
    from shared_core.models.local import LocalEmbedder

    torch.set_num_threads(1)
    convs = [("realmem_excerpt", load_realmem_excerpt())]
    convs += [(c.id, c) for c in (load_locomo(locomo) if locomo is not None else [])]
    convs += [(c.id, c) for c in (load_realmem(p) for p in realmem)]
    embedder = CachedEmbedder(LocalEmbedder())
    rows = []
    for name, conv in convs:
        end = max((q.position for q in conv.queries), default=len(conv.messages))
        for b in branchings:
            mem = SegTreeMem(embedder, None, branching=b)
            t0, e0 = time.process_time(), embedder.cpu_seconds
            for m in conv.messages[:end]:
                mem.add(m)
            cpu = time.process_time() - t0 - (embedder.cpu_seconds - e0)
            st = mem.stats()
            rows.append(
                {
                    "conversation": name,
                    "branching": b,
                    "leaves": st["leaves"],
                    "height": st["height"],
                    "tree_nodes_per_leaf": st["tree_nodes"] / st["leaves"],
                    "stored_nodes_per_leaf": st["nodes"] / st["leaves"],
                    "mean_branching": st["mean_branching"],
                    "max_children": max(len(n["children"]) for n in mem.to_dict()["tree"]["nodes"]),
                    "decisions": _decision_kinds(st["decisions"]),
                    "embedded_texts_per_insert": st["usage"]["embedded_texts"] / max(end, 1),
                    "cpu_ms_per_insert": cpu / max(end, 1) * 1e3,
                }
            )
            print(f"  built {name} branching={b}: height {st['height']}", flush=True)
    return rows


def print_shapes(rows: Sequence[dict[str, Any]]) -> None:
    """Print :func:`tree_shapes` rows as a table."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="SegTreeMem tree shapes (embedded defaults)")
    cols = ("conversation", "branching", "leaves", "height", "tree/leaf", "stored/leaf", "branching mean")
    for col in (*cols, "widest", "decisions", "embedded/insert", "CPU ms/insert"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["conversation"],
            str(r["branching"]),
            str(r["leaves"]),
            str(r["height"]),
            f"{r['tree_nodes_per_leaf']:.2f}",
            f"{r['stored_nodes_per_leaf']:.2f}",
            f"{r['mean_branching']:.2f}",
            str(r["max_children"]),
            " ".join(f"{k} {v}" for k, v in sorted(r["decisions"].items())),
            f"{r['embedded_texts_per_insert']:.2f}",
            f"{r['cpu_ms_per_insert']:.2f}",
        )
    Console(width=200).print(t)


def _branching_list(text: str) -> list[int | None]:
    return [None if v.strip().lower() == "none" else int(v) for v in text.split(",")]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry: run the grid (or the tree shapes), print the tables, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=DATA, help="LoCoMo-format JSON file")
    ap.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--quick", action="store_true", help="one construction setting and a small grid")
    ap.add_argument("--shapes", action="store_true", help="tree shapes instead of the retrieval grid")
    ap.add_argument(
        "--branching",
        type=_branching_list,
        default=[8, None],
        help="with --shapes: comma-separated branching values, 'none' for the paper's rule (default 8,none)",
    )
    ap.add_argument(
        "--realmem", type=Path, action="append", default=[], help="with --shapes: a RealMem persona file"
    )
    args = ap.parse_args(argv)
    if args.shapes:
        t0 = time.perf_counter()
        rows = tree_shapes(args.data if args.data.exists() else None, args.realmem, args.branching)
        print_shapes(rows)
        if args.out:
            doc = {"shapes": rows, "seconds": round(time.perf_counter() - t0, 1)}
            args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
            print(f"wrote {args.out}")
        return
    if not args.data.exists():
        raise SystemExit(f"LoCoMo data not found at {args.data}; pass --data PATH.")
    t0 = time.perf_counter()
    results = run(args.data, args.quick)
    results["seconds"] = round(time.perf_counter() - t0, 1)
    print_tables(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1), encoding="utf-8")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
