"""Summaries of ordered child texts by an LLM: the annotation of an internal tree node."""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from ..types import InvalidInputError, ModelError, Usage
from .base import LLM

__all__ = ["DEFAULT_SUMMARY_SYSTEM", "DEFAULT_SUMMARY_TEMPLATE", "LLMSummarizer", "render_children"]

DEFAULT_SUMMARY_SYSTEM = (
    "You maintain the notes of a long-term conversational memory. Be faithful to the given text and "
    "never add facts that are not in it."
)

DEFAULT_SUMMARY_TEMPLATE = (
    "Here are {n} consecutive segments of a conversation, oldest first:\n\n"
    "{children}\n\n"
    "Write one concise annotation (at most a few sentences) that covers what these segments say, as a "
    "whole. Keep names of people and places, dates, times and numbers exactly as they appear. "
    "Reply with the annotation only."
)

_EMPTY_RETRY_SUFFIX = "\n\nYour previous reply was empty. Reply now with the annotation text only."
_RESERVED = ("children", "n")


def render_children(texts: Sequence[str]) -> str:
    """Number the child texts in their order, one per block: ``[1] first``, ``[2] second``...

    Args:
        texts: the child texts, oldest first.

    Returns:
        The rendered block (a string); texts are stripped, inner newlines kept.

    References:
        SegTreeMem App. G: child segments are rendered in chronological order.
    """
    from ..prompts import fence

    return "\n".join(f"[{i}] {fence(t.strip())}" for i, t in enumerate(texts, start=1))


def _template_fields(template: str) -> set[str]:
    names: set[str] = set()
    try:
        for _, name, _, _ in string.Formatter().parse(template):
            if name is None:
                continue
            if name == "" or name.isdigit():
                raise InvalidInputError(
                    "The summary template may only use named placeholders such as {children}; "
                    "double literal braces as {{ and }}."
                )
            names.add(name.split(".")[0].split("[")[0])
    except ValueError as e:
        raise InvalidInputError(
            f"The summary template is not a valid format string ({e}); double literal braces as {{{{ }}}}."
        ) from None
    return names


class LLMSummarizer:
    """Summarise ordered child texts into one annotation with an LLM.

    The children are numbered in chronological order (``[1] ...``, ``[2] ...``) and put into the
    template's ``{children}`` placeholder; ``{n}`` is their number; any other placeholder is filled from
    the keyword ``fields`` given to :meth:`summarize`. The answer is stripped; an empty answer is asked
    for once more, then raises :class:`ModelError`.

    Args:
        llm: any :class:`~shared_core.models.base.LLM` (e.g. :class:`OpenAIChat`).
        template: user prompt with a ``{children}`` placeholder (literal braces doubled), default
            :data:`DEFAULT_SUMMARY_TEMPLATE`.
        system: system prompt, default :data:`DEFAULT_SUMMARY_SYSTEM`; ``None`` sends none.
        max_tokens: completion cap per call in tokens, default 256.

    Raises:
        InvalidInputError: ``llm`` lacks ``complete``/``acomplete``, the template has no ``{children}``
            or is malformed, or ``max_tokens`` is not a positive int.

    References:
        SegTreeMem App. G (internal-node annotation from the ordered child segments, rendered in
        chronological order); HAT §3.1 (aggregate function summarising the children); MemTree App. A.1.2.
    """

    def __init__(
        self,
        llm: LLM,
        template: str = DEFAULT_SUMMARY_TEMPLATE,
        system: str | None = DEFAULT_SUMMARY_SYSTEM,
        max_tokens: int = 256,
    ) -> None:
        if not (callable(getattr(llm, "complete", None)) and callable(getattr(llm, "acomplete", None))):
            raise InvalidInputError(
                "llm must provide complete() and acomplete() (the LLM protocol); wrap framework models "
                "with the LangChain / LlamaIndex adapters."
            )
        if not isinstance(template, str):
            raise InvalidInputError("template must be a string with a {children} placeholder.")
        fields = _template_fields(template)
        if "children" not in fields:
            raise InvalidInputError("The summary template needs a {children} placeholder.")
        if not (isinstance(max_tokens, int) and max_tokens >= 1):
            raise InvalidInputError(f"max_tokens must be a positive int, got {max_tokens!r}.")
        self.llm = llm
        self.template = template
        self.system = system
        self.max_tokens = max_tokens
        self._fields = fields

    def render(self, texts: Sequence[str], **fields: Any) -> str:
        """The prompt that :meth:`summarize` sends for these children and fields.

        Raises:
            InvalidInputError: no texts, a non-string or empty text, a reserved field name
                (``children``, ``n``) or a template placeholder without a value.
        """
        if isinstance(texts, str):
            raise InvalidInputError("summarize() takes a sequence of child texts; wrap one text as [text].")
        texts = list(texts)
        if not texts:
            raise InvalidInputError("Nothing to summarise: the list of child texts is empty.")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise InvalidInputError(f"Child text {i} must be a non-empty string.")
        for k in _RESERVED:
            if k in fields:
                raise InvalidInputError(f"{k!r} is filled by the summariser; do not pass it as a field.")
        missing = sorted(self._fields - set(fields) - set(_RESERVED))
        if missing:
            raise InvalidInputError(f"The summary template needs values for: {', '.join(missing)}.")
        return self.template.format(children=render_children(texts), n=len(texts), **fields)

    def summarize(self, texts: Sequence[str], **fields: Any) -> tuple[str, Usage]:
        """Summarise ``texts`` (oldest first) into one annotation.

        Args:
            texts: the child texts in chronological order (non-empty strings).
            **fields: values of the template's other placeholders.

        Returns:
            ``(summary, usage)``: the stripped annotation and the usage of the one or two LLM calls.

        Raises:
            InvalidInputError: see :meth:`render`.
            ModelError: the LLM failed, or answered empty twice.
        """
        prompt = self.render(texts, **fields)
        usage = Usage()
        for attempt in range(2):
            c = self.llm.complete(
                prompt if attempt == 0 else prompt + _EMPTY_RETRY_SUFFIX,
                system=self.system,
                max_tokens=self.max_tokens,
            )
            usage += c.usage
            text = (c.text or "").strip()
            if text:
                return text, usage
        raise ModelError("The LLM returned an empty summary twice; check the model and the prompt template.")

    async def asummarize(self, texts: Sequence[str], **fields: Any) -> tuple[str, Usage]:
        """Async :meth:`summarize` (uses ``llm.acomplete``). Args / Returns / Raises: the same."""
        prompt = self.render(texts, **fields)
        usage = Usage()
        for attempt in range(2):
            c = await self.llm.acomplete(
                prompt if attempt == 0 else prompt + _EMPTY_RETRY_SUFFIX,
                system=self.system,
                max_tokens=self.max_tokens,
            )
            usage += c.usage
            text = (c.text or "").strip()
            if text:
                return text, usage
        raise ModelError("The LLM returned an empty summary twice; check the model and the prompt template.")

    def __repr__(self) -> str:
        return f"LLMSummarizer(llm={self.llm!r}, max_tokens={self.max_tokens})"
