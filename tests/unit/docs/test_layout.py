"""The layout's rules, read from the code (``scripts/import_graph.py``): no import cycle, no import of a
higher layer (so no library module imports an application), no import of an old module path, no module
over 800 lines, and the package picture of ``docs/architecture.md`` drawn from the current code. Each
rule is also shown to fail on a planted violation."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.support import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


g = _load()


@pytest.fixture(scope="module")
def graph():
    return g.imports()


def test_every_module_has_a_layer(graph):
    for m in graph:
        g.layer(m)  # raises LookupError for a module of no layer


def test_no_import_cycles(graph):
    assert g.cycles(graph) == []


def test_no_upward_imports(graph):
    assert g.upward(graph) == [], "an import of a higher layer (library -> application included)"


def test_no_imports_of_old_paths(graph):
    assert g.unresolved(graph) == []


def test_tests_benchmarks_and_scripts_import_no_old_paths():
    """Old module paths are for users' code during one release; the repository itself uses the new ones."""
    mods = g.modules()
    files = [
        f
        for folder in ("tests", "benchmarks", "scripts", "cookbook")
        for f in sorted((g.ROOT / folder).rglob("*.py"))
    ]
    old = []
    for f in files:
        tree = g.ast.parse(f.read_text(encoding="utf-8"))
        package = ".".join(f.relative_to(g.ROOT).parent.parts)
        old += [
            (str(f.relative_to(g.ROOT)), name)
            for name in g._imported(tree, package, mods, g.moved_paths())
            if name not in mods
        ]
    assert old == []


def test_no_module_over_800_lines():
    assert g.long_modules() == []


def test_package_picture_matches_the_code(graph):
    recorded = json.loads((ROOT / "docs/images/package_graph.json").read_text())["edges"]
    assert [list(e) for e in g.package_edges(graph)] == recorded, (
        "the package graph changed: run `python scripts/import_graph.py --render` and commit docs/images"
    )
    assert (ROOT / "docs/images/package_graph.png").stat().st_size > 10_000


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path


def test_the_checks_catch_planted_violations(tmp_path):
    root = _tree(
        tmp_path,
        {
            "shared_core/__init__.py": "",
            "shared_core/types.py": "from .search import ranking\n",  # ground -> search: upward
            "shared_core/search/__init__.py": "",
            "shared_core/search/ranking.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from ..memories import base\n"  # excluded
                "def f():\n    from ..eval import metrics\n"  # deferred, library -> application
            ),
            "shared_core/memories/__init__.py": "",
            "shared_core/memories/base.py": "from ..memories import segtree\n",
            "shared_core/_compat.py": 'MOVED = {"shared_core.index": "shared_core.search.index"}\n',
            "shared_core/serve.py": "from shared_core import index\n",  # an old path through the package
            "shared_core/memories/segtree.py": "from . import base\nimport shared_core.index\n"
            + "x = 1\n" * 801,
            "shared_core/eval/__init__.py": "",
            "shared_core/eval/metrics.py": "",
            "langchain_hiermem/__init__.py": "",
            "llamaindex_hiermem/__init__.py": "",
        },
    )
    graph = g.imports(root)
    assert g.cycles(graph) == [["shared_core.memories.base", "shared_core.memories.segtree"]]
    up = {(m, t) for m, t, _ in g.upward(graph)}
    assert ("shared_core.types", "shared_core.search.ranking") in up
    assert ("shared_core.search.ranking", "shared_core.eval.metrics") in up
    assert ("shared_core.search.ranking", "shared_core.memories.base") not in up
    assert g.unresolved(graph, root) == [
        ("shared_core.memories.segtree", "shared_core.index"),
        ("shared_core.serve", "shared_core.index"),
    ]
    assert g.long_modules(root) == [("shared_core.memories.segtree", 803)]


def test_the_script_reports_and_exits_zero():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts/import_graph.py")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 problems" in r.stdout


# ---------------------------------------------------------------- old module paths
@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("shared_core.segtree", "shared_core.memories.segtree", "SegTreeMem"),
        ("shared_core.base", "shared_core.memories.base", "HierarchicalMemory"),
        ("shared_core.index", "shared_core.search.index", "NodeIndex"),
        ("shared_core.propagation", "shared_core.tree.propagation", "propagate_parents"),
        ("shared_core.persist", "shared_core.stores.files", "save_memory"),
        ("shared_core.xmemory.rules", "shared_core.memories.xmemory.rules", "extract_facts_rule"),
        ("shared_core.mcp_server", "shared_core.serve.mcp_server", "build_server"),
        ("shared_core.bench_workloads", "shared_core.bench.workloads", "run_workloads"),
    ],
)
def test_old_paths_work_with_a_deprecation_warning(old, new, name):
    code = (
        "import warnings, importlib\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        f"new = importlib.import_module({new!r})\n"
        "try:\n"
        f"    importlib.import_module({old!r})\n"
        "except DeprecationWarning as e:\n"
        "    print('WARNED', e)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"old = importlib.import_module({old!r})\n"
        f"assert old is new and getattr(old, {name!r}) is getattr(new, {name!r})\n"
        f"assert old.__spec__.name == {new!r}\n"
        "print('SAME')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    first = ".".join(old.split(".")[:2])  # a moved package's submodule warns for the package
    assert f"WARNED {first} moved to {new[: len(new) - len(old) + len(first)]};" in r.stdout
    assert "SAME" in r.stdout


def test_public_paths_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from shared_core import HAT, MemTree, Message, SegTreeMem, XMemory  # noqa: F401
        from shared_core.bench import run_bench  # noqa: F401
        from shared_core.namespaces import MemoryStore  # noqa: F401
        from shared_core.tree import NodeStore  # noqa: F401
