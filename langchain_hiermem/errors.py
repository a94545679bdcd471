"""Errors of the LangChain adapter that are not errors of the core.

This module imports nothing beyond ``shared_core.types``, so the errors can be raised and caught in an
installation without the optional LangChain packages.
"""

from __future__ import annotations

from shared_core.types import HierMemError

__all__ = ["AlgorithmUnavailableError", "MissingExtraError", "MissingUserError", "agents_extra_error"]


class AlgorithmUnavailableError(HierMemError, ImportError):
    """The core module of a memory algorithm cannot be imported in this installation."""


class MissingExtraError(HierMemError, ImportError):
    """A feature needs an optional dependency of hiermem that is not installed.

    Args:
        message: what is missing and the ``pip install`` command that adds it.
        extra: the hiermem extra that provides the dependency, e.g. ``"legacy"``.
        name: the module that could not be imported, e.g. ``"langchain_classic"``.

    Attributes:
        extra: as given.
        name: as given (``ImportError.name``).
    """

    def __init__(self, message: str, *, extra: str | None = None, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.extra = extra


class MissingUserError(HierMemError, LookupError):
    """An agent's memory was used in a run that names no user.

    :class:`~langchain_hiermem.middleware.HierMemMiddleware` and the tools of
    :func:`~langchain_hiermem.tools.create_memory_tools` keep each user's memory in that user's namespace;
    the user comes from the run's context (``agent.invoke(..., context={"user_id": ...})``) or its config
    (``config={"configurable": {"user_id": ...}}``). A run with neither is refused, never given a shared
    namespace.

    Args:
        message: what is missing and how to pass it.
        key: the context / configurable key that was looked up, e.g. ``"user_id"``.

    Attributes:
        key: as given.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def agents_extra_error(e: ModuleNotFoundError) -> MissingExtraError:
    """The error for a missing ``agents`` extra, from the failed import of ``langchain`` or ``langgraph``.

    Raises:
        ModuleNotFoundError: ``e`` itself when another module is missing (a real bug, not the extra).
    """
    if (e.name or "").split(".")[0] not in ("langchain", "langgraph"):
        raise e
    return MissingExtraError(
        "HierMemMiddleware and create_memory_tools need the packages langchain and langgraph, which are "
        'not installed: pip install "hiermem[agents]". The retriever and the LangGraph store '
        "(HierMemRetriever, HierMemStore) do not need them.",
        extra="agents",
        name=e.name,
    )
