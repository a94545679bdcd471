"""The evaluation protocol of ``hiermem eval``: named data splits, per-query rows, paired bootstrap.

* Splits (:data:`SPLITS`, :func:`resolve_split`): ``dev`` (the data defaults are chosen and tuned on)
  and ``validate`` (the data a choice made on dev is confirmed on), as file paths relative to a data
  root (:func:`default_data_root`: ``$HIERMEM_DATA``, else ``../shared/data`` from the current
  directory). A split whose files are missing raises :class:`SplitDataMissingError`.
* Per-query rows (:func:`query_rows`, :func:`write_query_rows`): one JSON line per question and method
  with the conversation, question id, category, the recall figures and the returned tokens
  (``queries.jsonl`` next to ``results.json``).
* Paired bootstrap (:func:`paired_bootstrap`, :func:`paired_values`): a percentile interval of the mean
  of a per-question difference between two methods asked the same questions. The resampled unit is the
  *question*, not the conversation: a split holds 3-4 conversations, too few clusters for a cluster
  bootstrap. Default :data:`BOOTSTRAP_RESAMPLES` = 10,000 resamples with seed :data:`BOOTSTRAP_SEED` = 0.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..types import InvalidInputError
from .longmemeval import LME_METRICS

__all__ = [
    "BOOTSTRAP_LEVEL",
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "DEV_FUSION_WEIGHT",
    "QUERY_ROW_FIELDS",
    "QUERY_ROWS_JSONL",
    "SPLITS",
    "SplitDataMissingError",
    "default_data_root",
    "paired_bootstrap",
    "paired_values",
    "query_rows",
    "resolve_split",
    "write_query_rows",
]

SPLITS: dict[str, dict[str, tuple[str, ...]]] = {
    "dev": {
        "locomo": ("locomo/locomo_dev.json",),
        "realmem": ("realmem/Kenta_Tanaka_dialogues_256k.json",),
        "longmemeval": ("longmemeval/longmemeval_s_dev.json",),
    },
    "validate": {
        "locomo": ("locomo/locomo_validate.json",),
        "realmem": (
            "realmem/Pak_Budi_dialogues_256k.json",
            "realmem/Oliver_Smith_dialogues_256k.json",
        ),
        "longmemeval": ("longmemeval/longmemeval_s_validate.json",),
    },
}
"""The named splits: per input kind, file paths relative to the data root. ``dev``: LoCoMo conv-26 and
conv-30, RealMem Kenta_Tanaka, LongMemEval_S dev (74 questions); ``validate``: LoCoMo conv-49 and conv-50,
RealMem Pak_Budi and Oliver_Smith, LongMemEval_S validate (74 questions)."""

DEV_FUSION_WEIGHT = 0.4
"""The flat ``fusion`` weight chosen on dev (the dense weight ``w`` of
:func:`~shared_core.search.relevance.fuse`; the best pooled evidence recall@10 of the dev sweep
0.2-0.8, see docs/evaluation.md). On ``validate`` the flat fusion that counts as a baseline is held at
it, as every memory parameter is held at its dev choice."""

DATA_ENV = "HIERMEM_DATA"
"""Environment variable naming the data root (used when no root is passed)."""

DEFAULT_DATA_ROOT = Path("..") / "shared" / "data"
"""The data root when neither a root nor :data:`DATA_ENV` is given, relative to the current directory."""

BOOTSTRAP_RESAMPLES = 10_000
"""Bootstrap resamples per interval."""

BOOTSTRAP_SEED = 0
"""Seed of :func:`numpy.random.default_rng` for every interval (each interval starts from it afresh)."""

BOOTSTRAP_LEVEL = 0.95
"""Coverage of the percentile intervals."""

QUERY_ROWS_JSONL = "queries.jsonl"
"""File name of the per-query rows in the output directory."""

QUERY_ROW_FIELDS = (
    "evidence_recall",
    "span_recall",
    "subtree_recall",
    "answer_token_recall",
    "returned_tokens",
    "n_hits",
    "llm_accuracy",
    "rouge_l_recall",
    *LME_METRICS,
    "abstention",
)
"""Per-query figures copied into each JSON line (those a row holds; the LongMemEval ones, as
:data:`~shared_core.eval.longmemeval.LME_METRICS`, and its abstention flag, on LongMemEval rows)."""


class SplitDataMissingError(InvalidInputError):
    """A named split's files are not under the data root."""


def default_data_root() -> Path:
    """The data root: ``$HIERMEM_DATA`` when set and non-empty, else :data:`DEFAULT_DATA_ROOT`
    (``../shared/data``, relative to the current directory)."""
    env = os.environ.get(DATA_ENV, "").strip()
    return Path(env) if env else DEFAULT_DATA_ROOT


def resolve_split(
    split: str, data_root: str | Path | None = None, kinds: Sequence[str] | None = None
) -> dict[str, list[Path]]:
    """The files of a named split under a data root.

    Args:
        split: ``"dev"`` or ``"validate"`` (:data:`SPLITS`).
        data_root: the directory holding ``locomo/``, ``realmem/`` and ``longmemeval/``, default
            :func:`default_data_root`.
        kinds: only these input kinds (e.g. ``("locomo",)``), default every kind of the split.

    Returns:
        ``{"locomo": [paths], "realmem": [paths], "longmemeval": [paths]}`` (the kinds asked for), each
        path ``data_root / relative path``.

    Raises:
        InvalidInputError: an unknown split name or kind.
        SplitDataMissingError: one or more of the split's files is not a file under ``data_root``
            (the message lists them and how to point at the data).
    """
    if split not in SPLITS:
        raise InvalidInputError(f"Unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    wanted = dict(SPLITS[split])
    if kinds is not None:
        unknown = [k for k in kinds if k not in wanted]
        if unknown:
            raise InvalidInputError(f"Unknown input kind(s) {unknown}; choose among {', '.join(wanted)}.")
        wanted = {k: wanted[k] for k in kinds}
    root = Path(data_root) if data_root is not None else default_data_root()
    out = {kind: [root / rel for rel in rels] for kind, rels in wanted.items()}
    missing = [rel for rels in wanted.values() for rel in rels if not (root / rel).is_file()]
    if missing:
        raise SplitDataMissingError(
            f"Split {split!r}: missing {', '.join(missing)} under the data root {root}; pass --data DIR "
            f"(or set {DATA_ENV}) to the directory holding locomo/, realmem/ and longmemeval/, or give the "
            "files with --locomo / --realmem / --longmemeval."
        )
    return out


def _finite(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))


def query_rows(conv_results: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    """One plain row per question and method of per-conversation results.

    Args:
        conv_results: outputs of :func:`~shared_core.eval.runner.evaluate_conversation`.

    Yields:
        ``{"dataset", "conversation", "query_id", "category", "method", <QUERY_ROW_FIELDS present>}``,
        conversations in order, then methods, then questions by position.
    """
    for c in conv_results:
        for name, m in c.get("methods", {}).items():
            for r in m.get("queries", []):
                row = {
                    "dataset": r.get("dataset", c.get("dataset")),
                    "conversation": r.get("conversation", c.get("conversation")),
                    "query_id": r.get("query_id"),
                    "category": r.get("category"),
                    "method": name,
                }
                row.update({f: r[f] for f in QUERY_ROW_FIELDS if f in r})
                yield row


def write_query_rows(conv_results: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write :func:`query_rows` as JSON Lines (NaN written as ``null``).

    Args:
        conv_results: outputs of :func:`~shared_core.eval.runner.evaluate_conversation`.
        path: the file to write (its parent is created).

    Returns:
        The path written.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in query_rows(conv_results):
            clean = {k: (v if not isinstance(v, float) or _finite(v) else None) for k, v in row.items()}
            f.write(json.dumps(clean) + "\n")
    tmp.replace(p)
    return p


def _key(r: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return (r.get("dataset"), r.get("conversation"), r.get("query_id"))


def paired_values(
    a_rows: Sequence[Mapping[str, Any]],
    b_rows: Sequence[Mapping[str, Any]],
    metric: str,
    dataset: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The values of ``metric`` for the questions both methods answered with a defined value.

    Questions are matched by ``(dataset, conversation, query_id)``; a question whose value is missing
    or NaN on either side is left out.

    Args:
        a_rows, b_rows: per-query rows of two methods (as in ``evaluate_conversation``'s ``queries``).
        metric: the row field compared.
        dataset: keep only rows of this dataset label, default all.

    Returns:
        ``(a, b)``: float arrays of equal length, in ``a_rows`` order.
    """
    b_by = {_key(r): r.get(metric) for r in b_rows if dataset is None or r.get("dataset") == dataset}
    a_out, b_out = [], []
    for r in a_rows:
        if dataset is not None and r.get("dataset") != dataset:
            continue
        va, vb = r.get(metric), b_by.get(_key(r))
        if _finite(va) and _finite(vb):
            a_out.append(float(va))
            b_out.append(float(vb))
    return np.asarray(a_out, dtype=float), np.asarray(b_out, dtype=float)


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = BOOTSTRAP_LEVEL,
) -> dict[str, Any] | None:
    """Percentile bootstrap interval of ``mean(a - b)`` over paired questions.

    With ``d = a - b`` (``n`` questions), ``rng = numpy.random.default_rng(seed)`` draws
    ``idx = rng.integers(0, n, size=(n_resamples, n))`` (questions resampled with replacement, the
    pairs kept together); the interval is ``numpy.percentile(d[idx].mean(axis=1), [100 (1 - level) / 2,
    100 (1 + level) / 2])`` (linear interpolation).

    Args:
        a, b: paired per-question values (same length), e.g. from :func:`paired_values`.
        n_resamples: resamples, default :data:`BOOTSTRAP_RESAMPLES` (10,000).
        seed: seed, default :data:`BOOTSTRAP_SEED` (0).
        level: coverage in ``(0, 1)``, default :data:`BOOTSTRAP_LEVEL` (0.95).

    Returns:
        ``{"mean", "low", "high", "n"}``, or ``None`` when there is no pair.

    Raises:
        InvalidInputError: ``a`` and ``b`` of different lengths, ``n_resamples < 1`` or ``level``
            outside ``(0, 1)``.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise InvalidInputError(
            f"paired samples must be two 1-d arrays of one length, got {x.shape}, {y.shape}."
        )
    if isinstance(n_resamples, bool) or int(n_resamples) < 1:
        raise InvalidInputError(f"n_resamples must be a positive integer, got {n_resamples!r}.")
    if not 0.0 < float(level) < 1.0:
        raise InvalidInputError(f"level must be in (0, 1), got {level!r}.")
    n = len(x)
    if n == 0:
        return None
    d = x - y
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(int(n_resamples), n))
    means = d[idx].mean(axis=1)
    tail = 100.0 * (1.0 - float(level)) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return {"mean": float(d.mean()), "low": float(low), "high": float(high), "n": n}
