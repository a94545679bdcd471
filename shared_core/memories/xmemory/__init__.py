"""xMemory: messages -> episodes -> semantics -> themes, guided split/merge, two-stage adaptive retrieval.

The memory keeps a four-level hierarchy (paper Sec. 3.2) in the shared node store::

    root ("" structural, level 4)
     +- theme (level 3): a group of related semantics, text = theme summary
     |   +- semantic (level 2): one persistent fact, linked to every episode it was distilled from
     |       +- episode (level 1): a contiguous block of messages, text = episode record
     |           +- message (level 0, leaf)
     +- episode (level 1) that is still open, or that yielded no semantic ("unfiled")

A semantic may come from several episodes (deduplication merges repeated facts): its node data lists
them (``episodes``) and the messages it was distilled from (``messages``); each episode lists its
semantics (``semantics``) and hangs under the first of them in the tree. Retrieval: ``top_down`` (the
default) returns messages, each scored by its own relevance plus that of the semantics distilled from
it; ``adaptive`` is the paper's two stages (Eq. 4 on themes and semantics, then uncertainty-gated
episodes); ``representative`` is Stage I; ``collapsed`` is flat top-k over every node.

The package shows the parts of the algorithm, one module each:

* :mod:`.objective`: the sparsity-semantics objective f(P) (Eq. 1-3) and candidate theme splits;
* :mod:`.knn`: the incrementally maintained kNN graphs over themes and semantics;
* :mod:`.rules`: the LLM-free rules (query terms, timestamps, rendering, fact extraction, theme summaries);
* :mod:`.construction`: episodes, semantics, themes (attach, split, merge);
* :mod:`.forgetting`: deletion, which rewrites every text made from a forgotten message;
* :mod:`.retrieval`: the policies: Stage I (Eq. 4), Stage II (uncertainty-gated inclusion), top_down;
* :mod:`.memory`: the :class:`XMemory` class (configuration, state, hits, statistics).

References:
    Hu et al., "Beyond RAG for Agent Memory: Retrieval by Decoupling and Aggregation" (xMemory):
    Sec. 3.2 (hierarchy, Eq. 1-3, attach/split/merge, kNN graphs), Sec. 3.3 (Eq. 4, Stage II),
    Sec. 5.3 (reassignment ratio), Appendix B (theme size cap 12), Appendix C (prompts).
"""

from .construction import LEVEL_NAMES
from .knn import KNNGraph
from .memory import XMemory
from .objective import (
    bell_regularizer,
    candidate_splits,
    nearest_theme_similarities,
    partition_objective,
    sem_score,
    sparsity_score,
    theme_cohesion,
)
from .retrieval import greedy_representatives, mean_nll
from .rules import (
    central_facts,
    extract_facts_rule,
    has_fact_sentence,
    parse_timestamp,
    query_terms,
    render_messages,
)

XMemory.__module__ = __name__  # its public home: ``shared_core.memories.xmemory.XMemory``

__all__ = [
    "LEVEL_NAMES",
    "KNNGraph",
    "XMemory",
    "bell_regularizer",
    "candidate_splits",
    "central_facts",
    "extract_facts_rule",
    "greedy_representatives",
    "has_fact_sentence",
    "mean_nll",
    "nearest_theme_similarities",
    "parse_timestamp",
    "partition_objective",
    "query_terms",
    "render_messages",
    "sem_score",
    "sparsity_score",
    "theme_cohesion",
]
