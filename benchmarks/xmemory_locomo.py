"""xMemory (LLM-free) against flat retrieval on the LoCoMo dev conversations, at equal token budgets.

For each conversation of ``../shared/data/locomo/locomo_dev.json`` (conv-26 and conv-30, loaded with
:func:`shared_core.eval.data.load_locomo`: categories 1-4, photo captions in the text) the turns are added
online, session by session (timestamp = the session's date), into an :class:`XMemory` built with the
embedded defaults (all-MiniLM-L6-v2, no LLM: rule boundaries, rule facts, extractive theme summaries,
proxy uncertainty, hybrid relevance); the open episode is flushed at the end. Every question is then
asked, k = 10, with the default ``top_down`` policy (message evidence), ``adaptive`` (the paper's two
stages) and ``representative`` (Stage I). Per query we record the evidence recall of the message hits
(:func:`shared_core.eval.metrics.evidence_recall`), the tokens of the returned text
(:func:`shared_core.memories.base.count_tokens`) and the answer-token recall
(:func:`shared_core.eval.metrics.answer_token_recall`: the share of the gold answer's content words,
lower-cased, stop words removed, present in the returned text).

Baselines: flat top-10 over the turns (``"speaker: text"``, same embedder) by dense cosine and by the
max-normalised dense + stemmed BM25 fusion (:class:`shared_core.eval.baselines.FlatFusion`, the
strongest flat baseline of ``../shared/data/README.md``); and flat dense retrieval given, per query, the
same token budget as each xMemory policy (turns in cosine order, skipping any that would exceed it), once
with each turn shown as ``[session date] speaker: text`` (dates visible, as they are inside xMemory's
episodes and facts) and once undated (the project's flat rendering). xMemory's message hits are shown
with their date too.

LoCoMo is CC BY-NC 4.0: it is read from ``../shared/data`` and never copied; without it the script exits
cleanly with a message.

Usage::

    python benchmarks/xmemory_locomo.py [--out results.json] [--set attach_threshold=0.5 ...]
        [--param coverage=0.9 ...] [--limit N]

References:
    xMemory Sec. 4-5 (LoCoMo, tokens per query; Sec. 5.2 answer content tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared_core.eval.baselines import FlatFusion  # noqa: E402
from shared_core.eval.metrics import answer_token_recall, evidence_recall  # noqa: E402
from shared_core.memories.base import count_tokens  # noqa: E402
from shared_core.memories.xmemory import XMemory  # noqa: E402
from shared_core.search.index import normalize_rows  # noqa: E402
from shared_core.types import Message  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def load_conversations(path: Path) -> list[Any]:
    """The LoCoMo conversations (categories 1-4) as :class:`shared_core.eval.data.Conversation`."""
    from shared_core.eval.data import load_locomo

    return list(load_locomo(path))


def dated(text: str, timestamp: str | None) -> str:
    """``[session date] text``: a turn as a reader sees it when dates are shown."""
    return f"[{timestamp}] {text}" if timestamp else text


def render_hit(h: Any) -> str:
    """A hit's text as the reader sees it; a message hit gets its session date like a dated flat turn."""
    if h.metadata.get("level") == "message":
        return dated(h.text, h.metadata.get("timestamp"))
    return h.text


def fill(order: np.ndarray, tokens: list[int], budget: int) -> list[int]:
    """Turns in ``order``, skipping any that would take the total over ``budget`` tokens."""
    used, chosen = 0, []
    for i in order:
        if used + tokens[i] <= budget:
            chosen.append(int(i))
            used += tokens[i]
    return chosen


def _coerce(v: str) -> Any:
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def _kv(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for p in pairs:
        k, _, v = p.partition("=")
        out[k.strip()] = _coerce(v.strip())
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from shared_core.models.local import LocalEmbedder

    convs = load_conversations(DATA)
    embedder = LocalEmbedder()
    ctor = _kv(args.set)
    params = _kv(args.param)
    variants = [json.loads(v) for v in args.variant]
    levels: dict[str, dict[str, list[int]]] = {}
    rows: dict[str, list[float]] = {}
    toks: dict[str, list[int]] = {}
    evid: dict[str, list[float]] = {}
    per_cat: dict[str, dict[int, list[float]]] = {}
    structure = []

    def record(name: str, cat: int, rec: float, n_tok: int, ev: float | None = None) -> None:
        rows.setdefault(name, []).append(rec)
        toks.setdefault(name, []).append(n_tok)
        per_cat.setdefault(name, {}).setdefault(cat, []).append(rec)
        if ev is not None:
            evid.setdefault(name, []).append(ev)

    for conv in convs:
        msgs = conv.messages
        qa = conv.queries[: args.limit] if args.limit else conv.queries
        mem = XMemory(embedder=embedder, **ctor)
        t0 = time.perf_counter()
        by_session: dict[Any, list[Message]] = {}
        for m in msgs:
            by_session.setdefault(m.metadata.get("session"), []).append(m)
        for batch in by_session.values():
            mem.add(batch)
        mem.flush()
        build = time.perf_counter() - t0
        fusion = FlatFusion(embedder)
        fusion.add(msgs)
        st = mem.stats()
        structure.append(
            {
                "conversation": conv.id,
                "messages": len(msgs),
                "build_seconds": round(build, 1),
                "episodes": st["episodes"],
                "mean_episode_messages": round(st["mean_episode_messages"], 2),
                "semantics": st["semantics"],
                "themes": st["themes"],
                "mean_theme_size": round(st["mean_theme_size"], 2),
                "max_theme_size": st["max_theme_size"],
                "reassignment_ratio": round(st["reassignment_ratio"], 4),
                "splits": st["counts"].get("theme_splits", 0),
                "merges": st["counts"].get("theme_merges", 0),
                "objective": st["objective"],
                "boundaries": {k[9:]: v for k, v in st["counts"].items() if k.startswith("boundary_")},
                "embed_calls": st["usage"]["embed_calls"],
            }
        )
        plain = [m.render() for m in msgs]  # "speaker: text", the project's flat rendering
        with_date = [dated(t, m.timestamp) for t, m in zip(plain, msgs)]
        tok_plain = [count_tokens(t) for t in plain]
        tok_date = [count_tokens(t) for t in with_date]
        turn_vecs = normalize_rows(embedder.embed(plain))
        q_vecs = normalize_rows(embedder.embed([q.question for q in qa]))
        t1 = time.perf_counter()
        for q, qv in zip(qa, q_vecs):
            cat = q.category
            order = np.argsort(-(turn_vecs @ qv), kind="stable")
            top = [int(i) for i in order[:10]]
            record(
                "flat dense top-10",
                cat,
                answer_token_recall(q.answer, [plain[i] for i in top]),
                sum(tok_plain[i] for i in top),
                evidence_recall([msgs[i].id for i in top], q.evidence),
            )
            fused = fusion.retrieve(q.question, k=10)
            record(
                "flat fusion top-10",
                cat,
                answer_token_recall(q.answer, [h.text for h in fused]),
                count_tokens([h.text for h in fused]),
                evidence_recall([s for h in fused for s in h.source_ids], q.evidence),
            )
            runs = [(p, "", params) for p in ("top_down", "adaptive", "representative")]
            runs += [("adaptive", f" {json.dumps(v, sort_keys=True)}", {**params, **v}) for v in variants]
            for policy, tag, kw in runs:
                hits = mem.retrieve(q.question, k=10, policy=policy, **kw)
                shown = [render_hit(h) for h in hits]
                n_tok = count_tokens(shown)
                ev = evidence_recall([s for h in hits if h.is_leaf for s in h.source_ids], q.evidence)
                record(f"xMemory {policy}{tag}", cat, answer_token_recall(q.answer, shown), n_tok, ev)
                for h in hits:
                    levels.setdefault(f"{policy}{tag}", {}).setdefault(h.metadata["level"], []).append(
                        count_tokens(render_hit(h))
                    )
                if tag:
                    continue
                for name, texts, toks_ in (("dated", with_date, tok_date), ("undated", plain, tok_plain)):
                    chosen = fill(order, toks_, n_tok)
                    record(
                        f"flat dense, {name} turns @ {policy} budget",
                        cat,
                        answer_token_recall(q.answer, [texts[i] for i in chosen]),
                        sum(toks_[i] for i in chosen),
                    )
        structure[-1]["query_seconds"] = round(time.perf_counter() - t1, 1)
    table = {
        name: {
            "answer_token_recall": round(statistics.fmean(v), 4),
            "evidence_recall": round(statistics.fmean(evid[name]), 4) if name in evid else None,
            "tokens_per_query": round(statistics.fmean(toks[name]), 1),
            "queries": len(v),
            "by_category": {c: round(statistics.fmean(x), 4) for c, x in sorted(per_cat[name].items())},
        }
        for name, v in rows.items()
    }
    n_queries = len(next(iter(rows.values()))) if rows else 0
    composition = {
        run: {
            lv: {
                "hits_per_query": round(len(t) / max(n_queries, 1), 2),
                "tokens": round(sum(t) / max(n_queries, 1), 1),
            }
            for lv, t in sorted(by.items())
        }
        for run, by in levels.items()
    }
    return {
        "config": ctor,
        "params": params,
        "structure": structure,
        "results": table,
        "composition": composition,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--set", nargs="*", default=[], help="XMemory constructor overrides, key=value")
    ap.add_argument("--param", nargs="*", default=[], help="retrieval parameter overrides, key=value")
    ap.add_argument(
        "--variant",
        nargs="*",
        default=[],
        help="extra adaptive runs on the same memories, JSON, e.g. '{\"coverage\": 0.8}'",
    )
    ap.add_argument("--limit", type=int, default=0, help="at most this many questions per conversation")
    args = ap.parse_args()
    if not DATA.is_file():
        print(f"LoCoMo dev data not found ({DATA.name} under ../shared/data/locomo); nothing to do.")
        return 0
    res = run(args)
    print(json.dumps(res["structure"], indent=1))
    print(json.dumps(res["composition"], indent=1))
    print(
        "\n| method | evidence recall@10 (message hits) | answer-token recall | tokens/query | by category "
        "(1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop) |"
    )
    print("|---|---|---|---|---|")
    for name, r in res["results"].items():
        cats = ", ".join(f"{c}: {v:.3f}" for c, v in r["by_category"].items())
        ev = "" if r["evidence_recall"] is None else f"{r['evidence_recall']:.3f}"
        print(f"| {name} | {ev} | {r['answer_token_recall']:.3f} | {r['tokens_per_query']:.0f} | {cats} |")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
