"""Every import written in README.md, docs/*.md and the cookbook notebooks works from exactly the path it
is written with, without a DeprecationWarning.

The ``import X`` / ``from X import Y`` statements of every ``python`` block (skipped blocks included: a
reader copies them all the same) and of every notebook code cell are imported in one fresh interpreter,
so an old module path, which still imports but warns once on first import, cannot hide behind an earlier
test's import. ``from X import Y`` checks Y as an attribute of X, or else as its submodule, as Python does.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.docs import DOC_FILES, PYTHON, extract_blocks

NOTEBOOKS = sorted((ROOT / "cookbook").glob("*.ipynb"))
SOURCES = [*DOC_FILES, *NOTEBOOKS]
OUR_PACKAGES = ("shared_core", "langchain_hiermem", "llamaindex_hiermem")


@dataclass(frozen=True)
class Import:
    where: str  # file:line of the block, or file#cell
    module: str
    names: tuple[str, ...]  # empty for ``import X``


def _code_of(path: Path) -> list[tuple[str, str]]:
    """The Python code of a page or notebook: (where, code) per block or code cell."""
    rel = path.relative_to(ROOT).as_posix()
    if path.suffix == ".md":
        return [(f"{rel}:{b.line}", b.code) for b in extract_blocks(path) if b.lang in PYTHON]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    out = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            lines = "".join(cell["source"]).splitlines()
            # IPython's ``!shell`` and ``%magic`` lines are not Python
            code = "\n".join("" if ln.lstrip().startswith(("!", "%")) else ln for ln in lines)
            out.append((f"{rel}#cell{i}", code))
    return out


def imports_of(path: Path) -> list[Import]:
    """Every absolute import statement of a page's Python blocks or a notebook's code cells, in order."""
    out = []
    for where, code in _code_of(path):
        tree = ast.parse(code, filename=where)  # a block that does not parse fails here, naming it
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out.extend(Import(where, a.name, ()) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                assert node.module is not None
                names = tuple(a.name for a in node.names if a.name != "*")
                out.append(Import(where, node.module, names))
    return out


_CHECK = r"""
import importlib, json, sys, warnings
results = []
for imp in json.load(sys.stdin):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        error = None
        try:
            mod = importlib.import_module(imp["module"])
            for name in imp["names"]:
                if not hasattr(mod, name):
                    importlib.import_module(imp["module"] + "." + name)  # a submodule, as Python does
                getattr(mod, name)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
    deprecations = [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in caught
        if issubclass(w.category, DeprecationWarning)
    ]
    results.append({**imp, "error": error, "deprecations": deprecations})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def checked() -> dict[str, list[dict[str, Any]]]:
    """Every source's imports, each with the error and the DeprecationWarnings of importing it, from one
    fresh interpreter (the repository first on ``sys.path``)."""
    todo = [asdict(i) for src in SOURCES for i in imports_of(src)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    r = subprocess.run(
        [sys.executable, "-c", _CHECK],
        input=json.dumps(todo),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    by_source: dict[str, list[dict[str, Any]]] = {}
    for res in json.loads(r.stdout.strip().splitlines()[-1]):
        by_source.setdefault(res["where"].split(":")[0].split("#")[0], []).append(res)
    return by_source


def test_the_sources_import_the_packages():
    """The extraction finds the packages' imports where they are documented (guards against a reader
    that silently finds nothing)."""
    found = {i.module.split(".")[0] for src in SOURCES for i in imports_of(src)}
    assert set(OUR_PACKAGES) <= found
    assert NOTEBOOKS and any(i.module.startswith("shared_core") for i in imports_of(ROOT / "README.md"))
    assert any(i.names for nb in NOTEBOOKS for i in imports_of(nb) if i.module == "langchain_hiermem")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_import_works_from_its_documented_path(source: Path, checked) -> None:
    rel = source.relative_to(ROOT).as_posix()
    bad = [
        f"{r['where']}: from {r['module']} import {', '.join(r['names']) or '-'}: "
        + (r["error"] or "; ".join(r["deprecations"]))
        for r in checked.get(rel, [])
        if r["error"] or r["deprecations"]
    ]
    assert not bad, "\n".join(bad)
