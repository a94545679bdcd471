"""hiermem's import graph, read from the code: layers, cycles, long modules, and the package picture.

Every ``import`` and ``from ... import`` of the three packages is read with :mod:`ast` (imports deferred
inside functions included, ``if TYPE_CHECKING:`` blocks excluded) and resolved to the module it names.
The layers (bottom first; a module may import its own layer and the ones below):

====  =====================  ==============================================================================
rank  layer                  modules
====  =====================  ==============================================================================
0     ground                 ``shared_core.types``, ``arrays``, ``scores``, ``_compat``, ``progress``
1     prompts                ``shared_core.prompts``
2     models                 ``shared_core.models``
3     tree                   ``shared_core.tree``
4     search                 ``shared_core.search``
5     stores                 ``shared_core.stores``, ``shared_core.durable``
6     memories               ``shared_core.memories``
7     core API               ``shared_core`` (the package), ``shared_core.namespaces``
8     adapters               ``langchain_hiermem``, ``llamaindex_hiermem``
9-13  applications           ``shared_core.viz`` < ``eval`` < ``bench`` < ``serve`` < ``cli``
====  =====================  ==============================================================================

Usage::

    python scripts/import_graph.py            # report; exit status 1 on a violation
    python scripts/import_graph.py --render   # also write docs/images/package_graph.png and .json

``tests/unit/docs/test_layout.py`` runs the same checks and fails on any cycle, upward import or module over
:data:`MAX_LINES` lines, and when ``docs/images/package_graph.json`` (the edges the picture shows) no
longer matches the code.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared_core", "langchain_hiermem", "llamaindex_hiermem")
#: longest module allowed, in lines
MAX_LINES = 800

#: (module prefix, rank, layer name); the longest matching prefix decides
LAYERS: tuple[tuple[str, int, str], ...] = (
    ("shared_core.types", 0, "ground"),
    ("shared_core.arrays", 0, "ground"),
    ("shared_core.scores", 0, "ground"),
    ("shared_core._compat", 0, "ground"),
    ("shared_core.progress", 0, "ground"),
    ("shared_core.prompts", 1, "prompts"),
    ("shared_core.models", 2, "models"),
    ("shared_core.tree", 3, "tree"),
    ("shared_core.search", 4, "search"),
    ("shared_core.stores", 5, "stores"),
    ("shared_core.durable", 5, "stores"),
    ("shared_core.memories", 6, "memories"),
    ("shared_core", 7, "core API"),
    ("shared_core.namespaces", 7, "core API"),
    ("langchain_hiermem", 8, "adapters"),
    ("llamaindex_hiermem", 8, "adapters"),
    ("shared_core.viz", 9, "applications"),
    ("shared_core.eval", 10, "applications"),
    ("shared_core.bench", 11, "applications"),
    ("shared_core.serve", 12, "applications"),
    ("shared_core.cli", 13, "applications"),
)
#: the first rank of the applications: no module below it may import one at or above it
APPLICATION_RANK = 9


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages: dotted name -> file (a package is its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def moved_paths(root: Path = ROOT) -> frozenset[str]:
    """The old module paths ``shared_core/_compat.py`` keeps importable (its ``MOVED`` keys), read with
    :mod:`ast` (empty when the file or the table is absent)."""
    f = root / "shared_core" / "_compat.py"
    if not f.is_file():
        return frozenset()
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "MOVED" for t in targets) and node.value is not None:
                return frozenset(ast.literal_eval(node.value))
    return frozenset()


def _imported(
    tree: ast.AST, package: str, mods: dict[str, Path], moved: frozenset[str] = frozenset()
) -> dict[str, int]:
    """{module of the packages named by an import in ``tree``: line of its first import}. ``from pkg
    import name`` where ``pkg.name`` is an old path in ``moved`` records ``pkg.name`` (no module)."""
    found: dict[str, int] = {}
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    found[a.name] = min(found.get(a.name, node.lineno), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] in PACKAGES:
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    key = sub if sub in mods or sub in moved else target
                    found[key] = min(found.get(key, node.lineno), node.lineno)
        todo.extend(ast.iter_child_nodes(node))
    return found


def imports(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {imported module of the packages: line of its first import}. A name that is no module
    of the packages (an old, moved path) is kept as written (see :func:`unresolved`)."""
    mods = modules(root)
    moved = moved_paths(root)
    graph: dict[str, dict[str, int]] = {}
    for name, f in mods.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        found = _imported(ast.parse(f.read_text(encoding="utf-8"), filename=str(f)), package, mods, moved)
        found.pop(name, None)
        graph[name] = found
    return graph


def unresolved(graph: dict[str, dict[str, int]], root: Path = ROOT) -> list[tuple[str, str]]:
    """(importer, name) for every imported name of the packages that is no module of them (an import of
    an old, moved path)."""
    mods = modules(root)
    return sorted((m, t) for m, ts in graph.items() for t in ts if t not in mods)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(out)


def layer(module: str) -> tuple[str, int, str]:
    """(matching prefix, rank, layer name) of a module.

    Raises:
        LookupError: a module of no layer (add it to :data:`LAYERS`).
    """
    best = None
    for prefix, rank, name in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, rank, name)
    if best is None:
        raise LookupError(f"{module} is in no layer of scripts/import_graph.py")
    return best


def upward(graph: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a higher layer (library -> application included)."""
    out = []
    for m, targets in graph.items():
        rank = layer(m)[1]
        for t, line in targets.items():
            if t in graph and layer(t)[1] > rank:
                out.append((m, t, line))
    return sorted(out)


def long_modules(root: Path = ROOT, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(module, lines) of every module over ``limit`` lines."""
    out = []
    for name, f in modules(root).items():
        n = len(f.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append((name, n))
    return sorted(out)


def package_of(module: str) -> str:
    """The node of the package picture a module belongs to: its layer prefix (``shared_core.search``,
    ``shared_core.types``, ``langchain_hiermem``...); the root package is ``shared_core``."""
    return layer(module)[0]


def package_edges(graph: dict[str, dict[str, int]]) -> list[tuple[str, str]]:
    """Sorted, distinct (package, package) edges of the module graph (within a package left out)."""
    edges = set()
    for m, targets in graph.items():
        for t in targets:
            if t in graph and package_of(m) != package_of(t):
                edges.add((package_of(m), package_of(t)))
    return sorted(edges)


def render(graph: dict[str, dict[str, int]], png: Path, edges_json: Path) -> None:
    """Draw the package graph by layer (bottom row = ground) to ``png``; write its edges to ``edges_json``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = package_edges(graph)
    nodes = sorted(
        {p for e in edges for p in e} | {package_of(m) for m in graph}, key=lambda p: (layer(p)[1], p)
    )
    rows: dict[int, list[str]] = defaultdict(list)
    for p in nodes:
        rank = layer(p)[1]
        rows[min(rank, APPLICATION_RANK)].append(p)  # the applications share the top row
    pos = {}
    for rank, ps in rows.items():
        for i, p in enumerate(ps):
            pos[p] = ((i + 1) / (len(ps) + 1), rank)
    fig, ax = plt.subplots(figsize=(13, 9))
    for a, b in edges:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.annotate(
            "",
            xy=(x1, y1 + 0.18),
            xytext=(x0, y0 - 0.18),
            arrowprops={"arrowstyle": "->", "color": "#7a869a", "lw": 0.7, "alpha": 0.7},
        )
    colours = {"applications": "#fde2c8", "adapters": "#d9ead3", "core API": "#cfe2f3", "memories": "#d9d2e9"}
    for p, (x, y) in pos.items():
        label = p.replace("shared_core.", "").replace("shared_core", "shared_core (package)")
        ax.text(
            x,
            y,
            label,
            ha="center",
            va="center",
            fontsize=9,
            bbox={"boxstyle": "round,pad=0.35", "fc": colours.get(layer(p)[2], "#eeeeee"), "ec": "#555555"},
        )
    names = {}
    for _prefix, rank, name in LAYERS:
        names.setdefault(min(rank, APPLICATION_RANK), name)
    for rank, name in names.items():
        ax.text(-0.02, rank, name, ha="right", va="center", fontsize=9, style="italic", color="#333333")
    ax.set_xlim(-0.2, 1.02)
    ax.set_ylim(-0.6, APPLICATION_RANK + 0.6)
    ax.axis("off")
    ax.set_title("hiermem packages by layer: every arrow points down (an import of a lower layer)")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    edges_json.write_text(json.dumps({"edges": edges}, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    graph = imports()
    problems = []
    for c in cycles(graph):
        problems.append("import cycle: " + " -> ".join(c))
    for m, t, line in upward(graph):
        problems.append(f"upward import: {m} (line {line}) imports {t} ({layer(m)[2]} -> {layer(t)[2]})")
    for m, t in unresolved(graph):
        problems.append(f"{m} imports {t}, which is no module (an old path?)")
    for m, n in long_modules():
        problems.append(f"{m}: {n} lines (limit {MAX_LINES})")
    print(f"{len(graph)} modules, {sum(len(v) for v in graph.values())} imports, {len(problems)} problems")
    for p in problems:
        print("  " + p)
    if "--render" in argv:
        render(graph, ROOT / "docs/images/package_graph.png", ROOT / "docs/images/package_graph.json")
        print("wrote docs/images/package_graph.png and docs/images/package_graph.json")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
