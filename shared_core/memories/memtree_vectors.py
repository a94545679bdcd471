"""MemTree's path summary vectors: re-embedded when their text has drifted, moved along otherwise.

An insertion rewrites every summary on its path (``Aggregate(c_v, c_new | n)``) and the paper embeds
each rewritten text again (Sec. 3.1, ``e_v <- f_emb(c_v')``): with the extractive aggregate on LoCoMo
turns that is about 4.7 summaries of 500 characters per message, 80% of the add's CPU. The
:class:`AnchoredSummaryVectors` mixin keeps, per summary, an *anchor*: the composed vector ``c_a`` (the
normalised mean of its sentences' cached vectors, :meth:`ExtractiveSummarizer.compose
<shared_core.models.extractive.ExtractiveSummarizer.compose>`) and the embedded vector ``e_a`` of the
text it was last embedded with. A rewritten summary with composed vector ``c`` gets

* ``e_a + c - c_a``, normalised (:func:`anchored_vector`), when ``cos(c, c_a) >= reembed_cosine``;
* else ``f_emb(text)``, and ``(c, f_emb(text))`` becomes its anchor.

A summary without an anchor (new, after a deletion below it, after a load, a rollback or a reset) is
embedded. The composed vectors cost no model call when the summary's sentences are cached (the
summariser embedded them to choose them), so a path costs the embeddings of its drifted summaries only.
The measurements (cost, recall, tree shape) are in docs/evaluation.md, "MemTree: re-embedding drifted
summaries only".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..search.index import inner_products, normalize_rows, unit_row_norm
from ..types import InvalidInputError, check_finite

if TYPE_CHECKING:
    from ..models.base import Summarizer
    from ..types import Usage

__all__ = ["AnchoredSummaryVectors", "Anchor", "anchored_vector", "check_reembed_cosine"]

#: ``(c_a, e_a)``: the composed and the embedded vector of the text a summary was last embedded with,
#: float32 ``(dim,)`` unit rows each.
Anchor = tuple[np.ndarray, np.ndarray]


def check_reembed_cosine(value: Any) -> float | None:
    """``reembed_cosine`` checked: ``None`` or a number in ``(0, 1]``.

    Raises:
        InvalidInputError: anything else (the message names the accepted values).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidInputError(
            f"reembed_cosine must be None (re-embed every rewritten summary: the paper's) or a cosine in "
            f"(0, 1], got {value!r}."
        )
    value = check_finite(value, "reembed_cosine")
    if not 0.0 < value <= 1.0:
        raise InvalidInputError(
            f"reembed_cosine must be None (re-embed every rewritten summary: the paper's) or a cosine in "
            f"(0, 1], got {value}."
        )
    return value


def anchored_vector(anchor: Anchor, composed: np.ndarray) -> np.ndarray:
    """The vector of a summary moved from its anchor: ``normalise(e_a + c - c_a)``.

    Args:
        anchor: ``(c_a, e_a)``, float32 ``(dim,)`` each.
        composed: ``c``, the composed vector of the summary's current text, float32 ``(dim,)``.

    Returns:
        float32 ``(dim,)``, a unit row (elementwise float32 arithmetic, then :func:`normalize_rows`).
    """
    c_a, e_a = anchor
    moved = (np.asarray(e_a, np.float32) + np.asarray(composed, np.float32)) - np.asarray(c_a, np.float32)
    return normalize_rows(moved[None, :])[0]


class AnchoredSummaryVectors:
    """Mixin of :class:`~shared_core.memories.memtree.MemTree`: the vectors of an insertion's rewritten
    summaries (see the module). ``reembed_cosine = None`` (or a summariser without ``compose`` sharing
    the memory's embedder, e.g. an LLM aggregate, or ``annotation_vectors="composed"``) embeds every
    rewritten summary, as the paper does."""

    reembed_cosine: float | None
    annotation_vectors: str
    summarizer: Summarizer

    if TYPE_CHECKING:

        def _annotation_vecs(self, texts: Sequence[str], usage: Usage) -> np.ndarray: ...

        def _summarizer_hook(self, name: str) -> Any: ...

    def _init_anchors(self) -> None:
        self._anchors: dict[int, Anchor] = {}  # summary id -> its anchor; not saved
        # True after a load, a rollback or another process's commits dropped the anchors while summaries
        # existed: some summaries may then hold vectors moved from anchors this process no longer has
        self._anchors_lost = False

    def _forget_anchors(self, nids: Any = None) -> None:
        """Drop the anchors of ``nids`` (every anchor when ``None``): those summaries are embedded the next
        time an insertion rewrites them."""
        if nids is None:
            self._anchors.clear()
        else:
            for nid in nids:
                self._anchors.pop(nid, None)

    def _summary_vecs(
        self, nids: Sequence[int | None], texts: Sequence[str], usage: Usage
    ) -> tuple[np.ndarray, list[Anchor | None]]:
        """Vectors of rewritten summaries ``nids`` (``None`` = a new node) with their new ``texts``.

        Returns:
            ``(vectors float32 (n, dim) with unit rows, anchors)``: per text the anchor to keep for it
            once the tree is changed (the text was embedded), or ``None`` (moved from its anchor, which
            stays). Nothing of the memory is changed here.
        """
        compose = self._summarizer_hook("compose")
        texts = list(texts)
        if self.reembed_cosine is None or self.annotation_vectors != "embedded" or compose is None:
            return self._annotation_vecs(texts, usage), [None] * len(texts)
        comp, u = compose(texts)
        usage += u
        comp = normalize_rows(np.asarray(comp, dtype=np.float32))
        out: list[np.ndarray | None] = [None] * len(texts)
        todo: list[int] = []
        for j, nid in enumerate(nids):
            a = self._anchors.get(nid) if nid is not None else None
            if a is not None and self._close(a[0], comp[j]):
                out[j] = anchored_vector(a, comp[j])
            else:
                todo.append(j)
        anchors: list[Anchor | None] = [None] * len(texts)
        if todo:
            for j, v in zip(todo, self._annotation_vecs([texts[j] for j in todo], usage)):
                out[j] = v
                anchors[j] = (comp[j], np.asarray(v, dtype=np.float32))
        return np.stack(out), anchors  # type: ignore[arg-type]

    def _close(self, c_a: np.ndarray, c: np.ndarray) -> bool:
        """``cos(c, c_a) >= reembed_cosine``, on the exactly rounded inner product (the same on every CPU)."""
        assert self.reembed_cosine is not None
        s = inner_products(c_a[None, :], c, row_norm=unit_row_norm(c.shape[0]))
        return float(s[0]) >= self.reembed_cosine
