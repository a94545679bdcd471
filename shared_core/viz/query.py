"""What a query does to a memory, as the pictures show it: the top-k hits of a retrieval policy with their
rank, readable score and path from the root, every node's cosine similarity to the query on one fixed
colour scale, and the legend that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..types import Hit, InvalidInputError, UnknownPolicyError

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory

__all__ = ["MARK_COLOR", "SCALE", "QueryView", "check_options", "legend", "query_view", "scale_color"]

#: colour stops ``(score, "#rrggbb")`` of the score shading, linear in RGB between stops. The scale is
#: fixed from 0 to 1 (never stretched to the best node), so pictures of different queries and memories
#: compare: the same shade is the same cosine.
SCALE: tuple[tuple[float, str], ...] = (
    (0.0, "#f3f6fa"),
    (0.3, "#c6dbef"),
    (0.6, "#4292c6"),
    (1.0, "#08306b"),
)
#: colour of the hit marks and of the paths from the root to the hits
MARK_COLOR = "#d62728"


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16)


def scale_color(score: float) -> str:
    """The shade of a score on :data:`SCALE` as ``"#rrggbb"``; scores outside ``[0, 1]`` are clipped."""
    s = min(1.0, max(0.0, float(score)))
    for (s0, c0), (s1, c1) in zip(SCALE, SCALE[1:]):
        if s <= s1:
            t = (s - s0) / (s1 - s0)
            rgb = [round(a + (b - a) * t) for a, b in zip(_rgb(c0), _rgb(c1))]
            return "#{:02x}{:02x}{:02x}".format(*rgb)
    return SCALE[-1][1]


@dataclass
class QueryView:
    """A query's view of a memory (see :func:`query_view`).

    Attributes:
        query: the query text.
        policy: the retrieval policy that ranked the hits.
        k: hits asked for (fewer come back from a small memory).
        hits: ``memory.retrieve(query, k=k, policy=policy)``, in the policy's order (``Hit.rank`` 1, 2...).
        scores: node id -> readable score in ``[0, 1]`` of every node with text: the cosine similarity of
            the query's and the node's embeddings clipped to ``[0, 1]`` (``memory.relevance(query,
            "dense")``); a hit's is its ``Hit.score``.
        bm25: node id -> Okapi BM25 score of every node's text when the memory's relevance reads BM25
            (``relevance="bm25"`` or ``"hybrid"``), else ``None``.
    """

    query: str
    policy: str
    k: int
    hits: list[Hit]
    scores: dict[int, float]
    bm25: dict[int, float] | None = None
    _by_node: dict[int, Hit] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_node = {h.node_id: h for h in self.hits}

    def hit_of(self) -> dict[int, Hit]:
        """Node id -> its hit."""
        return dict(self._by_node)

    def on_path(self) -> set[int]:
        """Ids of the nodes on a path from the root to a hit (the hits included)."""
        return {i for h in self.hits for i in h.path}

    def components(self, nid: int) -> dict[str, float]:
        """A node's figures: a hit's ``Hit.components`` (``"rank"``, ``"dense"``, maybe ``"bm25"``);
        another node's ``{"dense": its score}`` and ``"bm25"`` when :attr:`bm25` is set."""
        hit = self._by_node.get(nid)
        if hit is not None:
            return dict(hit.components)
        out = {"dense": self.scores.get(nid, 0.0)}
        if self.bm25 is not None:
            out["bm25"] = self.bm25.get(nid, 0.0)
        return out


def check_options(memory: HierarchicalMemory, k: object, policy: object) -> tuple[int, str]:
    """The checked ``k`` and ``policy`` of a picture (checked with or without a query).

    Returns:
        ``(k, policy)``; ``policy`` ``None`` becomes the memory's ``default_policy``.

    Raises:
        InvalidInputError: ``k`` not a positive integer.
        UnknownPolicyError: a policy the memory does not have (the message lists its policies).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
    name = memory.default_policy if policy is None else policy
    if not isinstance(name, str) or name not in memory.policies:
        raise UnknownPolicyError(
            f"{type(memory).__name__} has no policy {name!r}; choose one of {', '.join(memory.policies)}."
        )
    return k, name


def query_view(
    memory: HierarchicalMemory, query: str | None, k: int = 10, policy: str | None = None
) -> QueryView | None:
    """Retrieve the top ``k`` hits of ``policy`` for ``query`` and score every node for the pictures.

    Args:
        memory: any hiermem memory.
        query: the query text, or ``None`` (no view; ``k`` and ``policy`` are still checked).
        k: hits to mark, a positive integer, default 10.
        policy: one of ``memory.policies``; default ``None`` = ``memory.default_policy``.

    Returns:
        The :class:`QueryView`, or ``None`` without a query.

    Raises:
        InvalidInputError: ``k`` not a positive integer, an empty query.
        UnknownPolicyError: a policy the memory does not have.
        LLMRequiredError: an LLM-only policy on a memory without an LLM.
    """
    k, policy = check_options(memory, k, policy)
    if query is None:
        return None
    hits = memory.retrieve(query, k=k, policy=policy)
    ids, dense = memory.relevance(query, "dense")
    scores = {int(i): min(1.0, max(0.0, float(v))) for i, v in zip(ids.tolist(), dense.tolist())}
    scores.update({h.node_id: h.score for h in hits})
    bm25 = None
    if memory.relevance_kind in ("bm25", "hybrid"):
        ids, bm = memory.relevance(query, "bm25")
        bm25 = {int(i): float(v) for i, v in zip(ids.tolist(), bm.tolist())}
    return QueryView(query=query, policy=policy, k=k, hits=hits, scores=scores, bm25=bm25)


def legend(view: QueryView) -> dict[str, str]:
    """What the shading, marks and lines of a query's picture mean, one sentence each.

    Returns:
        ``{"shade": ..., "mark": ..., "path": ...}``.
    """
    got = "" if len(view.hits) == view.k else f" ({len(view.hits)} returned)"
    return {
        "shade": "Shade: cosine similarity of the query and the node's text, on a fixed scale from 0 "
        "(light) to 1 (dark).",
        "mark": f"Red numbered mark: one of the top {view.k} hits of policy '{view.policy}'{got}; the "
        "number is its rank, the figure beside it its score (the cosine).",
        "path": "Red outline and lines: the path from the root to each hit.",
    }
