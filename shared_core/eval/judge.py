"""Answer generation from retrieved memory and a binary LLM judge (question-answering evaluation).

Per query and method: the LLM writes a short answer from the retrieved texts only
(:data:`~shared_core.prompts.eval.ANSWER_USER`), then the same or another LLM grades it against the gold
answer with a strict 0/1 verdict (:data:`~shared_core.prompts.eval.JUDGE_USER`), parsed by
:func:`~shared_core.models.parsing.parse_label` with one corrective retry. An unparseable verdict is
recorded as ``None`` (never guessed) and left out of the accuracy. ROUGE-L recall of the answer against
the gold answer is reported beside it, as the MemTree paper does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models.base import LLM
from ..models.parsing import complete_parsed, parse_label
from ..prompts import eval as P
from ..types import InvalidInputError, Usage
from .metrics import rouge_l_recall

__all__ = ["AnswerJudge", "JudgedAnswer", "format_context", "parse_llm_spec"]

NOTHING_RETRIEVED = "(nothing was retrieved)"


def format_context(texts: Sequence[str], max_chars: int | None = None) -> str:
    """The retrieved texts as the numbered context of the answer prompt.

    Args:
        texts: retrieved texts, best first.
        max_chars: optional cap on the context length in characters; excerpts past it are left out
            (whole excerpts only). Default ``None`` (no cap).

    Returns:
        ``"[1] first\\n[2] second ..."``, or ``"(nothing was retrieved)"`` when there is nothing.
    """
    lines: list[str] = []
    used = 0
    for i, t in enumerate(texts, 1):
        line = P.ANSWER_ITEM.format(i=i, text=str(t).strip())
        if max_chars is not None and lines and used + len(line) > max_chars:
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines) if lines else NOTHING_RETRIEVED


def parse_llm_spec(spec: str) -> tuple[str, str]:
    """Split an ``--llm`` value ``"openai:MODEL"`` into ``(provider, model)``.

    Args:
        spec: e.g. ``"openai:gpt-4o-mini"``.

    Returns:
        ``("openai", "gpt-4o-mini")``.

    Raises:
        InvalidInputError: no ``provider:model`` form, or a provider other than ``openai`` (any
            OpenAI-compatible server is reached with ``openai:`` and a base URL).
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise InvalidInputError(
            f"--llm must look like 'openai:MODEL' (e.g. openai:gpt-4o-mini), got {spec!r}."
        )
    provider, model = spec.split(":", 1)
    provider, model = provider.strip().lower(), model.strip()
    if provider != "openai":
        raise InvalidInputError(
            f"Unknown LLM provider {provider!r}; use 'openai:MODEL' (with --base-url for any "
            "OpenAI-compatible server)."
        )
    if not model:
        raise InvalidInputError("--llm needs a model name after 'openai:', e.g. openai:gpt-4o-mini.")
    return provider, model


@dataclass
class JudgedAnswer:
    """The LLM's answer to one query and the judge's verdict.

    Attributes:
        answer: the generated answer text.
        verdict: 1 (the answer responds like the gold answer), 0 (it does not), or ``None`` when the
            judge's output could not be parsed after the retry.
        rouge_l_recall: ROUGE-L recall of the answer against the gold answer, in [0, 1].
        judge_raw: the judge's raw outputs (one per attempt).
        usage: model usage of both steps (LLM calls, tokens, seconds).
    """

    answer: str
    verdict: int | None
    rouge_l_recall: float
    judge_raw: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form."""
        return {
            "answer": self.answer,
            "verdict": self.verdict,
            "rouge_l_recall": self.rouge_l_recall,
            "judge_raw": list(self.judge_raw),
            "usage": self.usage.to_dict(),
        }


class AnswerJudge:
    """Writes an answer from retrieved texts and grades it against the gold answer with an LLM judge.

    Args:
        llm: the answering LLM (any :class:`~shared_core.models.base.LLM`, e.g. ``OpenAIChat``).
        judge: the grading LLM, default ``llm``.
        answer_max_tokens: completion cap of the answer in tokens, default 128.
        context_max_chars: cap on the retrieved context in characters (whole excerpts), default 24,000.
        retries: corrective retries of an unparseable verdict, default 1.

    Raises:
        InvalidInputError: an object without ``complete``, or a non-positive cap.

    References:
        MemTree paper (Rezazadeh et al.), Sec. 4 (steps 3-4: answer from the retrieved information, then
        a binary accuracy judged by an LLM against the reference, or ROUGE-L recall without a judge) and
        Appendix A.2.2 (answer generation and binary accuracy prompts; restated in our own words in
        :mod:`shared_core.prompts.eval`).
    """

    def __init__(
        self,
        llm: LLM,
        judge: LLM | None = None,
        *,
        answer_max_tokens: int = 128,
        context_max_chars: int = 24_000,
        retries: int = 1,
    ) -> None:
        for name, m in (("llm", llm), ("judge", judge)):
            if m is not None and not callable(getattr(m, "complete", None)):
                raise InvalidInputError(
                    f"{name} must have a complete(prompt) method, got {type(m).__name__}."
                )
        if llm is None:
            raise InvalidInputError("AnswerJudge needs an LLM; pass llm=OpenAIChat(...).")
        for name, v in (("answer_max_tokens", answer_max_tokens), ("context_max_chars", context_max_chars)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}.")
        self.llm = llm
        self.judge = judge if judge is not None else llm
        self.answer_max_tokens = answer_max_tokens
        self.context_max_chars = context_max_chars
        self.retries = int(retries)

    def answer(self, question: str, texts: Sequence[str]) -> tuple[str, Usage]:
        """Generate an answer to ``question`` from the retrieved ``texts`` only.

        Args:
            question: the query.
            texts: the retrieved texts, best first.

        Returns:
            ``(answer text stripped, usage)``.

        Raises:
            ModelError: the provider failed.
        """
        prompt = P.ANSWER_USER.format(
            question=question.strip(), context=format_context(texts, self.context_max_chars)
        )
        c = self.llm.complete(prompt, system=P.ANSWER_SYSTEM, max_tokens=self.answer_max_tokens)
        return c.text.strip(), c.usage

    def grade(self, question: str, reference: str, prediction: str) -> tuple[int | None, Usage, list[str]]:
        """The judge's 0/1 verdict on ``prediction`` against ``reference``.

        Returns:
            ``(verdict or None when unparseable after the retries, usage, raw answers)``.

        Raises:
            ModelError: the provider failed.
        """
        prompt = P.JUDGE_USER.format(
            question=question.strip(),
            reference=str(reference).strip() or "(none)",
            prediction=prediction.strip() or "(empty)",
        )
        return self._verdict(prompt, P.JUDGE_SYSTEM, P.JUDGE_LABELS, P.JUDGE_LABELS[1])

    def _verdict(
        self, prompt: str, system: str, labels: Sequence[str], correct: str
    ) -> tuple[int | None, Usage, list[str]]:
        """The judge's label among ``labels`` as 1 (``correct``) or 0, ``None`` when unparseable after
        :attr:`retries` corrective retries; with the usage and the raw answers."""
        res = complete_parsed(
            self.judge,
            prompt,
            lambda t: parse_label(t, labels),
            system=system,
            max_tokens=4,
            retries=self.retries,
            fallback=None,
        )
        verdict = None if res.value is None else int(res.value == correct)
        return verdict, res.usage, res.raw

    @staticmethod
    def _judged(
        reference: str, answer: str, usage: Usage, graded: tuple[int | None, Usage, list[str]]
    ) -> JudgedAnswer:
        """A :class:`JudgedAnswer` of an answer (and its usage) and its grading."""
        verdict, u2, raw = graded
        return JudgedAnswer(
            answer=answer,
            verdict=verdict,
            rouge_l_recall=rouge_l_recall(reference, answer),
            judge_raw=raw,
            usage=usage + u2,
        )

    def __call__(self, question: str, reference: str, texts: Sequence[str]) -> JudgedAnswer:
        """Answer from ``texts``, then grade the answer.

        Args:
            question: the query.
            reference: the gold answer.
            texts: the retrieved texts, best first.

        Returns:
            A :class:`JudgedAnswer`.

        Raises:
            ModelError: the provider failed.
        """
        ans, u1 = self.answer(question, texts)
        return self._judged(reference, ans, u1, self.grade(question, reference, ans))
