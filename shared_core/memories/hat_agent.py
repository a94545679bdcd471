"""HAT's memory agent: the LLM walks the tree (HAT paper, Sec. 3.2), and its BFS / DFS baselines.

:class:`MemoryAgent` is a mixin of :class:`~shared_core.memories.hat.HAT`: navigation among neighbours
(``left`` / ``right`` / ``up`` / ``down``), the agent's decisions parsed from the LLM's answers
(:func:`parse_action`), and the traversals :meth:`MemoryAgent.traverse` returns as :class:`Traversal`.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..models.parsing import complete_parsed, parse_label
from ..prompts import fence
from ..prompts import hat as P
from ..types import InvalidInputError, LLMRequiredError, UnknownPolicyError, Usage

__all__ = [
    "ACTIONS",
    "LLM_FREE",
    "PREVIEW_CHARS",
    "TRAVERSALS",
    "MemoryAgent",
    "Traversal",
    "layer_sizes",
    "parse_action",
]

TRAVERSALS = ("agent", "bfs", "dfs")
#: LLM-free policies (possible defaults of a memory without an LLM).
LLM_FREE = ("top_down", "greedy", "collapsed")
#: What ``greedy`` returns: the leaves its beam reaches, or the peaks of the similarity descent.
#: The memory agent's actions (the paper's set {U, D, L, R, S, O, U} with distinct names).
ACTIONS = ("up", "down", "left", "right", "reset", "sufficient", "insufficient")
#: Characters of a neighbour's text shown to the agent (the current node is shown in full).
PREVIEW_CHARS = 300

_CHILD = r"\s*[:#=>-]*\s*(?:to\s+)?(?:child\s*)?(?:(?:no\.?|number|#)\s*)?"
_DOWN = re.compile(r"(?<![0-9A-Za-z_])down" + _CHILD + r"(\d+)(?![0-9])", re.IGNORECASE)
# A negation, up to three filler words ("is not yet sufficient", "don't go up"), then an action word
# (with its child number for "down").
_NEGATED = re.compile(
    r"(?<![0-9A-Za-z_])(?:not|never|no|nor|cannot|[A-Za-z]+n['\u2019]t)"
    r"(?:\s+(?:yet|quite|really|fully|entirely|completely|totally|be|been|go|move|going|moving|to)){0,3}"
    r"\s+(?P<label>sufficient|insufficient|up|down|left|right|reset)(?![0-9A-Za-z_])"
    r"(?:" + _CHILD + r"\d+(?![0-9]))?",
    re.IGNORECASE,
)


def _resolve_negations(text: str) -> str:
    """``text`` with every negated action rewritten: "not sufficient" becomes "insufficient", any other
    negated action ("don't go up", "not down 2", "not insufficient") is removed."""

    def repl(m: re.Match[str]) -> str:
        return " insufficient " if m.group("label").lower() == "sufficient" else " "

    return _NEGATED.sub(repl, text)


def parse_action(text: str, valid: Sequence[str] = ACTIONS, n_children: int = 0) -> tuple[str, int | None]:
    """Parse the memory agent's answer strictly into one action.

    The answer must name exactly one of :data:`ACTIONS` (whole word, case-insensitive; see
    :func:`~shared_core.models.parsing.parse_label`); ``down`` must carry one child number
    ``N`` in ``1..n_children`` (``"down 2"``, ``"down: 2"``, ``"down to child 2"``). A negated action
    is read as what it says: "not sufficient" (also "is not yet sufficient", "isn't sufficient") is
    ``insufficient``; any other negated action ("don't go up", "not down 2", "not insufficient") names
    no action, so ``"don't go up, go down 2"`` is ``down 2`` and ``"not insufficient"`` alone is refused.

    Args:
        text: the LLM's answer.
        valid: the actions possible at the current node.
        n_children: number of children of the current node (for ``down N``).

    Returns:
        ``(action, N)`` with ``N`` the 1-based child number for ``down`` and ``None`` otherwise.

    Raises:
        ValueError: no action, several actions, an action not possible here, or a missing or
            out-of-range child number (the message says what to answer instead).

    References:
        HAT paper Sec. 3.2 (action set A).
    """
    if not isinstance(text, str):
        raise ValueError(f"Expected answer text, got {type(text).__name__}.")
    text = _resolve_negations(text)
    label = parse_label(text, ACTIONS)
    if label not in valid:
        raise ValueError(f"{label!r} is not possible at this node; answer with one of: {', '.join(valid)}.")
    if label != "down":
        return label, None
    nums = {int(m.group(1)) for m in _DOWN.finditer(text)}
    if len(nums) != 1:
        raise ValueError(f"Say which child to go down to: 'down N' with N from 1 to {n_children}.")
    i = nums.pop()
    if not 1 <= i <= n_children:
        raise ValueError(f"There is no child {i}; 'down N' needs N from 1 to {n_children}.")
    return "down", i


@dataclass(frozen=True)
class Traversal:
    """The trace of one LLM traversal of a HAT (``agent``, ``bfs`` or ``dfs``).

    Attributes:
        policy: ``"agent"``, ``"bfs"`` or ``"dfs"``.
        outcome: ``"sufficient"`` (a node was judged sufficient: ``node_id``), ``"insufficient"`` (the
            agent said so, its answer could not be parsed even after a retry, or BFS/DFS visited every
            node without a yes), ``"budget"`` (``max_steps`` decisions without a conclusion) or
            ``"empty"`` (the memory is empty).
        node_id: the node judged sufficient, else ``None``.
        path: node ids visited, in order (the agent: the start node, then one per move).
        actions: the agent's actions (``"down 2"``, ``"up"``...) or BFS/DFS answers (``"yes"``/``"no"``).
        steps: LLM decisions taken (each at most 2 LLM calls: one retry on an unparseable answer).
        parse_failures: decisions whose answer could not be parsed after the retry (fallback applied).
        usage: LLM usage of the traversal.
    """

    policy: str
    outcome: str
    node_id: int | None
    path: list[int] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    steps: int = 0
    parse_failures: int = 0
    usage: Usage = field(default_factory=Usage)


def _preview(text: str, chars: int = PREVIEW_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= chars:
        return text
    cut = text[: chars - 1]
    if " " in cut[chars // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip() + "…"


def layer_sizes(n: int, M: int) -> list[int]:
    """Sizes of the layers of a HAT over ``n`` leaves, bottom (leaves) first.

    Layer sizes follow from the ``⌊i/M⌋`` rule: ``s_0 = n``, ``s_{l+1} = ceil(s_l / M)`` until a layer
    of one node (the root). The number of layers is ``1`` for ``n = 1`` and ``ceil(log_M n) + 1`` above.

    Args:
        n: number of leaves (int >= 0).
        M: memory length (int >= 2).

    Returns:
        The sizes, e.g. ``layer_sizes(5, 2) == [5, 3, 2, 1]``; ``[]`` for ``n = 0``.

    References:
        HAT paper Sec. 3.1 (layer invariant ``j = ⌊i/M⌋``).
    """
    if n <= 0:
        return []
    sizes = [n]
    while sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // M))
    return sizes


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


class MemoryAgent:
    """Mixin: HAT's LLM traversals (see the module)."""

    def _left(self, nid: int) -> int | None:
        """The neighbour to the left in the same layer (possibly under another parent)."""
        st = self._store
        parent = st.nodes[nid].parent
        if parent is None:
            return None
        sib = st.nodes[parent].children
        i = sib.index(nid)
        if i > 0:
            return sib[i - 1]
        pl = self._left(parent)
        return st.nodes[pl].children[-1] if pl is not None else None

    def _right(self, nid: int) -> int | None:
        """The neighbour to the right in the same layer (possibly under another parent)."""
        st = self._store
        parent = st.nodes[nid].parent
        if parent is None:
            return None
        sib = st.nodes[parent].children
        i = sib.index(nid)
        if i < len(sib) - 1:
            return sib[i + 1]
        pr = self._right(parent)
        return st.nodes[pr].children[0] if pr is not None else None

    def _position(self, nid: int) -> tuple[int, int]:
        """``(layer from the root, position in the layer)`` of a node, both 0-based."""
        st = self._store
        chain = [nid, *st.ancestors(nid)][::-1]
        pos = 0
        for parent, child in zip(chain, chain[1:]):
            pos = pos * self.M + st.nodes[parent].children.index(child)
        return len(chain) - 1, pos

    def _describe(self, nid: int) -> str:
        st = self._store
        depth, pos = self._position(nid)
        sizes = layer_sizes(st.n_leaves, self.M)[::-1]
        node = st.nodes[nid]
        if node.is_leaf:
            what = "a leaf: original conversation text"
        else:
            what = f"{'the root, ' if depth == 0 else ''}a summary of {len(node.children)} children"
        return (
            f"layer {depth + 1} of {len(sizes)} from the top, "
            f"node {pos + 1} of {sizes[depth]} from the left; {what}"
        )

    def traverse(self, query: str, policy: str | None = None, *, max_steps: int | None = None) -> Traversal:
        """Run one LLM traversal and return its trace.

        Args:
            query: the query text (non-empty).
            policy: ``"agent"`` (default), ``"bfs"`` or ``"dfs"``.
            max_steps: LLM decisions at most; default the memory's ``max_steps`` (10) for the agent and
                its ``search_steps`` for BFS / DFS (``None``: no budget, every node may be asked). Each
                decision is one LLM call, two when the first answer cannot be parsed.

        Returns:
            The :class:`Traversal` (outcome, node judged sufficient, visited path, actions, usage).

        Raises:
            InvalidInputError: empty query or ``max_steps < 1``.
            UnknownPolicyError: a policy other than agent / bfs / dfs.
            LLMRequiredError: the memory has no LLM.

        The agent starts at the root; at each step it sees the query, the current node's text, its
        children (numbered, shortened to 300 characters), its left and right neighbours in the same
        layer, the actions taken so far and the steps left, and answers one action. Moves that are not
        possible at the node (``up`` at the root, ``down`` at a leaf, ``left`` at the left end, ...)
        are not offered and are rejected by the parser. An answer that cannot be parsed is asked once
        more with the parse error; if it still cannot be parsed the walk stops as ``insufficient``
        (never a guessed move). BFS (layer by layer) and DFS (pre-order) visit from the root, left
        (older) to right (newer), and ask whether the node's text is enough to answer (YES/NO; an
        unparseable answer counts as NO); a node whose text equals one already asked (a one-child
        node's copy of its child) is not asked again.

        References:
            HAT paper Sec. 3.2 (memory agent, MDP over tree nodes, actions), Sec. 4.3 (BFS, DFS: "at
            every step ask gpt if this information is enough ... If it tells okay, we stop there").
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query must be a non-empty string.")
        policy = policy or "agent"
        if policy not in TRAVERSALS:
            raise UnknownPolicyError(f"traverse() runs one of {', '.join(TRAVERSALS)}; got {policy!r}.")
        if self.llm is None:
            raise LLMRequiredError(
                f"policy {policy!r} needs an LLM; build the memory with llm=... "
                f"or use one of the LLM-free policies ({', '.join(LLM_FREE)})."
            )
        if max_steps is not None:
            steps: int | None = _positive_int(max_steps, "max_steps")
        else:
            steps = self.max_steps if policy == "agent" else self.search_steps
        with self._lock:
            if self._store.root is None:
                return Traversal(policy, "empty", None)
            if policy == "agent":
                assert steps is not None
                trace = self._agent(query, steps)
            else:
                trace = self._search(query, policy, steps)
            self._query_usage += trace.usage
            return trace

    def _agent(self, query: str, max_steps: int) -> Traversal:
        st = self._store
        assert self.llm is not None and st.root is not None
        cur = st.root
        path, actions = [cur], []
        usage = Usage()
        failures = 0
        for step in range(max_steps):
            node = st.nodes[cur]
            kids = node.children
            left, right = self._left(cur), self._right(cur)
            valid = [
                a
                for a, ok in (
                    ("up", node.parent is not None),
                    ("down", bool(kids)),
                    ("left", left is not None),
                    ("right", right is not None),
                    ("reset", cur != st.root),
                    ("sufficient", True),
                    ("insufficient", True),
                )
                if ok
            ]
            shown = [f"down N (N = 1..{len(kids)})" if a == "down" else a for a in valid]
            children = (
                "\n".join(
                    P.AGENT_CHILD.format(i=i, text=fence(_preview(st.nodes[c].text)))
                    for i, c in enumerate(kids, 1)
                )
                if kids
                else "(none: this is a leaf)"
            )
            prompt = P.AGENT_USER.format(
                query=fence(query),
                position=self._describe(cur),
                node=fence(node.text),
                children=children,
                left=f"<<< {fence(_preview(st.nodes[left].text))} >>>" if left is not None else P.AGENT_NONE,
                right=f"<<< {fence(_preview(st.nodes[right].text))} >>>"
                if right is not None
                else P.AGENT_NONE,
                history=", ".join(actions[-8:]) or "none",
                steps_left=max_steps - step,
                actions=", ".join(shown),
            )
            res = complete_parsed(
                self.llm,
                prompt,
                functools.partial(parse_action, valid=valid, n_children=len(kids)),
                system=P.AGENT_SYSTEM,
                max_tokens=16,
                fallback=("insufficient", None),
            )
            usage += res.usage
            failures += 0 if res.ok else 1
            action, arg = res.value
            actions.append(f"down {arg}" if action == "down" else action)
            done = dict(path=path, actions=actions, steps=step + 1, parse_failures=failures, usage=usage)
            if action == "sufficient":
                return Traversal("agent", "sufficient", cur, **done)
            if action == "insufficient":
                return Traversal("agent", "insufficient", None, **done)
            if action == "up":
                nxt = node.parent
            elif action == "down":
                nxt = kids[arg - 1]
            elif action == "left":
                nxt = left
            elif action == "right":
                nxt = right
            else:
                nxt = st.root
            assert nxt is not None
            cur = nxt
            path.append(cur)
        return Traversal("agent", "budget", None, path, actions, max_steps, failures, usage)

    def _order(self, policy: str) -> Iterator[int]:
        st = self._store
        assert st.root is not None
        if policy == "bfs":
            queue = deque([st.root])
            while queue:
                nid = queue.popleft()
                yield nid
                queue.extend(st.nodes[nid].children)
        else:
            stack = [st.root]
            while stack:
                nid = stack.pop()
                yield nid
                stack.extend(reversed(st.nodes[nid].children))

    def _search(self, query: str, policy: str, max_steps: int | None) -> Traversal:
        st = self._store
        assert self.llm is not None
        asked: set[str] = set()
        path: list[int] = []
        answers: list[str] = []
        usage = Usage()
        failures = 0
        for nid in self._order(policy):
            text = st.nodes[nid].text
            if not text or text in asked:
                continue
            if max_steps is not None and len(path) >= max_steps:
                return Traversal(policy, "budget", None, path, answers, len(path), failures, usage)
            asked.add(text)
            res = complete_parsed(
                self.llm,
                P.SUFFICIENT_USER.format(query=fence(query), node=fence(text)),
                lambda t: parse_label(t, ("YES", "NO")),
                system=P.SUFFICIENT_SYSTEM,
                max_tokens=3,
                fallback="NO",
            )
            usage += res.usage
            failures += 0 if res.ok else 1
            path.append(nid)
            answers.append(res.value.lower())
            if res.value == "YES":
                return Traversal(policy, "sufficient", nid, path, answers, len(path), failures, usage)
        return Traversal(policy, "insufficient", None, path, answers, len(path), failures, usage)
