"""Counting embedders, message helpers and tampered namespace directories for the MemoryStore
(namespace) and MCP tests."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared_core import Message
from shared_core.namespaces import namespace_dirname
from tests.support.memory import HashEmbedder

EMB = HashEmbedder(64)


class CountingEmbedder:
    """HashEmbedder that counts every text it embeds."""

    def __init__(self) -> None:
        self.inner = HashEmbedder(64)
        self.texts: list[str] = []

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        return self.inner.embed(texts)


def _msgs(i: int) -> list[Message]:
    return [
        Message(f"user{i} says the secret word is w{i}x", id=f"m{i}a"),
        Message(f"I like topic{i % 7} a lot", id=f"m{i}b"),
    ]


def _sources(hits: Any) -> set[str]:
    return {s for h in hits for s in h.source_ids}


def tamper_record(root: Path, folder: tuple[str, ...], names: Any) -> Path:
    """Make the directory of namespace ``folder`` under ``root`` (created if missing) claim ``names`` in
    its ``namespace.json`` (a tampered directory); its path."""
    d = Path(root) / namespace_dirname(folder)
    d.mkdir(parents=True, exist_ok=True)
    (d / "namespace.json").write_text(json.dumps({"format": 1, "namespace": names, "kind": "segtree"}))
    return d


def copy_namespace(root: Path, source: tuple[str, ...], folder: tuple[str, ...]) -> Path:
    """Copy the directory of namespace ``source`` under ``root`` to the one of ``folder`` (a copied
    directory: its record still names ``source``); the copy's path."""
    d = Path(root) / namespace_dirname(folder)
    shutil.copytree(Path(root) / namespace_dirname(source), d)
    return d
