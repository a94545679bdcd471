"""Without the ``agents`` extra, in fresh interpreters with ``langchain`` or ``langgraph.prebuilt`` made
impossible to import: HierMemMiddleware and create_memory_tools name the missing extra."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("langchain.agents", reason="langchain is not installed (agents extra)")
from langchain_hiermem import (  # noqa: E402
    MissingExtraError,
)
from tests.support import ROOT  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import json, sys

    blocked = sys.argv[1]

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name == blocked or name.startswith(blocked + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    import langchain_hiermem
    from langchain_hiermem import HierMemStore, MissingUserError
    report = {}
    for name in ("HierMemMiddleware", "create_memory_tools"):
        try:
            getattr(langchain_hiermem, name)
        except ImportError as e:
            report[name] = {"type": type(e).__name__, "extra": getattr(e, "extra", None), "message": str(e)}
    print(json.dumps(report))
    """
)


@pytest.mark.parametrize(
    ("blocked", "failing"),
    [
        ("langchain", ("HierMemMiddleware",)),
        ("langgraph.prebuilt", ("HierMemMiddleware", "create_memory_tools")),
    ],
)
def test_without_the_agents_extra_the_middleware_and_tools_name_it(blocked, failing) -> None:
    """The middleware needs ``langchain`` (``AgentMiddleware``), the tools only ``langgraph``
    (``ToolRuntime``); a missing one is a ``MissingExtraError`` naming ``hiermem[agents]``."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, blocked], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(report) == sorted(failing), report
    for name in failing:
        assert report[name]["type"] == "MissingExtraError", report
        assert report[name]["extra"] == "agents"
        assert 'pip install "hiermem[agents]"' in report[name]["message"]
    assert issubclass(MissingExtraError, ImportError)
