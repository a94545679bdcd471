"""Shared fixtures (the OpenAI-protocol test server, the real local embedder, the shared data path, a
private PostgreSQL server) and the ``integration`` marker, given to every test under tests/integration/."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

from tests.support import SHARED_DATA
from tests.support.openai_server import openai_server  # noqa: F401  (fixture)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

INTEGRATION = Path(__file__).resolve().parent / "integration"


def _deselects_integration(config: pytest.Config) -> bool:
    """Whether the ``-m`` expression deselects every test marked ``integration``, whatever its other
    markers (as ``-m "not integration"`` does)."""
    markexpr = config.getoption("markexpr", "") or ""
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression

        expr = Expression.compile(markexpr)
    except Exception:  # a malformed expression: pytest reports it; collect as usual
        return False
    others = sorted(set(re.findall(r"[A-Za-z_][\w.]*", markexpr)) - {"and", "or", "not", "integration"})
    for values in itertools.product((False, True), repeat=len(others)):
        marks = dict(zip(others, values), integration=True)
        if expr.evaluate(lambda name, /, marks=marks, **kwargs: marks.get(name, False)):
            return False
    return True


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m "not integration"``, tests/integration/ is not even imported: its modules import what
    only they need (torch, servers' clients), which would cost the quick loop seconds for nothing."""
    if collection_path == INTEGRATION and _deselects_integration(config):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration/ ``integration`` (``-m "not integration"`` is the quick
    loop)."""
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def local_embedder():
    """The real embedded embedder (all-MiniLM-L6-v2), loaded once per test session."""
    from shared_core.models.local import LocalEmbedder

    return LocalEmbedder()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ../shared/data; skips the test when it is absent (a user's clone has no ../shared)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at ../shared/data (looked in {SHARED_DATA.name}); CI provides it")
    return SHARED_DATA


@pytest.fixture(scope="session")
def pg_cluster():
    """A private PostgreSQL server for the test session (see tests/support/pg.py): a cluster in a temporary
    directory on a Unix socket, run as the ``postgres`` system user when the tests run as root. Skips
    only where no PostgreSQL server binaries can be had."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")
    from tests.support.pg import PgCluster, find_bindir, server_user

    bindir = find_bindir()
    if bindir is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found: install postgresql-15 "
            "(scripts/setup.sh does when run as root) or set HIERMEM_PG_BINDIR"
        )
    try:
        server_user()
    except LookupError as e:
        pytest.skip(f"cannot run a PostgreSQL server: {e}")
    cluster = PgCluster(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_url(pg_cluster):
    """URL of a new, empty database on the session's PostgreSQL server (``connect_timeout=3``)."""
    return pg_cluster.url(pg_cluster.create_database(), connect_timeout="3")


@pytest.fixture
def docs_env(monkeypatch, openai_server, local_embedder):  # noqa: F811 - the fixture above
    """Environment of a block: OpenAI clients on the test server, the session's local embedder."""
    import shared_core.models.local as local

    openai_server.embed_dim = 1536
    url = openai_server.base_url
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_BASE", url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-docs-test")
    # tiktoken (LangChain's OpenAIEmbeddings) downloads its encodings on first use; LlamaIndex bundles
    # the same files in a tiktoken cache directory, which keeps the test offline
    try:
        import llama_index.core

        cache = Path(llama_index.core.__file__).parent / "_static" / "tiktoken_cache"
        if cache.is_dir():
            monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    except ImportError:
        pass

    original = local.LocalEmbedder

    class SharedLocalEmbedder(original):  # type: ignore[misc, valid-type]
        def __new__(cls, *args, **kwargs):
            if not args and not kwargs:
                return local_embedder  # not a SharedLocalEmbedder: __init__ is not called again
            return original(*args, **kwargs)

    monkeypatch.setattr(local, "LocalEmbedder", SharedLocalEmbedder)
    import shared_core

    if "LocalEmbedder" in vars(shared_core):
        monkeypatch.setattr(shared_core, "LocalEmbedder", SharedLocalEmbedder)
    return openai_server
