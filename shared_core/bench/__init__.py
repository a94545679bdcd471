"""``hiermem bench``: what the memories cost (an application above the library).

* :mod:`.core`: algorithm overhead with model calls taken out, and embedded-default throughput;
* :mod:`.stubs`: the stub models and streams the benchmarks use;
* :mod:`.namespaces`: evicted namespaces of a ``MemoryStore`` (cold open, RSS per resident message);
* :mod:`.workloads`: conversation turns, ingest cost, growth with the default summariser;
* :mod:`.processes`: several processes on one PostgreSQL store;
* :mod:`.llm_cost`: LLM calls and tokens per message and per query of each memory's LLM mode, through
  :mod:`.openai_server` (an in-process OpenAI-protocol server, also the test suite's) answered by the
  stand-in model of :mod:`.llm_responder`.

The names of :mod:`.core` are re-exported here (``from shared_core.bench import run_bench``).
"""

from . import core
from .core import *  # noqa: F403  (the names of .core, as before the package split)

__all__ = list(core.__all__)
