"""Shared fixtures: the OpenAI-protocol test server, the real local embedder, the shared data path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.openai_server import openai_server  # noqa: F401  (fixture)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def local_embedder():
    """The real embedded embedder (all-MiniLM-L6-v2), loaded once per test session."""
    from shared_core.models.local import LocalEmbedder

    return LocalEmbedder()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ../shared/data; skips the test when it is absent (a user's clone has no ../shared)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at ../shared/data (looked in {SHARED_DATA.name}); CI provides it")
    return SHARED_DATA
