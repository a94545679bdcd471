"""Every ``hiermem`` command's ``--help`` reads at 80 columns: no line past 80 characters, option help
in a column wide enough to read, and no reStructuredText markup from the docstrings."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from shared_core.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _help(command: str) -> str:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_listed() -> None:
    assert {"demo", "viz", "mcp", "eval", "bench"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_without_markup(command: str) -> None:
    text = _help(command)
    too_long = [line for line in text.splitlines() if len(line) > 80]
    assert not too_long, too_long
    for markup in ("``", ":class:", ":mod:", ":func:", ":meth:"):
        assert markup not in text, f"{command} --help shows {markup!r}"


@pytest.mark.parametrize("command", COMMANDS)
def test_option_help_has_room(command: str) -> None:
    """The first line of each long option help holds at least 30 of its characters (a help column of
    20 characters, as a table with a wide option column gives at 80 columns, fails)."""
    text = _help(command)
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    checked = 0
    for param in cmd.params:
        if not param.opts[0].startswith("--") or not getattr(param, "help", None) or len(param.help) < 80:
            continue
        words = param.help.split()
        first = next((line for line in text.splitlines() if " ".join(words[:3]) in line), None)
        assert first is not None, f"{command}: help of {param.opts[0]} not found"
        start = first.index(words[0])
        assert len(first) - start >= 30, f"{command} {param.opts[0]}: {first!r}"
        checked += 1
    assert checked or command not in {"eval", "bench", "mcp"}  # these have long option help
