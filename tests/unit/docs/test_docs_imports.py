"""Every import written in README.md, docs/*.md and the cookbook notebooks works from exactly the path it
is written with, without a DeprecationWarning.

The ``import X`` / ``from X import Y`` statements of every ``python`` block (skipped blocks included: a
reader copies them all the same) and of every notebook code cell are imported; ``from X import Y`` checks
Y as an attribute of X, or else as its submodule, as Python does. An old module path of hiermem warns
only on its first import, so it is also recognised by name: it imports as the module of its new path.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

import shared_core
from shared_core._compat import new_name
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


def check(imp: Import) -> str | None:
    """What is wrong with one import statement, or ``None``: an error, a DeprecationWarning, or an old
    module path of hiermem's packages (it imports as its new module, under the new name)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            mods = [importlib.import_module(imp.module)]
            for name in imp.names:
                if not hasattr(mods[0], name):  # a submodule, as Python does
                    mods.append(importlib.import_module(f"{imp.module}.{name}"))
                getattr(mods[0], name)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
    deprecations = [
        f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, DeprecationWarning)
    ]
    if deprecations:
        return "; ".join(deprecations)
    wanted = [imp.module] + [f"{imp.module}.{n}" for n in imp.names][: len(mods) - 1]
    for mod, name in zip(mods, wanted):
        # a module imported before under its new path does not warn again: its name tells
        real = mod.__spec__.name if mod.__spec__ is not None else mod.__name__
        if name.split(".")[0] in OUR_PACKAGES and (real != name or new_name(name) is not None):
            return f"an old module path: the module is {real}"
    return None


def test_the_sources_import_the_packages():
    """The extraction finds the packages' imports where they are documented, and the check finds what it
    must (guards against a reader that silently finds nothing)."""
    found = {i.module.split(".")[0] for src in SOURCES for i in imports_of(src)}
    assert set(OUR_PACKAGES) <= found
    assert NOTEBOOKS and any(i.module.startswith("shared_core") for i in imports_of(ROOT / "README.md"))
    assert any(i.names for nb in NOTEBOOKS for i in imports_of(nb) if i.module == "langchain_hiermem")
    # and the check catches an old module path (imported before or not) and a missing name
    assert check(Import("x", "shared_core", ("SegTreeMem", "memories"))) is None
    importlib.import_module("shared_core.memories.segtree")
    try:
        assert "moved to shared_core.memories.segtree" in (
            check(Import("x", "shared_core.segtree", ())) or ""
        )
        assert "old module path" in (check(Import("x", "shared_core.segtree", ("SegTreeMem",))) or "")
    finally:  # the alias the check imported leaves with it
        sys.modules.pop("shared_core.segtree", None)
        vars(shared_core).pop("segtree", None)
    assert "ModuleNotFoundError" in (check(Import("x", "shared_core", ("NoSuchName",))) or "")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_import_works_from_its_documented_path(source: Path) -> None:
    bad = []
    for imp in imports_of(source):
        problem = check(imp)
        if problem is not None:
            bad.append(f"{imp.where}: from {imp.module} import {', '.join(imp.names) or '-'}: {problem}")
    assert not bad, "\n".join(bad)
