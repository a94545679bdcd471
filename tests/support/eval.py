"""Helpers of the evaluation tests: a cheap bag-of-words embedder and the ``--jsonl`` input writer."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_core.eval.data import Conversation, Query
from shared_core.types import Message


class BowEmbedder:
    """Deterministic bag-of-words embedder (hashed lower-cased words, 64-d): fast and topical."""

    dim = 64
    name = "bow-64"

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
            out[i, 0] += 1e-3  # never a zero vector
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def write_jsonl(path: Path, conv: Conversation) -> Path:
    """The conversation as a ``hiermem eval --jsonl`` file (queries at their positions)."""
    lines = []
    for i, m in enumerate([*conv.messages, None]):
        for q in conv.queries:
            if q.position == i:
                lines.append(
                    {
                        "question": q.question,
                        "answer": q.answer,
                        "evidence": q.evidence,
                        "category": q.category,
                        "id": q.id,
                    }
                )
        if m is not None:
            lines.append(
                {
                    "text": m.text,
                    "speaker": m.speaker,
                    "id": m.id,
                    "timestamp": m.timestamp,
                    "metadata": m.metadata,
                }
            )
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path


def tiny_conversation(skipped_evidence: int = 0, meta: dict | None = None) -> Conversation:
    """Two sessions about fruit and travel; three queries asked online (two mid-way, one at the end);
    ``skipped_evidence`` and ``meta`` (default ``{"source": "jsonl"}``) as a loader reports them."""
    s1 = ["I love bananas and mangoes.", "My sister grows apples in Kent.", "We made banana bread today."]
    s2 = [
        "Next month I fly to Lisbon.",
        "The flight to Lisbon leaves at nine.",
        "I booked a hotel by the sea.",
    ]
    msgs = [
        Message(t, speaker="Ann", id=f"D1:{i + 1}", timestamp="1 May 2023", metadata={"session": 1})
        for i, t in enumerate(s1)
    ] + [
        Message(t, speaker="Ann", id=f"D2:{i + 1}", timestamp="9 May 2023", metadata={"session": 2})
        for i, t in enumerate(s2)
    ]
    queries = [
        Query("Who grows apples?", "her sister", ["D1:2"], 4, position=3, id="q0"),
        Query("Where does Ann fly next month?", "Lisbon", ["D2:1", "D2:2"], 1, position=6, id="q1"),
        Query("What did they bake?", "banana bread", ["D1:3"], 4, position=6, id="q2"),
    ]
    return Conversation(
        "tiny",
        msgs,
        queries,
        skipped_evidence=skipped_evidence,
        meta={"source": "jsonl"} if meta is None else meta,
    )


def aggregate_of(values: dict[str, float], kind: str, build: str | None = None) -> dict:
    """A per-method aggregate whose every compared metric takes the given per-dataset values."""
    shifts = (("evidence_recall", 0.0), ("span_recall", 0.1), ("answer_token_recall", -0.2))
    by_ds = {
        lab: {"overall": {m: v + d for m, d in shifts}, "by_category": {}, "construction": {}}
        for lab, v in values.items()
    }
    pooled = float(np.mean(list(values.values())))
    return {
        "build": build or kind,
        "kind": kind,
        "overall": {m: pooled + d for m, d in shifts},
        "by_dataset": by_ds,
    }


def _turns(*pairs: tuple[str, str] | tuple[str, str, bool]) -> list[dict]:
    out = []
    for p in pairs:
        t = {"role": p[0], "content": p[1]}
        if len(p) > 2 and p[2]:
            t["has_answer"] = True
        out.append(t)
    return out


def tiny_longmemeval() -> list[dict]:
    """Three LongMemEval-shaped questions over small haystacks (dates out of order, a repeated session, an
    empty turn): a single-session-user one, a multi-session one with two evidence sessions and an
    abstention one (``_abs``)."""
    filler = _turns(("user", "Can you suggest a pasta recipe?"), ("assistant", "Try spaghetti with garlic."))
    garden = _turns(
        ("user", "I planted tomatoes in my garden."),
        ("assistant", "Tomatoes love sun."),
        ("user", "My dog Rex dug up the tomato bed.", True),
    )
    lisbon = _turns(("user", "I booked a flight to Lisbon for June.", True), ("assistant", "Enjoy Lisbon!"))
    porto = _turns(
        ("user", ""), ("user", "I also booked a train to Porto.", True), ("assistant", "Nice trip.")
    )
    return [
        {
            "question_id": "q_user",
            "question_type": "single-session-user",
            "question": "What is the name of my dog?",
            "answer": "Rex",
            "question_date": "2023/06/01 (Thu) 10:00",
            "haystack_session_ids": ["filler_1", "answer_g_1", "filler_1"],
            "haystack_dates": ["2023/05/20 (Sat) 09:00", "2023/05/02 (Tue) 08:30", "2023/05/25 (Thu) 12:00"],
            "haystack_sessions": [filler, garden, filler],
            "answer_session_ids": ["answer_g_1"],
        },
        {
            "question_id": "q_multi",
            "question_type": "multi-session",
            "question": "Which places did I book a flight and a train to?",
            "answer": "Lisbon and Porto",
            "question_date": "2023/06/10 (Sat) 18:00",
            "haystack_session_ids": ["answer_t_2", "filler_2", "answer_t_1"],
            "haystack_dates": ["2023/05/09 (Tue) 11:00", "2023/05/05 (Fri) 07:00", "2023/05/01 (Mon) 09:15"],
            "haystack_sessions": [porto, filler, lisbon],
            "answer_session_ids": ["answer_t_1", "answer_t_2"],
        },
        {
            "question_id": "q_user_abs",
            "question_type": "single-session-user",
            "question": "What is the name of my cat?",
            "answer": "You did not mention a cat.",
            "question_date": "2023/06/01 (Thu) 10:00",
            "haystack_session_ids": ["filler_3", "answer_c_abs_1"],
            "haystack_dates": ["2023/05/20 (Sat) 09:00", "2023/05/02 (Tue) 08:30"],
            "haystack_sessions": [filler, garden],
            "answer_session_ids": ["answer_c_abs_1"],
        },
    ]


def write_longmemeval(path: Path, items: list[dict] | None = None) -> Path:
    """A LongMemEval-shaped JSON file (default :func:`tiny_longmemeval`)."""
    path.write_text(json.dumps(tiny_longmemeval() if items is None else items), encoding="utf-8")
    return path


class SpyEmbedder(BowEmbedder):
    """:class:`BowEmbedder` recording every text it embeds, in call order (``texts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed(texts)


class OneThreadEmbedder(BowEmbedder):
    """:class:`BowEmbedder` that raises unless FAISS, BLAS/OpenMP (threadpoolctl) and ``OMP_NUM_THREADS``
    are pinned to one thread in the process embedding."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import os

        import faiss
        from threadpoolctl import threadpool_info

        pools = {p["internal_api"]: p["num_threads"] for p in threadpool_info()}
        if faiss.omp_get_max_threads() != 1 or any(n != 1 for n in pools.values()):
            raise RuntimeError(f"threads not pinned: faiss {faiss.omp_get_max_threads()}, pools {pools}")
        if os.environ.get("OMP_NUM_THREADS") != "1":
            raise RuntimeError("OMP_NUM_THREADS is not 1")
        return super().embed(texts)


class LockedEmbedder(BowEmbedder):
    """:class:`BowEmbedder` holding a lock: it cannot be pickled (sent to a worker process)."""

    def __init__(self) -> None:
        import threading

        super().__init__()
        self.lock = threading.Lock()
