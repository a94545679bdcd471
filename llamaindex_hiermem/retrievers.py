"""``HierMemRetriever``: a LlamaIndex ``BaseRetriever`` over any hiermem memory."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.schema import NodeRelationship, NodeWithScore, QueryBundle, RelatedNodeInfo, TextNode
from llama_index.core.storage.docstore.types import BaseDocumentStore
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn

from shared_core.memories.base import HierarchicalMemory
from shared_core.search.filters import check_in_values, in_values
from shared_core.types import Hit, InvalidInputError, Message, UnknownPolicyError

__all__ = [
    "STRUCTURE_KEYS",
    "HierMemRetriever",
    "hit_to_node",
    "metadata_matcher",
    "policy_param_names",
]

#: Metadata keys every node built from a hit carries; hidden from the LLM and embedding views.
STRUCTURE_KEYS = (
    "node_id",
    "depth",
    "span",
    "source_ids",
    "is_leaf",
    "level",
    "kind",
    "policy",
    "superseded_by",
    "valid_from",
    "valid_to",
)
# At most this many rounds of doubling k when a scoped retrieval keeps fewer hits than asked for.


#: the core ``retrieve`` options a retriever passes on beside the policy's parameters
RETRIEVE_OPTIONS = frozenset({"as_of", "min_score", "time_range", "time_weight"})


def policy_param_names(memory: HierarchicalMemory) -> frozenset[str] | None:
    """Names of the retrieval-policy parameters ``memory`` accepts (``None``: unknown, any name passes).

    In order: the memory class's ``retrieve_params`` when it declares them; else the named parameters of
    its ``_retrieve`` after ``query, policy, k``; when ``_retrieve`` takes ``**params``, the
    ``_RETRIEVE_PARAMS`` set its module validates them against.
    """
    cls = type(memory)
    declared = getattr(cls, "retrieve_params", None)
    if declared is not None:
        return frozenset(declared)
    names: set[str] = set()
    for p in list(inspect.signature(cls._retrieve).parameters.values())[4:]:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            module_names = getattr(sys.modules.get(cls.__module__), "_RETRIEVE_PARAMS", None)
            return None if module_names is None else frozenset(names | set(module_names))
        if p.kind is not inspect.Parameter.VAR_POSITIONAL:
            names.add(p.name)
    return frozenset(names)


def metadata_matcher(filters: MetadataFilters) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate over a metadata dict for LlamaIndex ``MetadataFilters`` (nested filters included).

    Each single filter is evaluated as LlamaIndex's own vector stores do
    (``llama_index.core.vector_stores.utils.build_metadata_filter_fn``), except ``in`` / ``nin``, which
    follow the core's ``$in`` / ``$nin`` (``shared_core.search.filters.in_values``): a list-valued field
    is in the list when any of its elements is, and the value must be a list of scalars (LlamaIndex
    compares the whole list, and tests a string value by substring); the filters of one level are
    combined by their ``condition`` (``and`` by default, ``or``, ``not`` = none matches). A comparison
    that cannot be made (e.g. ``"a" > 1``, a text match on a number) does not match.

    Args:
        filters: the filters.

    Returns:
        ``metadata -> bool``.

    Raises:
        InvalidInputError: ``filters`` is not a ``MetadataFilters`` (or holds something else than
            ``MetadataFilter`` / ``MetadataFilters``), or an ``in`` / ``nin`` filter whose value is not a
            list of scalars.
    """
    if not isinstance(filters, MetadataFilters):
        raise InvalidInputError(
            "filters must be llama_index.core.vector_stores.MetadataFilters, e.g. "
            "MetadataFilters(filters=[MetadataFilter(key='user', value='alice')]); "
            f"got {type(filters).__name__}."
        )
    parts: list[Callable[[Mapping[str, Any]], bool]] = []
    for f in filters.filters:
        if isinstance(f, MetadataFilters):
            parts.append(metadata_matcher(f))
        elif isinstance(f, MetadataFilter):
            parts.append(_single_matcher(f))
        else:
            raise InvalidInputError(
                "A MetadataFilters entry must be a MetadataFilter or MetadataFilters, got "
                f"{type(f).__name__}."
            )
    condition = filters.condition or FilterCondition.AND
    if condition == FilterCondition.OR:
        return lambda md: any(p(md) for p in parts)
    if condition == FilterCondition.NOT:
        return lambda md: not any(p(md) for p in parts)
    return lambda md: all(p(md) for p in parts)


def _single_matcher(f: MetadataFilter) -> Callable[[Mapping[str, Any]], bool]:
    if f.operator in (FilterOperator.IN, FilterOperator.NIN):  # the core's rule, list-valued fields too
        values = check_in_values(f.value, f"MetadataFilter {f.key!r} {f.operator.value}")
        nin = f.operator == FilterOperator.NIN
        return lambda md: in_values(md.get(f.key), values) != nin
    # LlamaIndex's evaluator looks metadata up by node id; here the "id" handed to it is the metadata.
    fn = build_metadata_filter_fn(lambda md: md, MetadataFilters(filters=[f]))  # type: ignore[arg-type,return-value]

    def match(md: Mapping[str, Any]) -> bool:
        try:
            return bool(fn(md))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False

    return match


class _Scope:
    """Which stored messages a scoped retriever may show: metadata ``filters``, ``node_ids``, ``doc_ids``.

    :meth:`message_ok` is the core's ``where`` predicate: the memory returns a node only when every
    message its text draws on passes (the leaves under it; for xMemory also the messages a fact comes
    from). A message without an id fails ``node_ids`` / ``doc_ids``; a message whose document is unknown
    to the docstore fails ``doc_ids``.
    """

    def __init__(
        self,
        filters: MetadataFilters | None,
        node_ids: Iterable[str] | None,
        doc_ids: Iterable[str] | None,
        docstore: BaseDocumentStore | None,
    ) -> None:
        self.match = metadata_matcher(filters) if filters is not None else None
        self.node_ids = _id_set(node_ids, "node_ids")
        self.doc_ids = _id_set(doc_ids, "doc_ids")
        if self.doc_ids is not None and docstore is None:
            raise InvalidInputError(
                "doc_ids scopes retrieval to documents, which needs the docstore holding the nodes: "
                "use index.as_retriever(doc_ids=...), or pass docstore= (or scope with node_ids=)."
            )
        self.docstore = docstore

    def message_ok(self, msg: Message | None) -> bool:
        if msg is None:
            return False
        if self.node_ids is not None and msg.id not in self.node_ids:
            return False
        if self.doc_ids is not None:
            assert self.docstore is not None
            node = self.docstore.get_node(msg.id, raise_error=False) if msg.id is not None else None
            if node is None or node.ref_doc_id not in self.doc_ids:
                return False
        return self.match is None or self.match(msg.metadata or {})


def _id_set(ids: Iterable[str] | None, name: str) -> frozenset[str] | None:
    if ids is None:
        return None
    if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
        raise InvalidInputError(f"{name} must be a list of id strings (or None), got {ids!r}.")
    return frozenset(ids)


def _json_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def hit_to_node(
    hit: Hit,
    docstore: BaseDocumentStore | None = None,
    id_prefix: str = "hiermem/",
) -> TextNode:
    """The LlamaIndex node of one hit.

    Every node's metadata carries the structure keys ``node_id`` (core node id, int), ``depth``, ``span``
    (``[first, last]`` insertion indices, 0-based), ``source_ids`` (list of str), ``is_leaf``, ``level``,
    ``kind``, ``policy`` and the supersession marks ``superseded_by`` (the newer source ids, empty while
    current), ``valid_from`` and ``valid_to`` (see :class:`~shared_core.types.Hit`), all hidden from the LLM
    and embedding views (they replace metadata keys of the same names). A leaf whose source id names a node
    in ``docstore`` is returned as a copy of that stored node (same id, text, relationships and metadata)
    with the structure keys added; the stored node is not changed. Any other hit becomes a new
    :class:`~llama_index.core.schema.TextNode` with the hit's text and the message fields (leaves) in its
    metadata. An internal node has a ``CHILD`` relationship to each leaf under it that has a source id (the
    docstore's nodes).

    Args:
        hit: a core :class:`~shared_core.types.Hit`.
        docstore: where leaves were stored (the index's docstore), or ``None``.
        id_prefix: prefix of the ids of nodes not in the docstore: ``f"{id_prefix}{hit.node_id}"``; a
            leaf with a source id keeps that id.

    Returns:
        A ``TextNode`` (or a copy of whatever node type the docstore holds for the leaf).

    References:
        LlamaIndex ``TextNode`` / ``NodeRelationship.CHILD``; core :class:`~shared_core.types.Hit`.
    """
    meta: dict[str, Any] = {k: v for k, v in hit.metadata.items() if _json_scalar(v) and v is not None}
    meta.update(
        {
            "node_id": hit.node_id,
            "depth": hit.depth,
            "span": [int(hit.span[0]), int(hit.span[1])],
            "source_ids": list(hit.source_ids),
            "is_leaf": hit.is_leaf,
            "superseded_by": list(hit.superseded_by),
            "valid_from": hit.valid_from,
            "valid_to": hit.valid_to,
        }
    )
    hidden = [k for k in STRUCTURE_KEYS if k in meta]
    if hit.is_leaf and hit.source_ids and docstore is not None:
        stored = docstore.get_node(hit.source_ids[0], raise_error=False)
        if stored is not None:  # a copy: the docstore's node is left as it is
            node = stored.model_copy()
            node.metadata = {**stored.metadata, **{k: meta[k] for k in hidden}}
            node.excluded_llm_metadata_keys = list(
                dict.fromkeys([*stored.excluded_llm_metadata_keys, *hidden])
            )
            node.excluded_embed_metadata_keys = list(
                dict.fromkeys([*stored.excluded_embed_metadata_keys, *hidden])
            )
            return node
    if hit.is_leaf:
        node_id = hit.source_ids[0] if hit.source_ids else f"{id_prefix}{hit.node_id}"
        rel: dict[NodeRelationship, Any] = {}
    else:
        node_id = f"{id_prefix}{hit.node_id}"
        rel = {NodeRelationship.CHILD: [RelatedNodeInfo(node_id=s) for s in hit.source_ids]}
    return TextNode(
        id_=node_id,
        text=hit.text,
        metadata=meta,
        relationships=rel,
        excluded_llm_metadata_keys=hidden,
        excluded_embed_metadata_keys=hidden,
    )


class HierMemRetriever(BaseRetriever):
    """A LlamaIndex retriever over a hiermem memory (any of MemTree, SegTreeMem, HAT, xMemory).

    Each query runs the memory's retrieval ``policy`` and yields ``NodeWithScore`` best first: leaves
    as the docstore's nodes (when a ``docstore`` holds them), internal nodes (summaries / annotations) as
    new ``TextNode`` objects with structure metadata (see :func:`hit_to_node`). Scores are the core's
    :attr:`~shared_core.types.Hit.score`: the query's cosine similarity to the node's text in
    ``[0, 1]``, comparable across queries (so ``SimilarityPostprocessor(similarity_cutoff=...)``
    means the same whatever the memory holds); the order is the policy's.

    Scoping (``filters``, ``node_ids``, ``doc_ids``, as for LlamaIndex's vector retrievers) never lets
    out-of-scope text through: a leaf is returned only when its message is in scope, and an internal node
    (whose summary mixes its messages) only when every message under it is. The scope is the core's
    ``where`` filter (``shared_core.search.filters``), applied before top-k: ``similarity_top_k`` in-scope
    hits come back whenever that many in-scope messages exist.

    Args:
        memory: the core memory (:class:`~shared_core.memories.base.HierarchicalMemory`).
        policy: retrieval policy, one of ``memory.policies``; default ``None`` = the memory's default
            (e.g. SegTreeMem ``collapsed``).
        similarity_top_k: at most this many nodes per query; default ``None`` = the memory's default
            (usually 10).
        max_tokens: optional budget of returned text in tokens (as the core counts them); default
            ``None`` (no budget).
        docstore: the docstore holding the leaves' nodes (an index's ``docstore``); default ``None``.
        id_prefix: prefix of the ids of nodes built from hits, default ``"hiermem/"``.
        filters: LlamaIndex ``MetadataFilters`` over the stored messages' metadata (an index's node
            metadata), e.g. ``MetadataFilters(filters=[MetadataFilter(key="user", value="alice")])``;
            default ``None`` (no filter).
        node_ids: only these stored nodes (messages) may be shown; default ``None`` (all).
        doc_ids: only nodes parsed from these documents (``ref_doc_id``, looked up in ``docstore``) may be
            shown; default ``None`` (all).
        callback_manager: LlamaIndex callbacks, default ``None``.
        object_map: LlamaIndex recursive-retrieval objects, default ``None``.
        verbose: LlamaIndex verbosity, default ``False``.
        **policy_params: the policy's parameters (e.g. SegTreeMem ``alpha=0.1, horizon=2``), and the
            core ``retrieve`` options ``as_of`` (the time the query is asked at: nothing said after it,
            time expressions resolve against it), ``min_score`` (a threshold on the node's score, the
            cosine similarity in [0, 1]), ``time_range`` and ``time_weight``.

    Raises:
        InvalidInputError: ``memory`` is not a hiermem memory; ``similarity_top_k`` or ``max_tokens`` is
            not a positive integer; a policy parameter the memory does not take; ``filters`` that are not
            ``MetadataFilters``; ``node_ids`` / ``doc_ids`` that are not lists of strings; ``doc_ids``
            without ``docstore``.
        UnknownPolicyError: a policy the memory does not have.

    References:
        The policies of each memory: MemTree Sec. 3.2 (memory retrieval), SegTreeMem Sec. 4.3 and
        Appendix A Algorithm 2, HAT Sec. 3.2 (memory agent), xMemory Sec. 3.3 (adaptive retrieval).
    """

    def __init__(
        self,
        memory: HierarchicalMemory,
        *,
        policy: str | None = None,
        similarity_top_k: int | None = None,
        max_tokens: int | None = None,
        docstore: BaseDocumentStore | None = None,
        id_prefix: str = "hiermem/",
        filters: MetadataFilters | None = None,
        node_ids: list[str] | None = None,
        doc_ids: list[str] | None = None,
        callback_manager: CallbackManager | None = None,
        object_map: dict | None = None,
        verbose: bool = False,
        **policy_params: Any,
    ) -> None:
        if not isinstance(memory, HierarchicalMemory):
            raise InvalidInputError(
                f"HierMemRetriever needs a hiermem memory (e.g. SegTreeMem()), got {type(memory).__name__}."
            )
        if policy is not None and policy not in memory.policies:
            raise UnknownPolicyError(
                f"{type(memory).__name__} has no policy {policy!r}; "
                f"choose one of {', '.join(memory.policies)}."
            )
        for name, v in (("similarity_top_k", similarity_top_k), ("max_tokens", max_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidInputError(f"{name} must be a positive integer or None, got {v!r}.")
        accepted = policy_param_names(memory)
        if accepted is not None:
            unknown = sorted(set(policy_params) - accepted - RETRIEVE_OPTIONS)
            if unknown:
                raise InvalidInputError(
                    f"{type(memory).__name__} retrieval takes no parameter {', '.join(map(repr, unknown))}; "
                    f"it takes: {', '.join(sorted(accepted)) or 'none'}."
                )
        self.memory = memory
        self.policy = policy
        self.similarity_top_k = similarity_top_k
        self.max_tokens = max_tokens
        self.docstore = docstore
        self.id_prefix = id_prefix
        self.policy_params = dict(policy_params)
        scoped = filters is not None or node_ids is not None or doc_ids is not None
        self._scope = _Scope(filters, node_ids, doc_ids, docstore) if scoped else None
        self.filters = filters
        self.node_ids = list(node_ids) if node_ids is not None else None
        self.doc_ids = list(doc_ids) if doc_ids is not None else None
        super().__init__(callback_manager=callback_manager, object_map=object_map, verbose=verbose)

    def _to_nodes(self, hits: list[Hit]) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=hit_to_node(h, self.docstore, self.id_prefix), score=float(h.score))
            for h in hits
        ]

    def _hits(self, query: str) -> list[Hit]:
        return self.memory.retrieve(
            query,
            k=self.similarity_top_k,
            policy=self.policy,
            max_tokens=self.max_tokens,
            where=self._scope.message_ok if self._scope is not None else None,
            **self.policy_params,
        )

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._to_nodes(self._hits(query_bundle.query_str))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._to_nodes(await asyncio.to_thread(self._hits, query_bundle.query_str))
