"""Helpers shared by the tests (fake servers, memory factories, invariant checks). Test modules import
from here, never from one another."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""

SHARED_DATA = ROOT.parent / "shared" / "data"
"""``../shared/data`` next to the repository (absent in a user's clone)."""
