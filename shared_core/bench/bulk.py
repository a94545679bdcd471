"""``hiermem bench --ingest --bulk``: the CPU of ONE ``add`` of many messages over embedding them once.

Workloads: the haystack of the first question of a LongMemEval_S file (its sessions in date order, about
500 turns, long assistant turns) and the first ``turns`` turns of LoCoMo files, their conversations one
after another (2,000 by default: as many as the files hold when they hold fewer). Each memory is built
with its default constructor on the embedded :class:`~shared_core.models.local.LocalEmbedder` (no LLM)
and gets every message of a workload in one ``add``; the baseline is one ``embedder.embed`` of the
same messages' rendered texts (``Message.render()``), with the same embedder, in the same process, just
before each memory's run. One torch thread; process CPU time (``time.process_time``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..types import InvalidInputError, Message

__all__ = ["BULK_SCHEMA", "bulk_datasets", "bulk_ingest_workload"]

BULK_SCHEMA = "hiermem.bench_bulk/1"

Progress = Callable[[str, int, int], None]


def bulk_datasets(
    longmemeval: str | Path | None, locomo: Sequence[str | Path], turns: int
) -> list[tuple[str, list[Message]]]:
    """The workloads: ``(name, messages)`` for the first question's haystack of ``longmemeval`` and the
    first ``turns`` turns of the ``locomo`` files (conversations in file order).

    Raises:
        InvalidInputError: ``turns`` < 1, no input, an unreadable file.
    """
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise InvalidInputError(f"turns must be a positive integer, got {turns!r}.")
    from ..eval.data import load_locomo
    from ..eval.longmemeval import load_longmemeval

    out: list[tuple[str, list[Message]]] = []
    if longmemeval is not None:
        q = load_longmemeval(longmemeval, limit=None)
        if not q:
            raise InvalidInputError(f"{longmemeval} holds no question.")
        out.append((f"longmemeval {q[0].id}", list(q[0].messages)))
    if locomo:
        msgs = [m for f in locomo for c in load_locomo(f) for m in c.messages][:turns]
        if not msgs:
            raise InvalidInputError(f"{', '.join(map(str, locomo))} hold no turn.")
        out.append((f"locomo {len(msgs)} turns", msgs))
    if not out:
        raise InvalidInputError("Give a LongMemEval file and/or LoCoMo files for the bulk ingest workload.")
    return out


def bulk_ingest_workload(
    memories: Sequence[str] | None = None,
    *,
    longmemeval: str | Path | None = None,
    locomo: Sequence[str | Path] = (),
    turns: int = 2_000,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """CPU of one ``add(messages)`` per memory over one ``embedder.embed(rendered texts)`` (see the module).

    Args:
        memories: kinds, default every available one.
        longmemeval: a LongMemEval_S file (its first question's haystack is the workload), or ``None``.
        locomo: LoCoMo files whose first ``turns`` turns are the other workload (may be empty).
        turns: LoCoMo turns, default 2,000.
        progress: ``progress(label, done, total)``, in runs of the workload.

    Returns:
        ``{"schema", "settings", "datasets": {name: {"messages", "chars", "distinct_texts", "results":
        {kind: {"cpu_s", "embed_cpu_s", "ratio", "embedded_texts", "embed_calls", "nodes",
        "leaves"}}}}}`` with ``ratio = cpu_s / embed_cpu_s``.

    Raises:
        InvalidInputError: an unknown memory, no input, ``turns`` < 1.
    """
    from .workloads import _kinds, _memory_classes

    kinds = _kinds(memories)
    data = bulk_datasets(longmemeval, locomo, turns)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from ..models.local import LocalEmbedder

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        emb = LocalEmbedder()
        emb.embed(["warm-up"])
        classes = _memory_classes()
        say = progress or (lambda label, done, total: None)
        settings = {"memories": kinds, "embedder": emb.name, "torch_threads": torch.get_num_threads()}
        settings["add"] = "one add of every message of the workload (default constructor, no LLM)"
        settings["baseline"] = "one embed(rendered texts), same embedder, just before each memory's run"
        doc: dict[str, Any] = {"schema": BULK_SCHEMA, "settings": settings, "datasets": {}}
        for name, msgs in data:
            texts = [m.render() for m in msgs]
            ds: dict[str, Any] = {"messages": len(msgs), "chars": sum(map(len, texts))}
            ds["distinct_texts"] = len(set(texts))
            ds["results"] = {}
            doc["datasets"][name] = ds
            for i, kind in enumerate(kinds):
                say(f"bulk ingest {name}", i, len(kinds))
                cls = classes[kind]
                cls(embedder=emb).add(msgs[:3], allow_duplicate_ids=True)  # warm-up, untimed
                c0 = time.process_time()
                emb.embed(texts)
                base = time.process_time() - c0
                mem = cls(embedder=emb)
                c0 = time.process_time()
                report = mem.add(msgs, allow_duplicate_ids=True)
                cpu = time.process_time() - c0
                ds["results"][kind] = {
                    "cpu_s": cpu,
                    "embed_cpu_s": base,
                    "ratio": cpu / base if base > 0 else None,
                    "embedded_texts": report.usage.embedded_texts,
                    "embed_calls": report.usage.embed_calls,
                    "nodes": len(mem._store),
                    "leaves": len(mem),
                }
                say(f"bulk ingest {name}", i + 1, len(kinds))
        return doc
    finally:
        torch.set_num_threads(threads)


def bulk_markdown(doc: dict[str, Any]) -> str:
    """The document as a Markdown table: one row per memory, the ratio (and texts embedded) per workload."""
    names = list(doc["datasets"])
    kinds = list(dict.fromkeys(k for ds in doc["datasets"].values() for k in ds["results"]))
    head = (
        "| memory | " + " | ".join(f"{n} ({doc['datasets'][n]['messages']} messages)" for n in names) + " |"
    )
    lines = [
        "CPU of one `add(messages)` over one `embed(rendered texts)` (x), texts embedded by the add",
        "",
        head,
        "|---|" + "---:|" * len(names),
    ]
    for k in kinds:
        cells = []
        for n in names:
            r = doc["datasets"][n]["results"].get(k)
            cells.append(
                "—" if r is None or r["ratio"] is None else f"{r['ratio']:.2f}x ({r['embedded_texts']})"
            )
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_bulk(
    memories: Sequence[str] | None,
    data: str | Path,
    turns: int,
    out: str | Path,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """:func:`bulk_ingest_workload` on the data root ``data`` (``longmemeval/longmemeval_s_dev.json``,
    ``locomo/locomo_dev.json`` and ``locomo/locomo_validate.json``, those present), written to
    ``out/bulk.json`` and ``out/bulk.md``.

    Raises:
        InvalidInputError: none of those files is present; as :func:`bulk_ingest_workload`.
    """
    import json

    root = Path(data)
    lme = root / "longmemeval" / "longmemeval_s_dev.json"
    locomo = [
        p
        for p in (root / "locomo" / "locomo_dev.json", root / "locomo" / "locomo_validate.json")
        if p.exists()
    ]
    if not lme.exists() and not locomo:
        raise InvalidInputError(f"No LongMemEval_S or LoCoMo file under {root} (longmemeval/, locomo/).")
    doc = bulk_ingest_workload(
        memories, longmemeval=lme if lme.exists() else None, locomo=locomo, turns=turns, progress=progress
    )
    doc["settings"]["files"] = [str(p.relative_to(root)) for p in ([lme] if lme.exists() else []) + locomo]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bulk.json").write_text(json.dumps(doc, indent=2))
    (out / "bulk.md").write_text(bulk_markdown(doc))
    return doc
