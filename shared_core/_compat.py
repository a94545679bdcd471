"""Old module paths of hiermem, kept importable for one release with a ``DeprecationWarning``.

hiermem 0.1 laid every module of :mod:`shared_core` side by side; the layered layout (see
``docs/architecture.md``) moved them into subpackages. ``import shared_core.segtree`` (or
``from shared_core.index import NodeIndex``) still works: a finder on ``sys.meta_path`` maps the old name
to the module's new home, warns once per name, and makes both names the same module object. Public
names (``from shared_core import SegTreeMem``, ``shared_core.namespaces.MemoryStore``,
``shared_core.bench``, ``shared_core.tree``, ...) never warn.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

#: old module name -> new module name (a moved package's submodules follow it)
MOVED: dict[str, str] = {
    "shared_core.structure": "shared_core.tree.structure",
    "shared_core.propagation": "shared_core.tree.propagation",
    "shared_core.index": "shared_core.search.index",
    "shared_core.ann": "shared_core.search.ann",
    "shared_core.lexical": "shared_core.search.lexical",
    "shared_core.relevance": "shared_core.search.relevance",
    "shared_core.filters": "shared_core.search.filters",
    "shared_core.ranking": "shared_core.search.ranking",
    "shared_core.vectors": "shared_core.search.vectors",
    "shared_core.persist": "shared_core.stores.files",
    "shared_core.base": "shared_core.memories.base",
    "shared_core.store_binding": "shared_core.memories.store_binding",
    "shared_core.forgetting": "shared_core.memories.forgetting",
    "shared_core.segtree": "shared_core.memories.segtree",
    "shared_core.memtree": "shared_core.memories.memtree",
    "shared_core.memtree_routes": "shared_core.memories.memtree_routes",
    "shared_core.hat": "shared_core.memories.hat",
    "shared_core.hat_agent": "shared_core.memories.hat_agent",
    "shared_core.xmemory": "shared_core.memories.xmemory",
    "shared_core.mcp_server": "shared_core.serve.mcp_server",
    "shared_core.mcp_auth": "shared_core.serve.mcp_auth",
    "shared_core.bench_namespaces": "shared_core.bench.namespaces",
    "shared_core.bench_processes": "shared_core.bench.processes",
    "shared_core.bench_stubs": "shared_core.bench.stubs",
    "shared_core.bench_workloads": "shared_core.bench.workloads",
}


def new_name(old: str) -> str | None:
    """The new name of an old module path (``None`` when ``old`` did not move)."""
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix) :]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.target}; the old path works in this release only.",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import machinery set the old name's spec; keep the real one


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201
        if not fullname.startswith("shared_core."):
            return None
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), is_package=False)


def install() -> None:
    """Put the finder of old module paths on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        # first: the path finder would otherwise load a moved package's submodules a second time under
        # the old name (``shared_core.xmemory.rules`` from the new package's directory)
        sys.meta_path.insert(0, _Finder())
