"""``hiermem bench --llm-cost``: LLM calls and tokens per message and per query of each memory's LLM mode.

Each memory is built with a real :class:`~shared_core.models.openai_models.OpenAIChat` whose
``base_url`` is an in-process OpenAI-protocol server
(:class:`~shared_core.bench.openai_server.ScriptedOpenAIServer`) answered by the deterministic
:class:`~shared_core.bench.llm_responder.ScriptedResponder`. The memories see real HTTP answers in their
prompts' formats, so they send exactly the requests they would send to a provider. The turns of each
conversation are added one per ``add`` (as a chat adds them), then questions are asked with the memory's
LLM retrieval policy (HAT ``agent``, xMemory ``adaptive``; SegTreeMem and MemTree retrieve without an
LLM). Two independent counts are kept and compared: what each memory reports (``AddReport.usage``,
``stats()["query_usage"]``) and what the server answered (requests, the ``usage`` it reported, the
characters of the prompts and answers).

Tokens are counted by the server: with a tiktoken encoding when one is bundled with an installed package
(LlamaIndex ships ``o200k_base`` and ``cl100k_base``; nothing is downloaded), else by whitespace split.
Message contents only: a provider adds a few tokens of chat framing per message. Characters are given
too, for converting to another tokenizer. Embeddings are made by the embedded ``LocalEmbedder`` (or the
embedder passed in) and are not counted.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..eval.data import Conversation, load_locomo, load_realmem_excerpt
from ..eval.protocol import SplitDataMissingError, resolve_split
from ..memories import HAT, MemTree, SegTreeMem, XMemory
from ..types import InvalidInputError, Usage
from .llm_responder import ScriptedResponder, prompt_kind
from .openai_server import ScriptedOpenAIServer, whitespace_tokens

__all__ = [
    "LLM_COST_MEMORIES",
    "LLM_COST_SCHEMA",
    "PAPER_FIGURES",
    "price_per_1000",
    "render_llm_cost_markdown",
    "run_llm_cost",
    "token_counter",
]

LLM_COST_SCHEMA = "hiermem.bench.llm_cost/1"

LLM_COST_MEMORIES: dict[str, str] = {
    "segtree_pointwise": 'SegTreeMem(llm=..., compat="pointwise_llm")',
    "segtree_batch": 'SegTreeMem(llm=..., compat="batch_llm")',
    "memtree": "MemTree(llm=...)",
    "hat": "HAT(llm=...), retrieve(policy='agent')",
    "xmemory": "XMemory(llm=...), retrieve(policy='adaptive')",
}
"""The measured configurations (memory constructor defaults otherwise) and their query policies."""

_QUERY_POLICY = {"hat": "agent", "xmemory": "adaptive"}
_SHAPE = ("nodes", "leaves", "internal_nodes", "max_depth", "mean_branching")

PAPER_FIGURES: dict[str, dict[str, str]] = {
    "segtree_pointwise": {
        "per_message": "3.97 calls per leaf on LoCoMo (3.93 RealMem, 4.13 LongMemEval)",
        "per_query": "not given (retrieval makes no LLM call)",
        "source": "SegTreeMem paper, App. C.1 Table 5",
    },
    "segtree_batch": {
        "per_message": "1.95 calls per leaf on LoCoMo (1.94 RealMem, 1.88 LongMemEval); about 10x the "
        "tokens of the cosine model",
        "per_query": "not given (retrieval makes no LLM call)",
        "source": "SegTreeMem paper, App. C.1 Table 5; Sec. 5 (RQ2)",
    },
    "memtree": {
        "per_message": "3.27 ± 2.38 calls per insertion on Multihop RAG (MemTree paper); 3.67 per leaf on "
        "LoCoMo (SegTreeMem paper's run)",
        "per_query": "not given (collapsed retrieval makes no LLM call)",
        "source": "MemTree paper, App. A.3.4 Table A.2; SegTreeMem paper, App. C.1 Table 5",
    },
    "hat": {
        "per_message": "not given",
        "per_query": "not given (Sec. 6 names the HTTP calls of the agent as a cost, without figures)",
        "source": "HAT paper, Sec. 6",
    },
    "xmemory": {
        "per_message": "not given",
        "per_query": "4,711 (Qwen3-8B), 5,540 (Llama-3.1-8B), 6,581 (GPT-5 nano) tokens per LoCoMo "
        "question, end to end: retrieval, answer generation and auxiliary calls",
        "source": "xMemory paper, Sec. 5 'Efficiency', Table 1",
    },
}
"""The papers' own cost figures, quoted beside the measured ones ("not given" where a paper has none)."""

_TIKTOKEN_URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}
TOKENIZERS = ("auto", "whitespace", *_TIKTOKEN_URLS)


# --------------------------------------------------------------------------- tokens and prices
def _bundled_tiktoken_dir(name: str) -> Path | None:
    """A directory holding tiktoken's cached file of encoding ``name`` (LlamaIndex bundles it), or None."""
    try:
        spec = importlib.util.find_spec("llama_index.core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    key = hashlib.sha1(_TIKTOKEN_URLS[name].encode()).hexdigest()
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "_static" / "tiktoken_cache"
        if (d / key).is_file():
            return d
    return None


def _tiktoken_count(enc: Any) -> Callable[[str], int]:
    def count(text: str) -> int:
        return len(enc.encode(text, disallowed_special=()))

    return count


def token_counter(name: str = "auto") -> tuple[Callable[[str], int], str]:
    """A token counter and its name.

    Args:
        name: ``"auto"`` (default: ``o200k_base`` when bundled, else whitespace), ``"whitespace"``,
            ``"o200k_base"`` (GPT-4o's encoding) or ``"cl100k_base"`` (GPT-4's). A tiktoken encoding is
            loaded only from a file bundled with an installed package (LlamaIndex's cache), never
            downloaded.

    Returns:
        ``(count, name)``: ``count(text) -> int`` and the name of what it counts (``"whitespace"`` or
        ``"tiktoken <encoding>"``).

    Raises:
        InvalidInputError: an unknown name, or a tiktoken encoding that is not available offline.
    """
    if name not in TOKENIZERS:
        raise InvalidInputError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {name!r}.")
    if name == "whitespace":
        return whitespace_tokens, "whitespace"
    for enc_name in ("o200k_base",) if name == "auto" else (name,):
        d = _bundled_tiktoken_dir(enc_name)
        if d is None or importlib.util.find_spec("tiktoken") is None:
            continue
        import tiktoken

        old = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(d)
        try:
            enc = tiktoken.get_encoding(enc_name)
        finally:
            if old is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = old
        return _tiktoken_count(enc), f"tiktoken {enc_name}"
    if name == "auto":
        return whitespace_tokens, "whitespace"
    raise InvalidInputError(
        f"The tiktoken encoding {name!r} is not available offline (install tiktoken and llama-index-core, "
        "which bundles it), or use --tokenizer whitespace."
    )


def price_per_1000(
    prompt_tokens: float, completion_tokens: float, price_in: float | None, price_out: float | None
) -> float | None:
    """US dollars per 1,000 units (messages or queries) at per-token rates.

    Args:
        prompt_tokens: mean prompt tokens per unit.
        completion_tokens: mean completion tokens per unit.
        price_in: USD per 1,000,000 prompt tokens (``None``: no price).
        price_out: USD per 1,000,000 completion tokens (``None``: same as ``price_in``).

    Returns:
        ``1000 * (prompt_tokens * price_in + completion_tokens * price_out) / 1e6``, or ``None`` without
        ``price_in``.

    Raises:
        InvalidInputError: a negative or non-finite price.
    """
    if price_in is None:
        return None
    out = price_in if price_out is None else price_out
    for v, what in ((price_in, "price_in"), (out, "price_out")):
        if not (np.isfinite(v) and v >= 0):
            raise InvalidInputError(f"{what} must be a finite number >= 0 (USD per 1M tokens), got {v!r}.")
    return 1000.0 * (prompt_tokens * price_in + completion_tokens * out) / 1e6


# --------------------------------------------------------------------------- data
def default_conversations(data: str | Path | None = None) -> tuple[list[Conversation], str]:
    """The LoCoMo dev conversations (``data``, else ``$HIERMEM_DATA``, else ``../shared/data``), or the
    bundled RealMem excerpt when they are absent. Returns ``(conversations, description)``."""
    try:
        files = resolve_split("dev", data, kinds=("locomo",))["locomo"]
    except SplitDataMissingError:
        return [load_realmem_excerpt()], "the bundled RealMem excerpt (LoCoMo dev not found)"
    convs = [c for f in files for c in load_locomo(f)]
    return convs, "LoCoMo dev (" + ", ".join(c.id for c in convs) + ")"


# --------------------------------------------------------------------------- counting
@dataclass
class _Tally:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_chars: int = 0
    completion_chars: int = 0

    def add_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        for r in rows:
            self.calls += 1
            self.prompt_tokens += r["prompt_tokens"]
            self.completion_tokens += r["completion_tokens"]
            self.prompt_chars += r["prompt_chars"]
            self.completion_chars += r["completion_chars"]

    def per(self, n: int) -> dict[str, float | None]:
        keys = ("calls", "prompt_tokens", "completion_tokens", "prompt_chars", "completion_chars")
        return {k: (getattr(self, k) / n if n else None) for k in keys}


def _llm_usage(u: Usage) -> dict[str, int]:
    return {"calls": u.llm_calls, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}


def _build(name: str, llm: Any, embedder: Any) -> Any:
    if name == "segtree_pointwise":
        return SegTreeMem(embedder, llm, compat="pointwise_llm")
    if name == "segtree_batch":
        return SegTreeMem(embedder, llm, compat="batch_llm")
    if name == "memtree":
        return MemTree(embedder, llm)
    if name == "hat":
        return HAT(embedder, llm)
    if name == "xmemory":
        return XMemory(embedder, llm)
    raise InvalidInputError(f"Unknown memory {name!r}; choose from {', '.join(LLM_COST_MEMORIES)}.")


def _percentile(values: Sequence[int], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def measure_memory(
    name: str,
    conversations: Sequence[Conversation],
    server: ScriptedOpenAIServer,
    embedder: Any,
    *,
    messages: int | None = None,
    queries: int = 20,
    model: str = "gpt-4o-mini",
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """LLM cost of one memory over ``conversations`` (a fresh memory each), counted twice.

    Args:
        name: a key of :data:`LLM_COST_MEMORIES`.
        conversations: the conversations; each one's first ``messages`` turns are added one per ``add``,
            then its first ``queries`` questions are asked.
        server: the running server; its ``default_chat`` and ``served`` record are used (it is reset).
        embedder: the embedder of the memories (not counted).
        messages: turns per conversation (``None``: all).
        queries: questions per conversation, >= 0.
        model: the model name sent in the requests.
        progress: ``(label, done, total)`` after every message and question.

    Returns:
        A dict: ``messages``, ``queries``, ``construction`` and ``query`` (each with ``server``: per-unit
        means of ``calls``, ``prompt_tokens``, ``completion_tokens``, ``prompt_chars``,
        ``completion_chars``; ``memory``: totals the memory reported; ``server_totals``; ``match``: the
        two agree), ``calls_per_message`` percentiles (p50, p95, max), ``by_prompt`` (server calls and
        tokens per prompt kind), ``trees`` (each conversation's tree: ``nodes``, ``leaves``,
        ``internal_nodes``, ``max_depth``, ``mean_branching``) and ``seconds``.

    Raises:
        InvalidInputError: an unknown ``name`` or a bad count.
        ModelError: a request failed (it should not with the scripted server).
    """
    from ..models.openai_models import OpenAIChat

    if queries < 0 or (messages is not None and messages < 1):
        raise InvalidInputError("messages must be >= 1 (or None) and queries >= 0.")
    responder = ScriptedResponder(embedder=embedder)
    counter = server.token_counter
    server.reset()
    server.token_counter = counter
    server.default_chat = responder
    llm = OpenAIChat(model, base_url=server.base_url, api_key="hiermem-bench", max_retries=0, timeout=60.0)
    build, ask = _Tally(), _Tally()
    mem_build, mem_ask = Usage(), Usage()
    per_message: list[int] = []
    n_msgs = n_q = 0
    trees: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    total = sum(
        min(len(c.messages), messages or len(c.messages)) + min(len(c.queries), queries)
        for c in conversations
    )
    done = 0
    try:
        for conv in conversations:
            mem = _build(name, llm, embedder)
            turns = conv.messages[: messages or len(conv.messages)]
            for m in turns:
                before = len(server.served)
                rep = mem.add(m, allow_duplicate_ids=True)
                rows = [r for r in server.served[before:] if r["endpoint"] == "chat"]
                build.add_rows(rows)
                per_message.append(len(rows))
                mem_build += rep.usage
                n_msgs += 1
                done += 1
                if progress:
                    progress(name, done, total)
            flush = getattr(mem, "flush", None)
            if callable(flush):  # xMemory closes its open episode
                before = len(server.served)
                mem_build += flush().usage
                build.add_rows([r for r in server.served[before:] if r["endpoint"] == "chat"])
            policy = _QUERY_POLICY.get(name)
            for q in conv.queries[:queries]:
                before = len(server.served)
                u0 = Usage(**mem.stats()["query_usage"])
                mem.retrieve(q.question, policy=policy)
                u1 = Usage(**mem.stats()["query_usage"])
                mem_ask += Usage(
                    llm_calls=u1.llm_calls - u0.llm_calls,
                    prompt_tokens=u1.prompt_tokens - u0.prompt_tokens,
                    completion_tokens=u1.completion_tokens - u0.completion_tokens,
                )
                ask.add_rows([r for r in server.served[before:] if r["endpoint"] == "chat"])
                n_q += 1
                done += 1
                if progress:
                    progress(name, done, total)
            st = mem.stats()
            trees.append({"conversation": conv.id, **{k: st.get(k) for k in _SHAPE}})
    finally:
        llm.close()
    by_prompt: dict[str, dict[str, int]] = {}
    for r in server.served:
        if r["endpoint"] != "chat":
            continue
        b = by_prompt.setdefault(
            prompt_kind(r["system"]), {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
        )
        b["calls"] += 1
        b["prompt_tokens"] += r["prompt_tokens"]
        b["completion_tokens"] += r["completion_tokens"]

    def part(t: _Tally, u: Usage, n: int) -> dict[str, Any]:
        server_totals = {
            "calls": t.calls,
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
        }
        return {
            "server": t.per(n),
            "server_totals": {
                **server_totals,
                "prompt_chars": t.prompt_chars,
                "completion_chars": t.completion_chars,
            },
            "memory": _llm_usage(u),
            "match": server_totals == _llm_usage(u),
        }

    return {
        "memory": name,
        "config": LLM_COST_MEMORIES[name],
        "query_policy": _QUERY_POLICY.get(name, getattr(mem, "default_policy", None)),
        "messages": n_msgs,
        "queries": n_q,
        "construction": part(build, mem_build, n_msgs),
        "query": part(ask, mem_ask, n_q),
        "calls_per_message": {
            "p50": _percentile(per_message, 50),
            "p95": _percentile(per_message, 95),
            "max": max(per_message, default=None),
        },
        "by_prompt": by_prompt,
        "responder_counts": dict(responder.counts),
        "trees": trees,
        "seconds": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------------- the run
def run_llm_cost(
    *,
    memories: Sequence[str] | None = None,
    messages: int | None = None,
    queries: int = 20,
    price_in: float | None = None,
    price_out: float | None = None,
    tokenizer: str = "auto",
    data: str | Path | None = None,
    conversations: Sequence[Conversation] | None = None,
    embedder: Any = None,
    out: str | Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Measure the LLM cost of each memory's LLM mode; write ``llm_cost.json`` and ``llm_cost.md``.

    Args:
        memories: keys of :data:`LLM_COST_MEMORIES` (``"segtree"`` stands for both SegTreeMem modes);
            ``None``: all.
        messages: turns added per conversation (``None``: all).
        queries: questions asked per conversation after its turns, default 20.
        price_in: USD per 1M prompt tokens for the price columns (``None``: no prices).
        price_out: USD per 1M completion tokens (``None``: ``price_in``).
        tokenizer: how the server counts tokens, see :func:`token_counter` (default ``"auto"``).
        data: data root holding ``locomo/`` (default ``$HIERMEM_DATA``, else ``../shared/data``); without
            LoCoMo dev the bundled RealMem excerpt is used.
        conversations: conversations to use instead of ``data``.
        embedder: the memories' embedder (default: the embedded ``LocalEmbedder``; not counted).
        out: output directory (``None``: write nothing).
        progress: ``(label, done, total)`` callback.

    Returns:
        The document written to ``llm_cost.json``: ``schema``, ``data``, ``tokenizer``, ``embedder``,
        ``prices``, ``results`` (one :func:`measure_memory` dict per memory, with ``price_per_1000``
        messages and queries) and ``papers`` (:data:`PAPER_FIGURES`).

    Raises:
        InvalidInputError: an unknown memory or tokenizer, a bad count or price.
    """
    names: list[str] = []
    for m in memories or LLM_COST_MEMORIES:
        m = m.strip().lower()
        for n in ("segtree_pointwise", "segtree_batch") if m == "segtree" else (m,):
            if n not in LLM_COST_MEMORIES:
                raise InvalidInputError(
                    f"Unknown memory {m!r} for --llm-cost; choose from segtree, "
                    f"{', '.join(LLM_COST_MEMORIES)}."
                )
            if n not in names:
                names.append(n)
    price_per_1000(0, 0, price_in, price_out)  # validates the prices
    count, tok_name = token_counter(tokenizer)
    if conversations is None:
        convs, source = default_conversations(data)
    else:
        convs, source = list(conversations), "given conversations"
    if embedder is None:
        from ..models.local import LocalEmbedder

        embedder = LocalEmbedder()
    doc: dict[str, Any] = {
        "schema": LLM_COST_SCHEMA,
        "data": {
            "source": source,
            "conversations": [c.id for c in convs],
            "messages_per_conversation": messages,
            "queries_per_conversation": queries,
        },
        "tokenizer": tok_name,
        "embedder": type(embedder).__name__ + " (embeddings not counted)",
        "model": "gpt-4o-mini (the name sent; the scripted server answers)",
        "prices": {"usd_per_1m_prompt": price_in, "usd_per_1m_completion": price_out},
        "results": {},
        "papers": PAPER_FIGURES,
    }
    with ScriptedOpenAIServer() as server:
        server.token_counter = count
        for n in names:
            r = measure_memory(
                n, convs, server, embedder, messages=messages, queries=queries, progress=progress
            )
            for unit in ("construction", "query"):
                per = r[unit]["server"]
                r[unit]["price_per_1000"] = (
                    None
                    if per["calls"] is None
                    else price_per_1000(per["prompt_tokens"], per["completion_tokens"], price_in, price_out)
                )
            doc["results"][n] = r
    if out is not None:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "llm_cost.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        (d / "llm_cost.md").write_text(render_llm_cost_markdown(doc), encoding="utf-8")
    return doc


def _f(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def _usd(x: float | None) -> str:
    return "—" if x is None else f"${x:,.4f}" if x < 1 else f"${x:,.2f}"


def render_llm_cost_markdown(doc: dict[str, Any]) -> str:
    """The Markdown report of a :func:`run_llm_cost` document: per message, per query, the papers."""
    p = doc["prices"]
    price = (
        "no price given (--price-in / --price-out)"
        if p["usd_per_1m_prompt"] is None
        else f"USD {p['usd_per_1m_prompt']} per 1M prompt tokens, "
        f"{p['usd_per_1m_completion'] if p['usd_per_1m_completion'] is not None else p['usd_per_1m_prompt']}"
        " per 1M completion tokens"
    )
    lines = [
        "# LLM cost per message and per query",
        "",
        f"Data: {doc['data']['source']}; turns per conversation: "
        f"{doc['data']['messages_per_conversation'] or 'all'}, questions per conversation: "
        f"{doc['data']['queries_per_conversation']}. Tokens: {doc['tokenizer']} (message contents, no "
        f"chat framing). Embedder: {doc['embedder']}. Price: {price}.",
        "",
        "Answers come from a deterministic stand-in model (summaries: the first words of each summarised "
        "part, cut to the length the prompt asks for; segment and episode decisions: the embedder's cosine "
        "at SegTreeMem's 0.25 and xMemory's 0.4 thresholds; the HAT agent walks to the leaf sharing most "
        "words with the question), so calls and prompt tokens are the memories' own and completion tokens "
        "are the stand-in's. 'memory = server': the usage the memory reported equals what the server "
        "answered.",
        "",
        "## Construction, per message added",
        "",
        "| memory | messages | LLM calls | p50 / p95 / max calls | prompt tokens | completion tokens "
        "| prompt chars | USD per 1,000 messages | memory = server |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for n, r in doc["results"].items():
        c, s, pc = r["construction"], r["construction"]["server"], r["calls_per_message"]
        lines.append(
            f"| {n} | {r['messages']:,} | {_f(s['calls'])} | {_f(pc['p50'], 0)} / {_f(pc['p95'], 0)} / "
            f"{_f(pc['max'], 0)} | {_f(s['prompt_tokens'], 0)} | {_f(s['completion_tokens'], 0)} | "
            f"{_f(s['prompt_chars'], 0)} | {_usd(c['price_per_1000'])} | {'yes' if c['match'] else 'NO'} |"
        )
    lines += [
        "",
        "## Retrieval, per query",
        "",
        "| memory | policy | queries | LLM calls | prompt tokens | completion tokens | prompt chars "
        "| USD per 1,000 queries | memory = server |",
        "|---|---|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for n, r in doc["results"].items():
        q, s = r["query"], r["query"]["server"]
        lines.append(
            f"| {n} | {r['query_policy']} | {r['queries']:,} | {_f(s['calls'])} | "
            f"{_f(s['prompt_tokens'], 0)} | "
            f"{_f(s['completion_tokens'], 0)} | {_f(s['prompt_chars'], 0)} | {_usd(q['price_per_1000'])} | "
            f"{'yes' if q['match'] else 'NO'} |"
        )
    lines += ["", "## Calls by prompt", "", "| memory | prompt | calls | prompt tokens | completion tokens |"]
    lines.append("|---|---|---:|---:|---:|")
    for n, r in doc["results"].items():
        for kind, b in sorted(r["by_prompt"].items()):
            lines.append(
                f"| {n} | {kind} | {b['calls']:,} | {b['prompt_tokens']:,} | {b['completion_tokens']:,} |"
            )
    lines += ["", "## Trees built", ""]
    lines += [
        "| memory | conversation | leaves | nodes | max depth | mean branching |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for n, r in doc["results"].items():
        for t in r.get("trees", []):
            lines.append(
                f"| {n} | {t['conversation']} | {t['leaves']:,} | {t['nodes']:,} | {t['max_depth']} | "
                f"{_f(t['mean_branching'])} |"
            )
    lines += ["", "## The papers' own figures", "", "| memory | per message | per query | source |"]
    lines.append("|---|---|---|---|")
    for n in doc["results"]:
        f = doc["papers"].get(n, {})
        lines.append(
            f"| {n} | {f.get('per_message', 'not given')} | {f.get('per_query', 'not given')} | "
            f"{f.get('source', '')} |"
        )
    return "\n".join(lines) + "\n"
