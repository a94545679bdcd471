"""``retrieve(max_tokens=...)`` on every memory: the budget picks greedily from the whole ranking.

The rule (``shared_core.memories.base.TokenBudget``): candidates are walked best first and one that would
exceed the
budget is skipped while the walk goes on. A budgeted retrieve must therefore return exactly what that
walk over the memory's unbudgeted ranking returns, up to ``k`` hits, however far down the ranking the
texts that fit are (the flat baselines of ``hiermem eval`` walk their whole ranking the same way).
"""

from __future__ import annotations

import pytest

from shared_core.memories.base import TokenBudget, count_tokens
from tests.support.memory import KINDS, HashEmbedder, make_memory

# LLM-free policies that rank every node (the greedy walk applies to their whole ranking)
RANKING_POLICIES = {
    "segtree": ["top_down", "collapsed"],
    "memtree": ["top_down", "collapsed"],
    "hat": ["top_down", "collapsed"],
    "xmemory": ["top_down", "collapsed"],
}


def _stream() -> list[str]:
    """60 long messages about gardens (the query's subject), then 12 short ones about nothing."""
    long = [
        f"Garden note {i}: the garden beds, garden soil and garden tools were sorted again "
        f"and the roses by the garden wall got water and compost number {i}."
        for i in range(60)
    ]
    short = [f"ok {i}." for i in range(12)]
    return long + short


def _greedy(hits, k: int, max_tokens: int):
    budget, out, seen = TokenBudget(max_tokens), [], set()
    for h in hits:
        if h.text in seen or not budget.take(h.text):
            continue
        seen.add(h.text)
        out.append(h.node_id)
        if len(out) >= k:
            break
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_budgeted_retrieve_walks_the_whole_ranking(kind):
    mem = make_memory(kind, HashEmbedder())
    mem.add(_stream())
    short_tokens = max(count_tokens(t) for t in _stream()[60:])
    long_tokens = min(count_tokens(t) for t in _stream()[:60])
    k = 4
    budget = k * short_tokens  # room for k short messages, never for a long one
    assert long_tokens > budget
    for policy in RANKING_POLICIES[kind]:
        full = mem.retrieve("garden", k=10_000, policy=policy)
        # the long messages rank first: the texts that fit lie below the first 3k + 8 candidates
        first_fit = next(i for i, h in enumerate(full) if count_tokens(h.text) <= budget)
        assert first_fit >= 3 * k + 8, (policy, first_fit)
        hits = mem.retrieve("garden", k=k, policy=policy, max_tokens=budget)
        assert [h.node_id for h in hits] == _greedy(full, k, budget), policy
        assert len(hits) == k, policy
        assert sum(count_tokens(h.text) for h in hits) <= budget


def test_token_budget_rule():
    b = TokenBudget(5)
    assert b.take("one two three") and not b.spent
    assert not b.take("four five six")  # would exceed: skipped, nothing counted
    assert b.take("four five") and b.spent
    assert not b.take("x")
    free = TokenBudget(None)
    assert all(free.take("word " * 500) for _ in range(3)) and not free.spent
