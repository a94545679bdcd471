"""hiermem export / import / inspect: a round trip keeps every field of every message in order, a malformed
line names its line number and adds nothing, an import is atomic per namespace."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from shared_core import Message
from shared_core.cli import app
from shared_core.serve.transfer import open_stored_kinds
from tests.support.memory import HashEmbedder, message_text

RUN = CliRunner()


@pytest.fixture(autouse=True)
def _cheap_embedder(monkeypatch):
    monkeypatch.setattr("shared_core.models.local.LocalEmbedder", HashEmbedder)


def _msgs(prefix: str, n: int) -> list[Message]:
    return [
        Message(
            message_text(i),
            role="user" if i % 2 else None,
            speaker="Ann" if i % 3 else None,
            timestamp=f"2025-05-0{i + 1}" if i % 2 == 0 else None,
            id=f"{prefix}{i}" if i != 1 else None,
            metadata={"i": i, "tags": ["x", "y"][: i % 3], "nested": {"é": "ü"}} if i else {},
        )
        for i in range(n)
    ]


def _fill(path, spaces: dict) -> None:
    mems = open_stored_kinds(str(path), embedder=HashEmbedder())
    for (ns, kind), messages in spaces.items():
        if kind != "segtree":
            mems.close()
            mems = open_stored_kinds(str(path), kind, embedder=HashEmbedder())
        mems.add(ns, messages)
    mems.close()


def _contents(path) -> dict:
    mems = open_stored_kinds(str(path), embedder=HashEmbedder())
    try:
        return {ns: mems.get_all(ns) for ns in mems.list_namespaces()}
    finally:
        mems.close()


def test_export_then_import_keeps_every_field_in_order(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    spaces = {(("ann",), "segtree"): _msgs("a", 6), (("bob", "s1"), "hat"): _msgs("b", 4)}
    _fill(src, spaces)
    out = tmp_path / "out.jsonl"
    r = RUN.invoke(app, ["export", str(src), str(out)])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in out.read_text("utf-8").splitlines()]
    assert len(lines) == 10 and set(lines[0]) == {
        "namespace",
        "text",
        "role",
        "speaker",
        "timestamp",
        "id",
        "metadata",
    }
    r = RUN.invoke(app, ["import", str(out), str(dst), "--memory", "xmemory"])
    assert r.exit_code == 0, r.output
    assert _contents(dst) == {ns: m for (ns, _), m in spaces.items()}
    again = tmp_path / "again.jsonl"
    assert RUN.invoke(app, ["export", str(dst), str(again)]).exit_code == 0
    assert again.read_text("utf-8") == out.read_text("utf-8")
    one = tmp_path / "one.jsonl"
    assert (
        RUN.invoke(app, ["export", str(src), str(one), "--namespace", "bob", "--namespace", "s1"]).exit_code
        == 0
    )
    assert [json.loads(x)["namespace"] for x in one.read_text("utf-8").splitlines()] == [["bob", "s1"]] * 4
    r = RUN.invoke(app, ["inspect", str(dst)])
    assert r.exit_code == 0 and "xmemory" in r.output and "bob/s1" in r.output


BAD = [
    ("not json", "not JSON"),
    ('["a list"]', "JSON object"),
    ('{"namespace": ["z"], "text": ""}', "empty"),
    ('{"namespace": ["z"], "text": "ok", "colour": "red"}', "colour"),
    ('{"namespace": ["z"], "text": "ok", "metadata": [1]}', "metadata"),
    ('{"namespace": ["z"], "text": "ok", "id": 7}', "id must be a string"),
    ('{"text": "no namespace"}', "namespace"),
    ('{"namespace": ["z"], "text": "ok", "id": "z1"}', "already on line 1"),
    ('{"namespace": ["z"], "text": "ok", "speaker": "' + "s" * 1001 + '"}', "MAX_SPEAKER_CHARS"),
]


@pytest.mark.parametrize(("line", "said"), BAD)
def test_a_malformed_line_names_its_number_and_adds_nothing(tmp_path, line, said):
    dst = tmp_path / "dst"
    _fill(dst, {(("z",), "segtree"): [Message("kept", id="k")]})
    before = _contents(dst)
    src = tmp_path / "in.jsonl"
    good = [{"namespace": ["z"], "text": "one", "id": "z1"}, {"namespace": ["new"], "text": "two"}]
    src.write_text("\n".join([*map(json.dumps, good), line, json.dumps(good[1])]) + "\n", "utf-8")
    r = RUN.invoke(app, ["import", str(src), str(dst)])
    assert r.exit_code == 1
    assert "line 3" in r.output and said in r.output.replace("\n", "")
    assert _contents(dst) == before


def test_an_import_is_atomic_per_namespace_and_upsert_replaces(tmp_path):
    dst = tmp_path / "dst"
    _fill(dst, {(("ann",), "segtree"): [Message("old text", id="a0")]})
    src = tmp_path / "in.jsonl"
    rows = [
        {"namespace": ["ann"], "text": "new", "id": "x"},
        {"namespace": ["ann"], "text": "newer", "id": "a0"},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    r = RUN.invoke(app, ["import", str(src), str(dst)])
    assert r.exit_code == 1 and "'a0'" in r.output and "ann" in r.output
    assert [m.text for m in _contents(dst)[("ann",)]] == ["old text"]
    assert RUN.invoke(app, ["import", str(src), str(dst), "--upsert"]).exit_code == 0
    assert [(m.id, m.text) for m in _contents(dst)[("ann",)]] == [("x", "new"), ("a0", "newer")]


def test_missing_stores_and_namespaces_are_errors(tmp_path):
    assert RUN.invoke(app, ["export", str(tmp_path / "nope"), str(tmp_path / "o.jsonl")]).exit_code == 1
    assert RUN.invoke(app, ["inspect", str(tmp_path / "nope")]).exit_code == 1
    _fill(tmp_path / "s", {(("ann",), "segtree"): [Message("x")]})
    r = RUN.invoke(app, ["export", str(tmp_path / "s"), str(tmp_path / "o.jsonl"), "--namespace", "bob"])
    assert r.exit_code == 1 and "bob" in r.output and not (tmp_path / "o.jsonl").exists()
    r = RUN.invoke(app, ["import", str(tmp_path / "o.jsonl"), str(tmp_path / "s"), "--memory", "tree"])
    assert r.exit_code == 1
