"""What a deletion or a ``clear()`` makes the caches of the process forget.

A mixin of :class:`~shared_core.memories.base.HierarchicalMemory`: after a committed deletion, the
summariser's
sentence cache drops every sentence of the deleted messages that no live node still holds (one
implementation for the four memories; xMemory extends it for its own caches), and the lexical index
drops the removed and rewritten texts, and the IVF index over every node (when in use) re-encodes them;
after ``clear()`` the summariser is emptied. Nothing a deleted
message alone carried stays reachable in the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..models.base import Summarizer
from ..models.extractive import holds_words, split_sentences
from ..tree.nodes import Node, NodeStore

if TYPE_CHECKING:
    from ..search.ann import NeighbourSearch

__all__ = ["Forgetting"]


class Forgetting:
    """Mixin: the caches a deletion or ``clear()`` empties (see the module)."""

    #: a deletion makes the caches forget the sentences of every internal text it removes or rewrites,
    #: not only those of its messages (for internal texts not made of their messages' sentences, such
    #: as LLM-written records; see :meth:`_forgotten_texts`)
    forget_rewritten: ClassVar[bool] = False

    # set by HierarchicalMemory.__init__
    summarizer: Summarizer
    _store: NodeStore
    _lexical: Any
    _lex_dirty: set[int]
    _lex_removed: set[int]
    _ns: NeighbourSearch | None

    if TYPE_CHECKING:

        def _node_search(self) -> NeighbourSearch | None: ...

    def _forgotten_texts(self, changed: set[int], removed: set[int]) -> list[str]:
        """When the open transaction deletes messages (removes a leaf): the texts whose sentences the
        caches must forget; else (an add) ``[]``. Read from the node store's undo journal, before the
        commit closes it.

        These are each deleted message's text and its leaf's text; with :attr:`forget_rewritten`
        also the previous text of every internal node the deletion removed or rewrote. Without it an
        internal text is taken to be made of its messages' sentences (extractive summaries), so a
        sentence cached from it that holds forgotten words holds a whole sentence of a deleted message
        (or is its shortened form), which the summariser's ``forget`` finds by itself.
        """
        st = self._store
        saved = st._saved  # the nodes as the transaction found them (absent: created in it)
        leaves = [n for i in sorted(removed) if isinstance(n := saved.get(i), Node) and n.is_leaf]
        out = [t for n in leaves for t in (n.text, n.message.text if n.message else "") if t]
        if out and self.forget_rewritten:
            for nid in sorted(changed | removed):
                old = saved.get(nid)
                rewritten = nid in removed or (isinstance(old, Node) and st.nodes[nid].text != old.text)
                if isinstance(old, Node) and not old.is_leaf and old.text and rewritten:
                    out.append(old.text)
        return out

    def _forget_texts(self, texts: Sequence[str], changed: set[int], gone: set[int]) -> None:
        """After a committed deletion: caches of the process drop what the forgotten ``texts`` (see
        :meth:`_forgotten_texts`) left in them; ``changed`` are the nodes the deletion gave a new
        text, ``gone`` those it removed or left without text.

        The summariser's ``forget`` (when it has one) gets every sentence of ``texts`` that no live
        node's text holds (as a run of whole words), see :meth:`ExtractiveSummarizer.forget
        <shared_core.models.extractive.ExtractiveSummarizer.forget>`: a sentence still used keeps its
        vector, so nothing is embedded again. The lexical index, when built, drops these nodes' texts
        now; those rewritten are indexed again at the next query (as every change is). The IVF index
        over every node (past ``exact_search_max``) is brought up to date at once. Subclasses extend it
        for their own caches.
        """
        st = self._store
        forget = getattr(self.summarizer, "forget", None)
        if callable(forget):
            sentences = {x for t in texts if t for x in split_sentences(t)}
            # a rewritten text mostly keeps its sentences: test the deletion's new texts first
            fresh = "\n".join(st.nodes[i].text for i in changed if i in st.nodes)
            sentences = {x for x in sentences if not holds_words(fresh, x)}
            if sentences:
                live = "\n".join(n.text for n in st.nodes.values() if n.text)  # one scan of the texts
                dead = sorted(x for x in sentences if not holds_words(live, x))
                if dead:
                    forget(dead)
        if self._lexical is not None:
            # the rewritten nodes come back (marked dirty) at the next query; so do the nodes an earlier
            # change left dirty, whose indexed text is stale and may still hold the forgotten words
            self._lexical.remove(sorted(gone | changed | self._lex_dirty | self._lex_removed))
            self._lex_removed = set()
        if self._ns is not None and not self._ns.exhaustive:
            # the IVF index over every node takes the deletion now, not at the next query: the codes
            # of the removed nodes go and those of the rewritten ones are encoded again
            self._node_search()

    def _forget_all(self, old: NodeStore) -> None:
        """After ``clear()``: caches of the process drop what the texts of ``old`` (the cleared store)
        left in them. The summariser is emptied with its ``clear()``, else given every text of ``old``
        through its ``forget(texts)`` (when it has either). Subclasses extend it for their own caches."""
        clear = getattr(self.summarizer, "clear", None)
        if callable(clear):
            clear()
            return
        forget = getattr(self.summarizer, "forget", None)
        if callable(forget):
            texts = [n.text for n in old.nodes.values() if n.text]
            if texts:
                forget(texts)
