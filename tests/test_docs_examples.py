"""Every code block of README.md and docs/*.md runs here, one test case per block (id ``file:line``).

Which fenced blocks are code: ``python``, ``bash``, ``sh``, ``shell``, ``console`` and ``sql``. Every other
language (``text``, ``json``, no language...) is an output sample or a configuration excerpt and is not
collected.

Marker convention: a block that cannot run here carries, on the last non-blank line before its fence, the
visible comment ``<!-- docs-test: skip (the reason) -->``; its test case is reported as skipped with that
reason (a skipped ``python`` block is still compiled, so a syntax error fails). A code block without a
marker that cannot run fails.

How the blocks run:

- ``python``: the blocks of one page share one namespace and one temporary working directory, in page
  order, because a page's blocks build on each other (``mem``, ``index``, ``create_agent`` imported by an
  earlier block). A test case first runs the page's earlier unskipped blocks that have not run yet in
  this process (so ``-k`` on one block works), then its own block; an exception fails it (and, as
  "an earlier block fails", the page's later blocks).
- Models: the embedded embedder is the real ``LocalEmbedder``; constructing one with no arguments returns
  the test session's instance (``local_embedder``) instead of loading it again. OpenAI clients (hiermem's
  ``OpenAIChat`` / ``OpenAIEmbedder``, LangChain's, LlamaIndex's) reach the repository's OpenAI-protocol
  test server through ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` / ``OPENAI_API_KEY``; its embeddings have
  1536 dimensions, as text-embedding-3-small.
- PostgreSQL: every ``postgresql://...`` URL in a block's text is replaced by the URL of a new database
  of the test session's private PostgreSQL server (``pg_url``); ``sql`` blocks run on that server.
- ``bash`` / ``sh`` / ``shell``: run with ``bash -euo pipefail`` in the page's working directory, the
  test interpreter's ``bin`` first on ``PATH`` (``hiermem``, ``python``) and the repository on
  ``PYTHONPATH``; ``console``: the lines starting with ``$ `` are the commands.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.docs import (
    BLOCKS,
    CODE_LANGS,
    DOC_FILES,
    MARKER,
    PYTHON,
    ROOT,
    SHELL,
    Block,
    extract_blocks,
)

PG_URL = re.compile(r"postgresql://[^\s\"'`]+")


# --------------------------------------------------------------------------- per-page state
@dataclass
class Page:
    workdir: Path
    namespace: dict
    done: set[int]  # lines of the python blocks already run


_PAGES: dict[Path, Page] = {}


def _page(block: Block, tmp_path_factory: pytest.TempPathFactory) -> Page:
    page = _PAGES.get(block.path)
    if page is None:
        workdir = tmp_path_factory.mktemp(block.path.stem)
        page = _PAGES[block.path] = Page(workdir, {"__name__": f"docs_{block.path.stem}"}, set())
    return page


@pytest.fixture
def docs_env(monkeypatch, openai_server, local_embedder):
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


def _with_pg(code: str, request: pytest.FixtureRequest) -> str:
    if not PG_URL.search(code):
        return code
    url = request.getfixturevalue("pg_url")
    return PG_URL.sub(url, code)


def _run_python(block: Block, page: Page, request: pytest.FixtureRequest) -> None:
    code = _with_pg(block.code, request)
    exec(compile(code, block.id, "exec"), page.namespace)  # noqa: S102 - the docs' own examples


def _shell_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _run_shell(script: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=_shell_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{script}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


def _console_commands(code: str) -> str:
    cmds: list[str] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            cmds.append(line[2:])
        elif cmds and cmds[-1].endswith("\\"):
            cmds[-1] += "\n" + line
    return "\n".join(cmds) + "\n"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block(block: Block, request, tmp_path_factory, docs_env) -> None:
    if block.skip is not None:
        if block.lang in PYTHON:
            compile(block.code, block.id, "exec")  # a skipped example still has to be Python
        pytest.skip(f"{block.id}: {block.skip}")
    page = _page(block, tmp_path_factory)
    cwd = os.getcwd()
    os.chdir(page.workdir)
    try:
        if block.lang in PYTHON:
            earlier = [
                b
                for b in BLOCKS
                if b.path == block.path and b.lang in PYTHON and b.line < block.line and b.skip is None
            ]
            for b in earlier:
                if b.line not in page.done:
                    try:
                        _run_python(b, page, request)
                    except Exception as e:
                        pytest.fail(f"an earlier block of this page, {b.id}, fails: {type(e).__name__}: {e}")
                    page.done.add(b.line)
            page.done.discard(block.line)
            _run_python(block, page, request)
            page.done.add(block.line)
        elif block.lang in SHELL:
            _run_shell(_with_pg(block.code, request), page.workdir)
        elif block.lang == "console":
            _run_shell(_with_pg(_console_commands(block.code), request), page.workdir)
        elif block.lang == "sql":
            import psycopg

            with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
                for statement in filter(str.strip, block.code.split(";")):
                    conn.execute(statement)
        else:  # pragma: no cover - CODE_LANGS and the branches above agree
            pytest.fail(f"no runner for ```{block.lang}")
    finally:
        os.chdir(cwd)


def test_the_extractor_finds_blocks_and_markers(tmp_path) -> None:
    """The extractor itself: languages, indented fences, markers (a parse bug must not hide blocks)."""
    md = tmp_path / "page.md"
    md.write_text(
        "# t\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip (needs a server) -->\n```bash\nserve\n```\n"
        "- item:\n\n  ```text\n  out\n  ```\n\n````console\n$ echo hi\nhi\n````\n"
    )
    blocks = extract_blocks(md)
    assert [(b.line, b.lang, b.skip) for b in blocks] == [
        (3, "python", None),
        (8, "bash", "needs a server"),
        (13, "text", None),
        (17, "console", None),
    ]
    assert blocks[0].code == "x = 1\n" and blocks[2].code == "out\n"
    assert _console_commands(blocks[3].code) == "echo hi\n"
    assert len(BLOCKS) > 20 and {b.lang for b in BLOCKS} >= {"python", "bash"}


PAGES_WITH_PYTHON = sorted({b.path for b in BLOCKS if b.lang in PYTHON})


@pytest.mark.parametrize(
    "page", PAGES_WITH_PYTHON, ids=[p.relative_to(ROOT).as_posix() for p in PAGES_WITH_PYTHON]
)
def test_doc_python_names_are_defined(page: Path, tmp_path) -> None:
    """Names used only where a run does not reach (a lambda never called, a skipped block) are defined too:
    ruff's undefined-name check (F821) over the page's python blocks, concatenated in page order."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed next to the test interpreter")
    blocks = [b for b in BLOCKS if b.path == page and b.lang in PYTHON]
    source = tmp_path / "page.py"
    source.write_text("".join(f"# {b.id}\n{b.code}" for b in blocks))
    proc = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "F821", "--output-format", "concise", str(source)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, (
        f"undefined names in the python blocks of {page.name}:\n{proc.stdout}{proc.stderr}"
    )


def test_every_marker_belongs_to_a_code_block() -> None:
    """A skip marker that no longer sits right before a code block (moved text, a block turned into
    ```text) would skip nothing or hide a change: each one must mark a code block."""
    for path in DOC_FILES:
        markers = len(MARKER.findall(path.read_text(encoding="utf-8")))
        marked = [b for b in extract_blocks(path) if b.skip is not None]
        assert all(b.lang in CODE_LANGS for b in marked), [b.id for b in marked if b.lang not in CODE_LANGS]
        assert markers == len(marked), f"{path.name}: {markers} markers, {len(marked)} of them before a block"
