"""The code blocks of README.md and docs/*.md (language, source line, skip markers), for the docs tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


PYTHON = {"python", "py"}


SHELL = {"bash", "sh", "shell"}


CODE_LANGS = PYTHON | SHELL | {"console", "sql"}


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[^\n]*$")


MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<directive>\w+)\s*(?:\((?P<reason>.*)\))?\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # reason of a skip marker, None without one

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file (any language), in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        j = i + 1
        while j < len(lines) and not re.match(
            rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]
        ):
            j += 1
        if j == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: fence never closed")
        body = textwrap.dedent(
            "\n".join(ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1 : j])
        )
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.search(prev)
        skip = None
        if marker:
            if marker.group("directive") != "skip" or not (marker.group("reason") or "").strip():
                raise ValueError(f"{path.name}:{i + 1}: a marker must read <!-- docs-test: skip (reason) -->")
            skip = marker.group("reason").strip()
        blocks.append(Block(path, i + 1, m.group("lang").lower(), body + "\n", skip))
        i = j + 1
    return blocks


def code_blocks() -> list[Block]:
    return [b for f in DOC_FILES for b in extract_blocks(f) if b.lang in CODE_LANGS]


BLOCKS = code_blocks()


PG_URL = re.compile(r"postgresql://[^\s\"'`]+")


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


def run_block(block: Block, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Run one code block as its page's reader would (see tests/unit/docs/test_docs_examples.py): a skipped
    block is compiled (python) and reported skipped; a python block runs after the page's earlier ones."""
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


def needs_postgres(block: Block) -> bool:
    """Whether a block runs on PostgreSQL: a ``sql`` block, or one naming a ``postgresql://`` URL."""
    return block.lang == "sql" or PG_URL.search(block.code) is not None


#: pages with a runnable block on PostgreSQL: their blocks run in tests/integration/ (a page's python
#: blocks share one namespace, so a page runs in one place)
POSTGRES_PAGES = sorted({b.path for b in BLOCKS if b.skip is None and needs_postgres(b)})
