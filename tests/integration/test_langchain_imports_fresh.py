"""What ``import langchain_hiermem`` loads, in fresh interpreters (the test process has imported everything
already): the retriever and the store need only ``langchain-core`` and ``langgraph-checkpoint`` (the
``langchain`` extra); the legacy ``BaseMemory`` classes load ``langchain_classic`` (the ``legacy`` extra)
on first access, with a clear error when it is missing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

# A tiny memory over a stub embedder (no model, no torch), queried through the retriever and the store;
# prints the modules loaded at that point, then after accessing the legacy class. With an argument, a
# meta path finder makes that module (and its submodules) impossible to import first.
SCRIPT = textwrap.dedent(
    """
    import json
    import sys
    import zlib

    BLOCKED = sys.argv[1] if len(sys.argv) > 1 else None


    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if BLOCKED and (name == BLOCKED or name.startswith(BLOCKED + ".")):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, Blocker())

    import numpy as np

    import langchain_hiermem
    from langchain_hiermem import HierMemRetriever, HierMemStore
    from shared_core import SegTreeMem


    class StubEmbedder:
        dim = 32

        def embed(self, texts):
            out = np.full((len(texts), self.dim), 1e-3, dtype=np.float32)
            for i, text in enumerate(texts):
                for word in text.lower().replace(".", " ").replace("?", " ").split():
                    out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
            return out

        async def aembed(self, texts):
            return self.embed(texts)


    def loaded():
        return sorted(m for m in sys.modules if m.startswith(("langchain", "langgraph")))


    report = {"after_import": loaded()}
    mem = SegTreeMem(embedder=StubEmbedder())
    mem.add(["My dog is called Luna.", "I work as a nurse in Porto.", "We bought a red bicycle."])
    docs = HierMemRetriever(memory=mem, k=1).invoke("What is my dog called?")
    store = HierMemStore(embedder=StubEmbedder())
    store.put(("memories", "me"), "dog", {"text": "My dog is called Luna."})
    store.put(("memories", "me"), "job", {"text": "I work as a nurse in Porto."})
    items = store.search(("memories", "me"), query="Where do I work as a nurse?", limit=1)
    report["retrieved"] = [d.page_content for d in docs]
    report["searched"] = [item.key for item in items]
    report["after_use"] = loaded()
    report["files"] = {
        m: getattr(sys.modules[m], "__file__", None) for m in loaded() if m.startswith("langgraph")
    }
    try:
        cls = langchain_hiermem.SegTreeMemory
    except ImportError as e:
        report["error"] = {
            "types": [t.__name__ for t in type(e).__mro__],
            "message": str(e),
            "name": e.name,
            "extra": getattr(e, "extra", None),
        }
        try:
            from langchain_hiermem import SegTreeMemory  # noqa: F401
        except ImportError as again:
            report["second_error"] = type(again).__name__
    else:
        report["legacy_class"] = f"{cls.__module__}.{cls.__qualname__}"
    report["after_legacy"] = loaded()
    print(json.dumps(report))
    """
)


def run_script(blocked: str | None = None) -> dict[str, Any]:
    args = [sys.executable, "-c", SCRIPT] + ([blocked] if blocked else [])
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def checkpoint_files() -> set[Path]:
    from importlib.metadata import distribution

    dist = distribution("langgraph-checkpoint")
    return {Path(dist.locate_file(f)).resolve() for f in dist.files or []}


@pytest.fixture(scope="module")
def installed() -> dict[str, Any]:
    """The report of the script with every package installed."""
    return run_script()


@pytest.fixture(scope="module")
def without_classic() -> dict[str, Any]:
    """The report of the script when ``langchain_classic`` cannot be imported."""
    return run_script("langchain_classic")


def _top(modules: list[str], name: str) -> list[str]:
    return [m for m in modules if m == name or m.startswith(name + ".")]


def test_retriever_and_store_work_in_the_fresh_interpreter(installed: dict[str, Any]) -> None:
    assert installed["retrieved"] == ["My dog is called Luna."]
    assert installed["searched"] == ["job"]


def test_import_and_use_load_neither_langchain_classic_nor_langchain(installed: dict[str, Any]) -> None:
    for stage in ("after_import", "after_use"):
        assert _top(installed[stage], "langchain_classic") == [], stage
        assert _top(installed[stage], "langchain") == [], stage
    assert _top(installed["after_use"], "langchain_core")


def test_langgraph_modules_come_from_langgraph_checkpoint(installed: dict[str, Any]) -> None:
    langgraph = _top(installed["after_use"], "langgraph")
    assert "langgraph.store.base" in langgraph
    assert all(
        m.startswith(("langgraph.store", "langgraph.checkpoint")) for m in langgraph if m != "langgraph"
    )
    own = checkpoint_files()
    for module, file in installed["files"].items():
        if file is not None:  # namespace packages (langgraph, langgraph.store) have no file
            assert Path(file).resolve() in own, f"{module} is not part of langgraph-checkpoint: {file}"


def test_accessing_a_legacy_class_imports_langchain_classic(installed: dict[str, Any]) -> None:
    assert installed["legacy_class"] == "langchain_hiermem.memory.SegTreeMemory"
    assert "langchain_classic" in installed["after_legacy"]
    assert "langchain_hiermem.memory" in installed["after_legacy"]


def test_missing_langchain_classic_keeps_retriever_and_store(without_classic: dict[str, Any]) -> None:
    assert without_classic["retrieved"] == ["My dog is called Luna."]
    assert without_classic["searched"] == ["job"]
    assert "legacy_class" not in without_classic


def test_missing_langchain_classic_gives_a_clear_import_error(without_classic: dict[str, Any]) -> None:
    error = without_classic["error"]
    assert error["types"][:2] == ["MissingExtraError", "HierMemError"]
    assert "ImportError" in error["types"]
    assert 'pip install "hiermem[legacy]"' in error["message"]
    assert "langchain-classic" in error["message"]
    assert error["name"] == "langchain_classic"
    assert error["extra"] == "legacy"
    assert without_classic["second_error"] == "MissingExtraError"
    assert "langchain_hiermem.memory" not in without_classic["after_legacy"]


def test_a_missing_module_inside_langchain_classic_is_not_reported_as_a_missing_extra() -> None:
    report = run_script("langchain_classic.base_memory")
    assert report["error"]["types"][0] == "ModuleNotFoundError"
    assert report["error"]["name"] == "langchain_classic.base_memory"
    assert report["error"]["extra"] is None
