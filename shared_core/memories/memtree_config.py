"""MemTree's parts outside the insertion rule: the aggregate summariser (paper App. A.1.2) and the
MemTreeModule configuration (``MemTree.from_config``; shared/seeds/memtree-module-config-doc.txt).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..models.base import LLM, Embedder
from ..models.llm_summarizer import LLMSummarizer, render_children
from ..prompts import fence
from ..prompts import memtree as P
from ..types import InvalidInputError, check_finite

__all__ = ["CONFIG_DEFAULTS", "MemTreeAggregator", "module_arguments"]

#: Defaults of the MemTreeModule configuration (``top``, ``max_depth``, ``threshold``, ``max_context``).
CONFIG_DEFAULTS: dict[str, Any] = {"top": 3, "max_depth": -1, "threshold": 0.2, "max_context": 10_000}
_CONFIG_KEYS = frozenset({*CONFIG_DEFAULTS, "embedding_config"})
_MODULE_KEYS = frozenset({"memory_name", "memory_class", "config"})
_MINILM = "all-minilm-l6-v2"
_LOCAL_EMBED_KEYS = frozenset({"batch_size", "device"})
_OPENAI_EMBED_KEYS = frozenset(
    {"api_key", "base_url", "dimensions", "dim", "timeout", "max_retries", "batch_size"}
)
_RETRIEVE_PARAMS = frozenset(
    {"threshold", "max_context", "alpha", "horizon", "relevance", "hybrid_weight", "admissible"}
)


class MemTreeAggregator(LLMSummarizer):
    """The LLM aggregate function of MemTree: ``Aggregate(c_v, c_new | n)`` with the A.1.2 prompt.

    ``summarize([existing, new], entries=n)`` renders :data:`~shared_core.prompts.memtree.AGGREGATE_USER`
    (the existing summary, the raw new content and ``n``, the number of entries the existing summary
    covers). ``summarize(children, entries=n, rebuild=True)`` (or any number of texts other than two)
    renders :data:`~shared_core.prompts.memtree.REBUILD_USER`, used after deletions to rewrite a summary
    from the remaining children. An empty answer is asked for once more, then raises :class:`ModelError`.

    Args:
        llm: any :class:`~shared_core.models.base.LLM`.
        system: system prompt, default :data:`~shared_core.prompts.memtree.AGGREGATE_SYSTEM`.
        max_tokens: completion cap per call in tokens, default 256.

    Raises:
        InvalidInputError: ``llm`` lacks ``complete``/``acomplete`` or ``max_tokens`` is not a positive int.

    References:
        MemTree App. A.1.2 (aggregate operation and prompt), Sec. 3.1 Eq. for ``c_v'``.
    """

    def __init__(self, llm: LLM, system: str | None = P.AGGREGATE_SYSTEM, max_tokens: int = 256) -> None:
        super().__init__(llm, template=P.REBUILD_USER, system=system, max_tokens=max_tokens)

    def render(self, texts: Sequence[str], **fields: Any) -> str:
        """The prompt for ``texts`` (``[existing, new]``, or the children when rebuilding).

        Args:
            texts: ``[existing, new]`` for an aggregation; the ordered child texts for a rebuild.
            **fields: ``entries`` (int, ``n``; default 1 for an aggregation, ``len(texts)`` for a rebuild)
                and ``rebuild`` (bool, default ``False``).

        Returns:
            The user prompt (a string).

        Raises:
            InvalidInputError: no texts, or a non-string or empty text.
        """
        if isinstance(texts, str):
            raise InvalidInputError("summarize() takes a sequence of texts; wrap one text as [text].")
        texts = list(texts)
        if not texts:
            raise InvalidInputError("Nothing to aggregate: the list of texts is empty.")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise InvalidInputError(f"Text {i} must be a non-empty string.")
        if len(texts) == 2 and not fields.get("rebuild", False):
            entries = int(fields.get("entries", 1))
            return P.AGGREGATE_USER.format(
                existing=fence(texts[0].strip()), new=fence(texts[1].strip()), entries=entries
            )
        entries = int(fields.get("entries", len(texts)))
        return P.REBUILD_USER.format(children=render_children(texts), entries=entries)

    def __repr__(self) -> str:
        return f"MemTreeAggregator(llm={self.llm!r}, max_tokens={self.max_tokens})"


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def _check_max_depth(value: Any, name: str = "max_depth") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (value < 1 and value != -1):
        raise InvalidInputError(
            f"{name} must be -1 (unlimited) or a positive integer (deepest allowed node depth), "
            f"got {value!r}."
        )
    return int(value)


def _check_threshold(value: Any, name: str = "threshold") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InvalidInputError(f"{name} must be a number in [-1, 1] (a cosine similarity), got {value!r}.")
    value = check_finite(value, name)
    if not -1.0 <= value <= 1.0:
        raise InvalidInputError(f"{name} must be in [-1, 1] (a cosine similarity), got {value}.")
    return value


def _embedder_from_config(ec: Any) -> Embedder:
    """Build the embedder an ``embedding_config`` mapping names."""
    if not isinstance(ec, Mapping):
        raise InvalidInputError(
            f"embedding_config must be a mapping such as {{'model': 'all-MiniLM-L6-v2'}}, got {ec!r}."
        )
    model = ec.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidInputError(
            "embedding_config needs a 'model' name, e.g. 'all-MiniLM-L6-v2' (the embedded local model) "
            "or 'text-embedding-3-small' (OpenAI)."
        )
    rest = {k: v for k, v in ec.items() if k != "model"}
    name = model.strip()
    if name.lower() == _MINILM or name.lower().endswith("/" + _MINILM):
        unknown = sorted(set(rest) - _LOCAL_EMBED_KEYS)
        if unknown:
            raise InvalidInputError(
                f"Unknown embedding_config keys for the local model: {', '.join(unknown)}; "
                f"allowed: model, {', '.join(sorted(_LOCAL_EMBED_KEYS))}."
            )
        from ..models.local import LocalEmbedder

        return LocalEmbedder(**rest)
    from ..models.openai_models import KNOWN_EMBEDDING_DIMS, OpenAIEmbedder

    if name in KNOWN_EMBEDDING_DIMS or name.startswith("text-embedding-") or rest.get("base_url"):
        unknown = sorted(set(rest) - _OPENAI_EMBED_KEYS)
        if unknown:
            raise InvalidInputError(
                f"Unknown embedding_config keys for an OpenAI-protocol model: {', '.join(unknown)}; "
                f"allowed: model, {', '.join(sorted(_OPENAI_EMBED_KEYS))}."
            )
        return OpenAIEmbedder(name, **rest)
    raise InvalidInputError(
        f"embedding_config model {name!r} is neither the embedded 'all-MiniLM-L6-v2' nor an OpenAI "
        "embedding model; add 'base_url' of an OpenAI-compatible server that serves it, or pass "
        "embedder=... to from_config."
    )


def module_arguments(
    config: Mapping[str, Any] | None, embedder: Embedder | None, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The :class:`~shared_core.memories.memtree.MemTree` constructor arguments (``embedder`` included)
    of a MemTreeModule configuration; see :meth:`MemTree.from_config
    <shared_core.memories.memtree.MemTree.from_config>` for the keys, defaults and errors.

    Raises:
        InvalidInputError: as :meth:`~shared_core.memories.memtree.MemTree.from_config`.
    """
    kwargs = dict(kwargs)
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise InvalidInputError(f"config must be a mapping, got {type(config).__name__}.")
    if "memory_class" in config or "memory_name" in config:
        unknown = sorted(set(config) - _MODULE_KEYS)
        if unknown:
            raise InvalidInputError(
                f"Unknown memory module keys: {', '.join(unknown)}; allowed: "
                f"{', '.join(sorted(_MODULE_KEYS))}."
            )
        if config.get("memory_class", "MemTreeModule") != "MemTreeModule":
            raise InvalidInputError(
                f"memory_class is {config.get('memory_class')!r}; MemTree.from_config reads "
                "'MemTreeModule' entries."
            )
        config = config.get("config") or {}
        if not isinstance(config, Mapping):
            raise InvalidInputError("The module's 'config' must be a mapping.")
    unknown = sorted(set(config) - _CONFIG_KEYS)
    if unknown:
        raise InvalidInputError(
            f"Unknown MemTreeModule config keys: {', '.join(map(str, unknown))}; allowed: "
            f"{', '.join(sorted(_CONFIG_KEYS))}."
        )
    values = {
        key: (default if config.get(key) is None else config[key]) for key, default in CONFIG_DEFAULTS.items()
    }
    top = _positive_int(values["top"], "top")
    max_depth = _check_max_depth(values["max_depth"])
    threshold = _check_threshold(values["threshold"])
    max_context = _positive_int(values["max_context"], "max_context (a character count)")
    ec = config.get("embedding_config")
    if ec is not None:
        if embedder is not None:
            raise InvalidInputError("Both embedding_config and embedder were given; pass only one of them.")
        embedder = _embedder_from_config(ec)
    for key in ("k", "threshold", "max_depth", "max_context"):
        if key in kwargs:
            raise InvalidInputError(f"Give {key!r} in the config mapping, not as a keyword argument.")
    kwargs.setdefault("relevance", "dense")  # the module's collapsed cosine retrieval
    kwargs.setdefault("policy", "collapsed")
    kwargs.setdefault("admissible", "all")
    kwargs.setdefault("branching", None)  # the paper's insertion
    kwargs.setdefault("reembed_cosine", None)  # the paper's: every rewritten summary embedded
    kwargs.setdefault("annotation_vectors", "embedded")
    return {
        "embedder": embedder,
        "k": top,
        "max_depth": max_depth,
        "threshold": threshold,
        "max_context": max_context,
        **kwargs,
    }
