"""The adapters translate through the core's public API: no module of ``langchain_hiermem`` or
``llamaindex_hiermem`` reads or replaces a private member (``obj._name``) of anything but itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ADAPTERS = ("langchain_hiermem", "llamaindex_hiermem")
#: private names of other libraries the adapters use, with why: ``NamedTuple._replace`` is a public
#: method despite its underscore; ``fsspec``'s ``_strip_protocol`` is how LlamaIndex's own persistence
#: turns an fsspec URL into a path
ALLOWED = {"_replace", "_strip_protocol"}


def _private_accesses(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")) or name in ALLOWED:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        found.append((node.lineno, f"{ast.unparse(owner)}.{name}"))
    return found


def test_adapters_touch_no_private_member_of_the_core() -> None:
    bad = []
    for package in ADAPTERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, what in _private_accesses(path.read_text(encoding="utf-8")):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert bad == []


def test_the_check_sees_a_private_read_and_a_private_swap() -> None:
    src = (
        "def f(mem):\n    with mem._lock:\n        mem._embed_query = g\n"
        "    return self._ok, super()._fine()\n"
    )
    assert [w for _, w in _private_accesses(src)] == ["mem._lock", "mem._embed_query"]
