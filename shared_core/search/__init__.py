"""Search machinery shared by every memory: the FAISS node index (:mod:`.index`), approximate neighbour
search (:mod:`.ann`), lexical BM25 (:mod:`.lexical`), relevance fusion (:mod:`.relevance`), message
filters (:mod:`.filters`), node vectors (:mod:`.vectors`) and the ranking of nodes into hits
(:mod:`.ranking`).

Layer above :mod:`shared_core.tree` and :mod:`shared_core.models`.
"""
