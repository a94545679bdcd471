"""Execute the cookbook notebooks top to bottom with nbclient; any cell error (the notebooks check their
own outputs with ``assert``) fails the test.

* 01–03 and 05 run offline on the embedded defaults (local MiniLM, fake or mock LLMs).
* 04 calls the OpenAI API: without ``OPENAI_API_KEY`` its first code cell raises ``SkipNotebook`` and the
  test is reported as skipped; with the key it runs for real (and costs money). It is also run end to end
  against the OpenAI-protocol test server (placeholder replies), which checks its code, not its figures.

The kernel is the ``python3`` kernelspec, which must resolve to this interpreter (ipykernel installed in
the same virtual environment); the test checks that. Kernels run with one BLAS/torch thread
(``OMP_NUM_THREADS=1``): the notebooks embed a few texts per call, where one thread is fastest and does not
compete with other processes for the cores.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.support.openai_server import openai_server  # noqa: F401  (fixture)

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (dev extra)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (dev extra)")
pytest.importorskip("ipykernel", reason="ipykernel is not installed in this environment (dev extra)")
from nbclient.exceptions import CellExecutionError  # noqa: E402

from tests.support import ROOT  # noqa: E402

COOKBOOK = ROOT / "cookbook"
OFFLINE = [
    "01_conversation_memory_langchain.ipynb",
    "02_rag_llamaindex.ipynb",
    "03_compare_memories.ipynb",
    "05_langchain_agent_middleware.ipynb",
]
OPENAI = "04_openai.ipynb"
CELL_TIMEOUT = 600  # seconds per cell
PROBE = "import sys; print(sys.prefix)"


def _kernel_env(**extra: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"})
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _load(name: str):
    nb = nbformat.read(COOKBOOK / name, as_version=4)
    nbformat.validate(nb)
    assert nb.cells and nb.cells[0].cell_type == "markdown", f"{name}: the first cell must say what it shows"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), (
        f"{name} is committed with outputs; clear them (Jupyter: Edit > Clear Outputs of All Cells)"
    )
    assert any("assert " in c.source for c in code), f"{name} checks none of its outputs"
    return nb


def _execute(name: str, env: dict[str, str]):
    """Run a notebook in a fresh kernel (cwd = cookbook/). Returns (executed notebook, seconds)."""
    nb = _load(name)
    probe = nbformat.v4.new_code_cell(PROBE)
    probe["id"] = "probe-interpreter"
    nb.cells.insert(0, probe)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(COOKBOOK)}},
    )
    t0 = time.perf_counter()
    try:
        client.execute(env=env)
    finally:
        seconds = time.perf_counter() - t0
        out = "".join(o.get("text", "") for o in nb.cells[0].get("outputs", []))
        if out:
            assert out.strip() == sys.prefix, (
                f"the python3 kernel runs {out.strip()}, not this environment ({sys.prefix}); install "
                "ipykernel here and remove other 'python3' kernelspecs that shadow it"
            )
    return nb, seconds


def _errors(nb) -> list[str]:
    return [
        f"{o.get('ename')}: {o.get('evalue')}"
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", OFFLINE)
def test_offline_notebook_runs_and_its_checks_pass(name):
    try:
        nb, seconds = _execute(name, _kernel_env())
    except CellExecutionError as e:
        pytest.fail(f"{name} failed:\n{e}", pytrace=False)
    assert not _errors(nb)
    print(f"{name}: {seconds:.1f} s")


@pytest.mark.slow
def test_openai_notebook_skips_without_a_key():
    if os.environ.get("OPENAI_API_KEY"):
        try:
            nb, seconds = _execute(OPENAI, _kernel_env())
        except CellExecutionError as e:
            pytest.fail(f"{OPENAI} failed against the OpenAI API:\n{e}", pytrace=False)
        assert not _errors(nb)
        return
    with pytest.raises(CellExecutionError) as info:
        _execute(OPENAI, _kernel_env(OPENAI_API_KEY=None))
    assert info.value.ename == "SkipNotebook", f"{OPENAI} failed before its key check:\n{info.value}"
    nb = _load(OPENAI)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "OPENAI_API_KEY" in first_code.source  # the key check is the first code cell: nothing ran before
    pytest.skip(
        f"OPENAI_API_KEY is not set: {OPENAI} calls the OpenAI API (its first cell raised SkipNotebook)"
    )


@pytest.mark.slow
def test_openai_notebook_runs_against_the_protocol_test_server(openai_server):  # noqa: F811
    env = _kernel_env(
        OPENAI_API_KEY="test-key",
        OPENAI_BASE_URL=openai_server.base_url,
        HIERMEM_CHAT_MODEL="test-chat",
        HIERMEM_EMBED_MODEL="test-embedding",
    )
    try:
        nb, seconds = _execute(OPENAI, env)
    except CellExecutionError as e:
        pytest.fail(f"{OPENAI} failed against the test server:\n{e}", pytrace=False)
    assert not _errors(nb)
    chats, embeds = openai_server.chat_requests(), openai_server.embed_requests()
    assert chats and embeds
    assert {r["model"] for r in chats} == {"test-chat"}
    assert {r["model"] for r in embeds} == {"test-embedding"}
    assert {r.get("dimensions") for r in embeds} == {512}
    print(f"{OPENAI} (test server): {seconds:.1f} s, {len(chats)} chat and {len(embeds)} embedding requests")
