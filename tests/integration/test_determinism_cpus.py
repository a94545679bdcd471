"""The same hits on other CPUs: every memory's hits, and xMemory's two paths, in subprocesses with
FAISS's SIMD level and OpenBLAS's core type forced to other values, as in the test process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from tests.support import ROOT

_SCRIPT = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from shared_core.memories.xmemory import XMemory
from shared_core.memories.xmemory import retrieval as R
from tests.support.determinism import _all_hits, _both_paths, _hits, _memory
from tests.support.memory import KINDS
from tests.support.xmemory import QUERIES, BowEmbedder, _messages
R.CANDIDATES_PER_HIT, R.NODES_PER_CANDIDATE = 5, 4
out = {}
for kind in KINDS:
    out[kind] = _all_hits(_memory(kind))
mem = XMemory(embedder=BowEmbedder(), dedup_threshold=0.85, max_episode_messages=5, exact_search_max=None)
msgs = _messages(300)
for i in range(0, len(msgs), 10):
    mem.add(msgs[i : i + 10])
out["xmemory-candidates"] = [_hits(h) for q in QUERIES for h in _both_paths(mem, q, 3)]
print(json.dumps(out))
"""


def _run(env_extra: dict[str, str]) -> dict:
    env = {**os.environ, **env_extra, "PYTHONHASHSEED": "0"}
    res = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(ROOT)], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 SIMD levels")
def test_the_same_hits_with_other_simd_levels_and_blas_kernels():
    """FAISS's SIMD level (used for the IVF candidates only) and OpenBLAS's kernel (float64 products)
    forced to other values in subprocesses: every memory's hits, and xMemory's two paths, as here."""
    import faiss

    here = _run({})
    variants = [
        {"FAISS_SIMD_LEVEL": "NONE"},
        {"OPENBLAS_CORETYPE": "Haswell"},
        {"OPENBLAS_CORETYPE": "Nehalem"},
    ]
    if "AVX2" in faiss.get_compile_options():
        variants.append({"FAISS_SIMD_LEVEL": "AVX2", "OMP_NUM_THREADS": "1"})
    for env in variants:
        assert _run(env) == here, env
