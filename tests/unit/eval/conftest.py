"""Evaluation tests keep the on-disk embedding cache of ``hiermem eval`` in their own temporary directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_embed_cache(tmp_path_factory, monkeypatch):
    from shared_core.eval import embed_store

    root = tmp_path_factory.mktemp("eval-embeddings")
    monkeypatch.setattr(embed_store, "default_embed_cache_dir", lambda: root)
