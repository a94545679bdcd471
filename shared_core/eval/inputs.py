"""The inputs of ``hiermem eval``: :class:`Dataset` (the conversations read from one file) and
:func:`load_datasets` (every input with its loader). Re-exported by :mod:`shared_core.eval.runner`."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..types import InvalidInputError
from .data import Conversation, load_jsonl, load_locomo, load_realmem, load_realmem_excerpt
from .longmemeval import load_longmemeval

__all__ = ["Dataset", "load_datasets"]


@dataclass
class Dataset:
    """Conversations read from one input.

    Attributes:
        label: a short unique name (the file's stem, or ``"realmem_excerpt"``).
        source: ``"locomo"``, ``"realmem"``, ``"jsonl"`` or ``"longmemeval"`` (one conversation per question).
        file: the input's file name (no directory), or ``"bundled:<name>"``.
        sha256: the first 16 hex digits of the file's SHA-256.
        conversations: the loaded conversations.
    """

    label: str
    source: str
    file: str
    sha256: str
    conversations: list[Conversation] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """Plain-data facts (no messages)."""
        return {"label": self.label, "source": self.source, "file": self.file, "sha256": self.sha256}


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def load_datasets(
    *,
    locomo: Sequence[str | Path] = (),
    realmem: Sequence[str | Path] = (),
    jsonl: Sequence[str | Path] = (),
    realmem_excerpt: bool = False,
    categories: Iterable[int] | None = (1, 2, 3, 4),
    conversations: Iterable[str] | None = None,
    longmemeval: Sequence[str | Path] = (),
    limit: int | None = None,
) -> list[Dataset]:
    """Load every input with its loader, keeping only the named conversations.

    Args:
        locomo: LoCoMo JSON files. realmem: RealMem persona files. jsonl: JSON Lines conversations.
        realmem_excerpt: also evaluate the RealMem excerpt bundled with the package.
        longmemeval: LongMemEval files (each question a conversation whose id is its ``question_id``).
        limit: at most this many questions of each LongMemEval file, spread over the question types
            (:func:`~shared_core.eval.longmemeval.select_questions`), default all.
        categories: LoCoMo QA categories to keep, default 1-4 (``None`` = all).
        conversations: conversation ids to keep (``None`` = all); every id must exist somewhere.

    Returns:
        The datasets (those left without conversations are dropped).

    Raises:
        InvalidInputError: no input, an unreadable file, or a conversation id found in no input.
    """
    if not (locomo or realmem or jsonl or realmem_excerpt or longmemeval):
        raise InvalidInputError(
            "No data to evaluate; pass --split dev (or validate), --locomo PATH, --realmem PATH, --jsonl "
            "PATH or --longmemeval PATH (any number), "
            "or --realmem-excerpt for the bundled sample."
        )
    out: list[Dataset] = []
    labels: set[str] = set()

    def label_for(stem: str) -> str:
        lab, i = stem, 2
        while lab in labels:
            lab, i = f"{stem}-{i}", i + 1
        labels.add(lab)
        return lab

    for kind, paths in (
        ("locomo", locomo),
        ("realmem", realmem),
        ("jsonl", jsonl),
        ("longmemeval", longmemeval),
    ):
        for p in paths:
            path = Path(p)
            if not path.is_file():
                raise InvalidInputError(f"--{kind}: no such file {path}; pass the path of an existing file.")
            if kind == "locomo":
                convs = load_locomo(path, categories)
            elif kind == "realmem":
                convs = [load_realmem(path)]
            elif kind == "longmemeval":
                convs = load_longmemeval(path, limit)
            else:
                convs = [load_jsonl(path)]
            out.append(Dataset(label_for(path.stem), kind, path.name, _sha(path), convs))
    if realmem_excerpt:
        from importlib import resources

        from .data import EXCERPT_RESOURCE

        res = resources.files("shared_core") / "data" / EXCERPT_RESOURCE
        with resources.as_file(res) as p:
            sha = _sha(Path(p))
        out.append(
            Dataset(
                label_for("realmem_excerpt"),
                "realmem",
                f"bundled:{EXCERPT_RESOURCE}",
                sha,
                [load_realmem_excerpt()],
            )
        )
    if conversations is not None:
        wanted = [str(c) for c in conversations]
        found = {c.id for d in out for c in d.conversations}
        missing = [w for w in wanted if w not in found]
        if missing:
            raise InvalidInputError(
                f"Conversation(s) {', '.join(missing)} not found; available: {', '.join(sorted(found))}."
            )
        for d in out:
            d.conversations = [c for c in d.conversations if c.id in wanted]
        out = [d for d in out if d.conversations]
    return out
