"""Method specifications of ``hiermem eval``: what ``--methods`` names, and the object each build is.

A method (:class:`MethodSpec`) is a *build* (a hierarchical memory with its constructor options, or a
flat baseline) and, for a memory, a retrieval policy; the policies of one build share one object. This
module holds the flat baselines by name (:data:`BASELINES`; those a memory must beat,
:data:`COUNTED_BASELINES`), the spec parser (:func:`parse_methods`), the no-structure reference of a
memory's relevance (:func:`reference_spec`), a memory build's default policy and relevance read from its
configuration (:func:`memory_facts`), the completion of a method list with what the comparison needs
(:func:`with_references`), and the making of a build's object (``_make_build``).

Method specs (``--methods``, comma-separated):

* ``segtree``, ``memtree``, ``hat``, ``xmemory``: every policy of that memory usable with the
  configuration (LLM-only policies need ``llm_memories``);
* ``segtree:top_down``: one policy (it still shares the ``segtree`` build);
* ``segtree[relevance=dense,threshold=0.4]:top_down``: constructor options (values parsed as JSON when
  they can be, e.g. numbers and booleans, else kept as strings); options make a separate build;
  ``time_weight`` and ``order_weight`` (:data:`RETRIEVAL_OPTIONS`) set the memory's time prior,
  ``supersession`` how it marks updates (``segtree[supersession=off]``);
* ``flat_dense`` (alias ``dense``), ``bm25`` (English stop words + Snowball stemming),
  ``bm25_unstemmed``, ``hybrid`` (alias ``rrf``: reciprocal-rank fusion of dense and stemmed BM25),
  ``fusion`` (max-normalised convex fusion of ``max(cos, 0)`` and stemmed BM25, what a memory's
  ``hybrid`` relevance amounts to over messages; ``fusion[weight=0.3]`` or ``fusion[hybrid_weight=0.3]``
  sets the dense weight, and several weights make a sweep whose best weight the comparison reports),
  ``session_docs`` (sessions as documents, :class:`~shared_core.eval.session_docs.FlatSessionDocs`;
  ``session_docs[sessions=3]``);
* ``all`` (the default), ``memories``, ``baselines``.

Every public name here is re-exported by :mod:`shared_core.eval.runner`.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..memories.supersession import SUPERSESSION_MODES
from ..search.relevance import DEFAULT_HYBRID_WEIGHT, check_weight
from ..types import HierMemError, InvalidInputError, LLMRequiredError, UnknownPolicyError

__all__ = [
    "BASELINES",
    "COUNTED_BASELINES",
    "DEFAULT_BASELINES",
    "RETRIEVAL_OPTIONS",
    "MethodSpec",
    "available_memories",
    "memory_facts",
    "parse_methods",
    "reference_spec",
    "with_references",
]

BASELINES = {
    "flat_dense": "dense cosine over single messages (FAISS)",
    "bm25": "BM25 over single messages, English stop words + Snowball stemming",
    "bm25_unstemmed": "BM25 over single messages, English stop words, no stemming",
    "hybrid": "reciprocal-rank fusion (k=60) of dense and stemmed BM25",
    "fusion": "max-normalised convex fusion w*max(cos,0)/max + (1-w)*stemmed BM25/max, w = hybrid_weight "
    "(default 0.5)",
    "session_docs": "sessions as documents: the best sessions by fusion over their whole text, then their "
    "turns by fusion (sessions=5)",
}
"""Flat baselines by name, with what they are."""

COUNTED_BASELINES = ("flat_dense", "bm25", "hybrid", "fusion", "session_docs")
"""The flat baselines a memory must beat (any options): dense, stemmed BM25, RRF, max-normalised
fusion, and sessions as documents when evaluated. ``bm25_unstemmed`` is reported but does not count."""

DEFAULT_BASELINES = ("flat_dense", "bm25", "hybrid", "fusion")
"""The baselines of the ``all`` and ``baselines`` groups (a run with LongMemEval data adds
``session_docs``, see :func:`~shared_core.eval.runner.run_eval`)."""

RETRIEVAL_OPTIONS = ("time_weight", "order_weight", "supersession")
"""Memory options that are settings of the built memory (attributes set on it: the weights in ``[0, 1]``,
``supersession`` one of ``auto``, ``rule``, ``llm``, ``off``) rather than constructor arguments:
``xmemory[time_weight=0]`` is xMemory time-blind, ``hat[supersession=off]`` HAT without supersession."""

_ALIASES = {"dense": "flat_dense", "flat": "flat_dense", "bm25_stemmed": "bm25", "rrf": "hybrid"}


def available_memories() -> dict[str, type]:
    """The hierarchical memory classes by ``kind``: SegTreeMem, MemTree, HAT, and XMemory when present.

    Returns:
        ``{kind: class}`` in that order.
    """
    from .. import memory_classes

    out = dict(memory_classes())
    if "xmemory" not in out:
        try:
            from ..memories.xmemory import XMemory
        except ImportError:  # pragma: no cover - depends on the installed version
            pass
        else:
            out["xmemory"] = XMemory
    order = ["segtree", "memtree", "hat", "xmemory"]
    return {k: out[k] for k in sorted(out, key=lambda k: order.index(k) if k in order else len(order))}


@dataclass(frozen=True)
class MethodSpec:
    """One evaluated method: a build (memory or baseline, with options) and a retrieval policy.

    Attributes:
        name: the result name, ``"<build>:<policy>"`` for memories, ``"<build>"`` for baselines.
        build: the build key shared by every policy of one object, e.g. ``"segtree"`` or
            ``"segtree[relevance=dense]"``.
        kind: memory kind (``"segtree"``, ...) or baseline name (``"bm25"``, ...).
        policy: the memory's retrieval policy, ``None`` for baselines.
        params: constructor options (JSON values).
    """

    name: str
    build: str
    kind: str
    policy: str | None
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def is_memory(self) -> bool:
        """Whether the method is a hierarchical memory (not a flat baseline)."""
        return self.kind not in BASELINES

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form."""
        return {
            "name": self.name,
            "build": self.build,
            "kind": self.kind,
            "policy": self.policy,
            "params": dict(self.params),
        }


_SPEC_RE = re.compile(
    r"^(?P<kind>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<params>[^\]]*)\])?(?::(?P<policy>[A-Za-z_]+))?$"
)


def _split_specs(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _parse_params(text: str | None, spec: str) -> tuple[tuple[str, Any], ...]:
    if not text or not text.strip():
        return ()
    out: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise InvalidInputError(f"Method {spec!r}: options are written name=value, got {item.strip()!r}.")
        key, raw = (s.strip() for s in item.split("=", 1))
        if not key.isidentifier():
            raise InvalidInputError(f"Method {spec!r}: {key!r} is not an option name.")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return tuple(sorted(out.items()))


def _build_key(kind: str, params: tuple[tuple[str, Any], ...]) -> str:
    if not params:
        return kind
    return (
        kind
        + "["
        + ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in params)
        + "]"
    )


def _usable_policies(cls: type, memory_llm: bool) -> list[str]:
    llm_only = set(getattr(cls, "llm_policies", ()))
    return [p for p in cls.policies if memory_llm or p not in llm_only]


def parse_methods(
    methods: str | Sequence[str] | None = None, *, memory_llm: bool = False
) -> list[MethodSpec]:
    """Parse method specs (see the module docstring) into :class:`MethodSpec` objects.

    Args:
        methods: a comma-separated string, a list of specs, or ``None`` / ``"all"`` for every usable
            policy of every available memory plus :data:`DEFAULT_BASELINES` (``flat_dense``, ``bm25``,
            ``hybrid``, ``fusion``).
        memory_llm: whether the memories get an LLM (LLM-only policies such as HAT's ``agent`` are
            usable only then), default ``False``.

    Returns:
        The specs in the order given, duplicates removed.

    Raises:
        InvalidInputError: a malformed spec, an unknown method, or options on a policy-less shortcut.
        UnknownPolicyError: a policy the memory does not have, or a policy on a baseline.
        LLMRequiredError: an LLM-only policy named explicitly while the memories have no LLM.
    """
    mems = available_memories()
    if methods is None:
        items = ["all"]
    elif isinstance(methods, str):
        items = _split_specs(methods)
    else:
        items = [s for m in methods for s in _split_specs(str(m))]
    if not items:
        raise InvalidInputError("No methods given; pass e.g. --methods segtree,bm25 (or 'all').")
    out: dict[str, MethodSpec] = {}

    def add(spec: MethodSpec) -> None:
        out.setdefault(spec.name, spec)

    def add_memory(kind: str, params: tuple[tuple[str, Any], ...], policy: str | None, raw: str) -> None:
        cls = mems[kind]
        build = _build_key(kind, params)
        if policy is None:
            for p in _usable_policies(cls, memory_llm):
                add(MethodSpec(f"{build}:{p}", build, kind, p, params))
            return
        if policy not in cls.policies:
            raise UnknownPolicyError(
                f"Method {raw!r}: {cls.__name__} has no policy {policy!r}; choose one of "
                f"{', '.join(cls.policies)}."
            )
        if policy in getattr(cls, "llm_policies", ()) and not memory_llm:
            raise LLMRequiredError(
                f"Method {raw!r}: policy {policy!r} needs an LLM in the memory; pass --llm and "
                f"--llm-memories, or use {', '.join(_usable_policies(cls, False))}."
            )
        add(MethodSpec(f"{build}:{policy}", build, kind, policy, params))

    for raw in items:
        low = raw.lower()
        if low in ("all", "memories", "baselines"):
            if low in ("all", "memories"):
                for kind in mems:
                    add_memory(kind, (), None, raw)
            if low in ("all", "baselines"):
                for b in DEFAULT_BASELINES:
                    add(MethodSpec(b, b, b, None))
            continue
        m = _SPEC_RE.match(raw)
        if not m:
            raise InvalidInputError(
                f"Cannot read method {raw!r}; write kind, kind:policy or kind[option=value]:policy "
                "(e.g. segtree:top_down, bm25)."
            )
        kind = m.group("kind").lower()
        kind = _ALIASES.get(kind, kind)
        params = _parse_params(m.group("params"), raw)
        policy = m.group("policy")
        if kind in mems:
            add_memory(kind, params, policy, raw)
        elif kind in BASELINES:
            if policy is not None:
                raise UnknownPolicyError(f"Method {raw!r}: the flat baseline {kind!r} has no policies.")
            if kind == "fusion":
                params = _fusion_params(params, raw)
            build = _build_key(kind, params)
            add(MethodSpec(build, build, kind, None, params))
        else:
            known = ", ".join([*mems, *BASELINES, "all", "memories", "baselines"])
            raise InvalidInputError(f"Unknown method {raw!r}; known: {known}.")
    return list(out.values())


def _fusion_params(params: tuple[tuple[str, Any], ...], raw: str) -> tuple[tuple[str, Any], ...]:
    """``fusion`` options with ``hybrid_weight`` (alias ``weight``) as a float, left out at its default
    (one build key); both names at once is an :class:`InvalidInputError`."""
    out = dict(params)
    if "weight" in out:
        if "hybrid_weight" in out:
            raise InvalidInputError(f"Method {raw!r}: give weight or hybrid_weight, not both.")
        out["hybrid_weight"] = out.pop("weight")
    if "hybrid_weight" in out:
        try:
            w = check_weight(out["hybrid_weight"])
        except InvalidInputError as e:
            raise InvalidInputError(f"Method {raw!r}: {e}") from None
        if w == DEFAULT_HYBRID_WEIGHT:
            del out["hybrid_weight"]
        else:
            out["hybrid_weight"] = w
    return tuple(sorted(out.items()))


def reference_spec(relevance: str, hybrid_weight: float = DEFAULT_HYBRID_WEIGHT) -> MethodSpec:
    """The flat baseline with a memory's relevance and no structure (its tree-share reference).

    ``"dense"`` -> ``flat_dense`` (cosine over messages), ``"bm25"`` -> ``bm25`` (English stop words,
    Snowball stemming: the memories' lexical index), ``"hybrid"`` -> ``fusion`` with the same weight
    (``fusion[hybrid_weight=w]`` when ``w`` is not 0.5).

    Args:
        relevance: the memory's relevance kind, ``"dense"``, ``"bm25"`` or ``"hybrid"``.
        hybrid_weight: the memory's ``hybrid_weight``, in ``[0, 1]``, default 0.5 (used for ``"hybrid"``).

    Returns:
        The baseline's :class:`MethodSpec`.

    Raises:
        UnknownPolicyError: an unknown relevance kind.
        InvalidInputError: ``hybrid_weight`` outside ``[0, 1]``.
    """
    if relevance == "dense":
        return MethodSpec("flat_dense", "flat_dense", "flat_dense", None)
    if relevance == "bm25":
        return MethodSpec("bm25", "bm25", "bm25", None)
    if relevance != "hybrid":
        raise UnknownPolicyError(f"relevance must be 'dense', 'bm25' or 'hybrid', got {relevance!r}.")
    params = _fusion_params((("hybrid_weight", hybrid_weight),), "fusion")
    build = _build_key("fusion", params)
    return MethodSpec(build, build, "fusion", None, params)


class _ProbeEmbedder:
    """Stands in for the embedder while a memory is built only to read its configuration."""

    dim = 8
    name = "probe"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise InvalidInputError("a configuration probe does not embed")


class _ProbeLLM:
    """Stands in for the LLM (the :class:`~shared_core.models.base.LLM` protocol) while a memory is built
    only to read its configuration."""

    def complete(self, prompt: str, **kw: Any) -> Any:
        raise InvalidInputError("a configuration probe does not call an LLM")

    async def acomplete(self, prompt: str, **kw: Any) -> Any:
        raise InvalidInputError("a configuration probe does not call an LLM")


def _static_facts(cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """Default policy and relevance from a memory class's defaults and the build's options."""
    sig = inspect.signature(cls.__init__).parameters
    rel = params.get("relevance")
    if rel is None and "relevance" in sig and isinstance(sig["relevance"].default, str):
        rel = sig["relevance"].default
    if rel is None and "relevance" in sig:
        rel = getattr(cls, "default_relevance", None)
    w = params.get("hybrid_weight")
    if w is None and "hybrid_weight" in sig and isinstance(sig["hybrid_weight"].default, (int, float)):
        w = sig["hybrid_weight"].default
    return {
        "default_policy": str(cls.default_policy),
        "tree_policy": str(getattr(cls, "tree_policy", None) or cls.default_policy),
        "relevance": str(rel or "dense"),
        "hybrid_weight": float(DEFAULT_HYBRID_WEIGHT if w is None else w),
    }


def _instance_facts(obj: Any) -> dict[str, Any]:
    """Default policy and relevance read from a built memory (``relevance_kind`` / ``hybrid_weight``);
    a memory without a relevance option ranks by cosine, i.e. ``"dense"``."""
    w = getattr(obj, "hybrid_weight", None)
    return {
        "default_policy": str(obj.default_policy),
        "tree_policy": str(getattr(obj, "tree_policy", None) or obj.default_policy),
        "relevance": str(getattr(obj, "relevance_kind", None) or "dense"),
        "hybrid_weight": float(DEFAULT_HYBRID_WEIGHT if w is None else w),
    }


def memory_facts(spec: MethodSpec, *, memory_llm: bool = False) -> dict[str, Any]:
    """A memory build's default policy, tree policy and relevance, read from its public configuration.

    The memory is constructed with ``spec.params`` (and stand-in models, never called) and its
    ``default_policy``, ``tree_policy`` (the policy that ranks through the structure; its default
    policy when it names none), ``relevance_kind`` and ``hybrid_weight`` attributes are read; a memory
    without a ``relevance_kind`` ranks by cosine (``"dense"``). When the constructor refuses (e.g. a bad
    option, reported later when the build is made), the class's defaults and the ``relevance`` /
    ``hybrid_weight`` options are used.

    Args:
        spec: a memory method (``spec.is_memory``).
        memory_llm: whether the memories get an LLM (HAT's default policy is ``agent`` then).

    Returns:
        ``{"default_policy": str, "tree_policy": str, "relevance": str, "hybrid_weight": float}``.

    Raises:
        InvalidInputError: ``spec`` is a flat baseline.
    """
    if not spec.is_memory:
        raise InvalidInputError(f"{spec.name!r} is a flat baseline, not a memory.")
    cls = available_memories()[spec.kind]
    params = {n: v for n, v in spec.params if n not in RETRIEVAL_OPTIONS}
    try:
        obj = cls(embedder=_ProbeEmbedder(), llm=_ProbeLLM() if memory_llm else None, **params)
    except (HierMemError, TypeError):
        return _static_facts(cls, params)
    return _instance_facts(obj)


def with_references(specs: Sequence[MethodSpec], *, memory_llm: bool = False) -> list[MethodSpec]:
    """``specs`` completed with what the comparison needs for every memory build.

    For each memory build: its default policy, its tree policy (``tree_policy``: the one that ranks
    through the structure, e.g. ``top_down``) and its ``collapsed`` policy (the same relevance without
    the structure; the tree share compares the two), each inserted after the build's last method when
    missing, and its flat reference (:func:`reference_spec` of its relevance, for the
    corpus share), appended when missing.

    Args:
        specs: the methods, e.g. from :func:`parse_methods`.
        memory_llm: whether the memories get an LLM.

    Returns:
        A new list: ``specs`` in their order with the added methods.
    """
    out = list(specs)
    names = {s.name for s in out}
    refs: list[MethodSpec] = []
    seen: set[str] = set()
    for s in specs:
        if not s.is_memory or s.build in seen:
            continue
        seen.add(s.build)
        facts = memory_facts(s, memory_llm=memory_llm)
        wanted = [facts["default_policy"], facts["tree_policy"]]
        if "collapsed" in available_memories()[s.kind].policies:
            wanted.append("collapsed")
        for policy in wanted:
            name = f"{s.build}:{policy}"
            if name not in names:
                last = max(i for i, x in enumerate(out) if x.build == s.build)
                out.insert(last + 1, MethodSpec(name, s.build, s.kind, policy, s.params))
                names.add(name)
        ref = reference_spec(facts["relevance"], facts["hybrid_weight"])
        if ref.name not in names:
            refs.append(ref)
            names.add(ref.name)
    return out + refs


def _make_build(spec: MethodSpec, embedder: Any, llm: Any) -> Any:
    """A fresh object for ``spec.build``."""
    from .baselines import FlatBM25, FlatDense, FlatFusion, FlatHybridRRF
    from .session_docs import FlatSessionDocs

    params = dict(spec.params)
    makers: dict[str, Callable[..., Any]] = {
        "flat_dense": lambda **kw: FlatDense(embedder, **kw),
        "bm25": lambda **kw: FlatBM25(**{"stem": True, **kw}),
        "bm25_unstemmed": lambda **kw: FlatBM25(**{"stem": False, **kw}),
        "hybrid": lambda **kw: FlatHybridRRF(embedder, **kw),
        "fusion": lambda **kw: FlatFusion(embedder, **kw),
        "session_docs": lambda **kw: FlatSessionDocs(embedder, **kw),
    }
    try:
        if spec.kind in makers:
            return makers[spec.kind](**params)
        cls = available_memories()[spec.kind]
        tuned = {n: params.pop(n) for n in RETRIEVAL_OPTIONS if n in params}
        mem = cls(embedder=embedder, llm=llm, **params)
    except TypeError as e:
        raise InvalidInputError(f"Method {spec.build!r}: bad option ({e}).") from None
    for name, value in tuned.items():
        if name == "supersession":
            if value not in SUPERSESSION_MODES:
                raise InvalidInputError(
                    f"Method {spec.build!r}: supersession must be one of {', '.join(SUPERSESSION_MODES)}."
                )
            mem.supersession = value
        else:
            setattr(mem, name, check_weight(value, name))
    return mem
