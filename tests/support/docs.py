"""The code blocks of README.md and docs/*.md (language, source line, skip markers), for the docs tests."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

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
