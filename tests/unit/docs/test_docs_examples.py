"""Every code block of README.md and docs/*.md runs here, one test case per block (id ``file:line``), but
those of the pages with examples on PostgreSQL: tests/integration/test_docs_examples_postgres.py runs them.

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

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import (
    BLOCKS,
    CODE_LANGS,
    DOC_FILES,
    MARKER,
    POSTGRES_PAGES,
    PYTHON,
    ROOT,
    Block,
    _console_commands,
    extract_blocks,
    run_block,
)

# --------------------------------------------------------------------------- per-page state


UNIT_BLOCKS = [b for b in BLOCKS if b.path not in POSTGRES_PAGES]


@pytest.mark.parametrize("block", UNIT_BLOCKS, ids=[b.id for b in UNIT_BLOCKS])
def test_doc_block(block: Block, request, tmp_path_factory, docs_env) -> None:
    run_block(block, request, tmp_path_factory)


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
    # the pages on PostgreSQL run in tests/integration/test_docs_examples_postgres.py; the others here
    assert any(b.lang == "sql" for b in BLOCKS if b.path in POSTGRES_PAGES) and len(UNIT_BLOCKS) > 20


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
