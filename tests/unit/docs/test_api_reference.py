"""The API reference (``mkdocs.yml``, pages under ``docs/reference``) builds from the docstrings in strict
mode: a docstring griffe cannot parse, a page naming an object that does not exist or a broken link fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_api_reference_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    memories = (site / "memories" / "index.html").read_text(encoding="utf-8")
    for name in ("SegTreeMem", "MemTree", "HAT", "XMemory", "retrieve", "min_score", "as_of"):
        assert name in memories, name
    types = (site / "types" / "index.html").read_text(encoding="utf-8")
    assert "explain" in types and "components" in types
