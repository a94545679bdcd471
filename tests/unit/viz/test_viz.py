"""Pictures of memory trees: the PNG of the tree's shape, the self-contained HTML page, ``hiermem viz``.

Most memories here use a deterministic hash embedder (no model load): the pictures depend on the tree,
not on the quality of the vectors. The ``--query`` shading is checked with the real local embedder.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from shared_core import HAT, MemTree, Message, SegTreeMem
from shared_core.cli import app
from shared_core.types import InvalidInputError
from shared_core.viz import parse_timestamp, plot_tree_shape, render_html, tree_layout
from tests.support.viz import PAYLOAD, TEXTS, HashEmbedder, html_payload

SVG_NS = "http://www.w3.org/2000/svg"


def _xmemory_cls():
    return pytest.importorskip(
        "shared_core.memories.xmemory", reason="shared_core.memories.xmemory is not available"
    ).XMemory


def _memory(kind: str, texts: Sequence[str] = TEXTS, timestamps: bool = False, dim: int = 32):
    cls = {"segtree": SegTreeMem, "memtree": MemTree, "hat": HAT}.get(kind) or _xmemory_cls()
    kwargs = {"max_episode_messages": 3} if kind == "xmemory" else {}
    mem = cls(embedder=HashEmbedder(dim), **kwargs)
    msgs = [
        Message(t, speaker="User" if i % 2 == 0 else "Assistant", id=f"m{i}",
                timestamp=f"2025-12-{19 + i // 3:02d} (day {i // 3})" if timestamps else None)
        for i, t in enumerate(texts)
    ]  # fmt: skip
    mem.add(msgs)
    return mem


def _text_nodes(mem) -> dict[int, dict]:
    return {n["id"]: n for n in mem.to_dict()["tree"]["nodes"] if n["text"]}


KINDS = ["segtree", "memtree", "hat", "xmemory"]


# =========================================================================== layout
@pytest.mark.parametrize("kind", KINDS)
def test_tree_layout_covers_every_text_node_and_leaf(kind):
    mem = _memory(kind)
    data = mem.to_dict()["tree"]
    nodes = {n["id"]: n for n in data["nodes"]}
    lay = tree_layout(mem)
    assert lay.kind == kind and lay.n_leaves == len(TEXTS) == len(mem)
    assert sorted(n.id for n in lay.nodes) == sorted(_text_nodes(mem))  # each text node once, no root
    rank = {
        i: r
        for r, i in enumerate(
            sorted((i for i in nodes if nodes[i]["is_leaf"]), key=lambda i: nodes[i]["span"][0])
        )
    }
    leaf_ranks = sorted(r for n in lay.nodes if n.is_leaf for r in n.ranks)
    assert leaf_ranks == list(range(len(TEXTS)))
    for n in lay.nodes:
        assert n.text == nodes[n.id]["text"]
        assert 0 <= n.row < len(lay.row_names) and n.level_name == lay.row_names[n.row]
        if n.is_leaf:
            assert len(n.ranks) == 1 and n.source == nodes[n.id]["message"]["id"]
            continue
        # an internal node's leaves are exactly the leaves in its subtree, at their insertion ranks
        assert n.ranks == sorted(rank[i] for i in _subtree_leaves(nodes, n.id))
        if kind in ("segtree", "hat"):  # contiguous spans
            assert n.ranks == list(range(n.ranks[0], n.ranks[-1] + 1))
    if kind == "xmemory":
        assert set(lay.row_names) <= {"theme", "semantic", "episode", "message"}
        assert lay.row_names[-1] == "message"
        for n in lay.nodes:  # a node's colour group is the theme above it (or itself)
            chain, p = [n.id], nodes[n.id]["parent"]
            while p is not None:
                chain.append(p)
                p = nodes[p]["parent"]
            themes = [i for i in chain if nodes[i]["level"] == 3]
            assert n.group == (themes[0] if themes else None)
    else:
        rows = [int(name.split()[1]) for name in lay.row_names]
        assert rows == sorted(rows) and all(n.row == rows.index(n.depth) for n in lay.nodes)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(TEXTS + ["Yes.", "No, thanks.", "Luna is a beagle."]), min_size=1, max_size=14)
)
def test_segtree_layout_rows_and_spans_property(texts):
    mem = SegTreeMem(embedder=HashEmbedder(16))
    mem.add(texts)
    lay = tree_layout(mem)
    assert lay.n_leaves == len(texts)
    nodes = {n["id"]: n for n in mem.to_dict()["tree"]["nodes"]}
    for n in lay.nodes:
        # ranks are the node's span (no deletions: ranks equal insertion indices), contiguous
        assert n.ranks == list(range(n.span[0], n.span[1] + 1))
        assert n.depth == len(_ancestors(nodes, n.id))
    assert sorted(r for n in lay.nodes if n.is_leaf for r in n.ranks) == list(range(len(texts)))


def _subtree_leaves(nodes: dict[int, dict], nid: int) -> list[int]:
    stack, out = [nid], []
    while stack:
        i = stack.pop()
        if nodes[i]["is_leaf"]:
            out.append(i)
        stack.extend(nodes[i]["children"])
    return out


def _ancestors(nodes: dict[int, dict], nid: int) -> list[int]:
    out, p = [], nodes[nid]["parent"]
    while p is not None:
        out.append(p)
        p = nodes[p]["parent"]
    return out


def test_layout_ranks_skip_deleted_leaves():
    mem = _memory("segtree")
    mem.delete("m2")
    lay = tree_layout(mem)
    assert lay.n_leaves == len(TEXTS) - 1
    assert sorted(r for n in lay.nodes if n.is_leaf for r in n.ranks) == list(range(len(TEXTS) - 1))
    assert all(n.source != "m2" for n in lay.nodes)


def test_parse_timestamp_formats():
    assert parse_timestamp("2025-12-19T10:30:00") == datetime(2025, 12, 19, 10, 30)
    assert parse_timestamp("2025-12-19T10:30:00+02:00") == datetime(2025, 12, 19, 10, 30)
    assert parse_timestamp("2025-12-19 (Friday)") == datetime(2025, 12, 19)  # RealMem
    assert parse_timestamp("2025-12-19 08:15 UTC") == datetime(2025, 12, 19, 8, 15)
    assert parse_timestamp("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56)  # LoCoMo
    for bad in (None, "", "  ", "yesterday", "2025-13-45", 20251219):
        assert parse_timestamp(bad) is None


# =========================================================================== PNG
@pytest.mark.parametrize("kind", KINDS)
def test_plot_tree_shape_writes_a_png_of_the_expected_size(kind, tmp_path):
    mem = _memory(kind)
    path = plot_tree_shape(mem, tmp_path / "sub" / "shape.png", dpi=100)
    assert path == tmp_path / "sub" / "shape.png"
    rows = len(tree_layout(mem).row_names)
    with Image.open(path) as img:
        assert img.format == "PNG"
        w, h = img.size
        assert abs(w - 100 * min(18.0, 6.0 + len(TEXTS) / 40.0)) <= 1
        assert abs(h - 100 * (1.3 + 0.5 * rows)) <= 1
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20  # bars, labels and title were drawn, not a blank canvas


def test_plot_tree_shape_time_axis(tmp_path):
    mem = _memory("segtree", timestamps=True)
    with Image.open(plot_tree_shape(mem, tmp_path / "time.png", x="time")) as img:
        assert img.format == "PNG"
    with pytest.raises(InvalidInputError, match="x='index'"):
        plot_tree_shape(_memory("segtree"), tmp_path / "none.png", x="time")  # no timestamps
    with pytest.raises(InvalidInputError, match="x must be one of"):
        plot_tree_shape(mem, tmp_path / "bad.png", x="depth")
    assert not (tmp_path / "none.png").exists() and not (tmp_path / "bad.png").exists()


def test_plot_tree_shape_of_an_empty_memory(tmp_path):
    with Image.open(plot_tree_shape(SegTreeMem(embedder=HashEmbedder()), tmp_path / "e.png")) as img:
        assert img.format == "PNG"


def test_plot_tree_shape_keeps_the_pyplot_backend(tmp_path):
    import matplotlib

    before = matplotlib.get_backend()
    plot_tree_shape(_memory("hat"), tmp_path / "h.png")
    assert matplotlib.get_backend() == before  # a notebook's inline backend is left alone


# =========================================================================== HTML
@pytest.mark.parametrize("kind", KINDS)
def test_render_html_is_self_contained_and_holds_every_node_text(kind, tmp_path):
    mem = _memory(kind)
    page = render_html(mem, tmp_path / "t.html", title="A <tree> & more")
    html = page.read_text(encoding="utf-8")
    # self-contained: no external scripts, styles, images or fonts; the only URL is the SVG namespace
    assert set(re.findall(r"https?://[^\s\"'<>)`]+", html)) == {SVG_NS}
    for ref in ("<link", " src=", "@import", "url(", "<iframe", "<img"):
        assert ref not in html
    # every node's text, exactly, in the embedded data
    data = html_payload(html)
    texts = {n["id"]: n["text"] for n in data["nodes"]}
    assert texts == {i: n["text"] for i, n in _text_nodes(mem).items()}
    assert data["leaves"] == len(TEXTS) and data["has_scores"] is False
    # the hostile text survives intact but cannot end the script element or open a new one
    assert any(PAYLOAD in t for t in texts.values())
    assert "</script><script>" not in html and PAYLOAD not in html
    assert html.count("</script>") == 2 and html.count("<script") == 2
    assert "<b>bold</b>" not in html and "<!-- comment -->" not in html
    assert "<title>A &lt;tree&gt; &amp; more</title>" in html


def test_render_html_query_scores(local_embedder, tmp_path):
    mem = SegTreeMem(embedder=local_embedder)
    mem.add(TEXTS)
    html = render_html(mem, tmp_path / "q.html", query="What is the name of my dog?").read_text("utf-8")
    data = html_payload(html)
    assert data["has_scores"] is True
    scores = {n["id"]: n["score"] for n in data["nodes"]}
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores.values())
    leaves = [n for n in data["nodes"] if n["is_leaf"]]
    best = max(leaves, key=lambda n: n["score"])
    assert "Luna" in best["text"]
    assert "query: What is the name of my dog?" in html


# =========================================================================== hiermem viz
runner = CliRunner()


def _out(res) -> str:
    return " ".join(res.output.split())  # the console wraps long lines


def test_cli_viz_renders_a_saved_memory(tmp_path):
    mem = _memory("memtree", dim=384)  # the CLI loads with the local embedder (384-d); no query: no model
    save = mem.save(tmp_path / "saved")
    out, png = tmp_path / "page.html", tmp_path / "shape.png"
    res = runner.invoke(app, ["viz", str(save), "--out", str(out), "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert "MemTree: 8 leaves" in _out(res) and f"wrote {out}" in _out(res)
    data = html_payload(out.read_text(encoding="utf-8"))
    assert {n["id"]: n["text"] for n in data["nodes"]} == {i: n["text"] for i, n in _text_nodes(mem).items()}
    with Image.open(png) as img:
        assert img.format == "PNG"


def test_cli_viz_default_output_and_time_axis(tmp_path):
    save = _memory("segtree", timestamps=True, dim=384).save(tmp_path / "seg")
    res = runner.invoke(app, ["viz", str(save), "--png", str(tmp_path / "t.png"), "--x", "time"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "seg.html").is_file()  # default: the save's path + ".html"
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_viz_with_query(local_embedder, tmp_path):
    mem = HAT(embedder=local_embedder)
    mem.add(TEXTS)
    save = mem.save(tmp_path / "hat")
    res = runner.invoke(
        app, ["viz", str(save), "--query", "Where does my sister live?", "--out", str(tmp_path / "h.html")]
    )
    assert res.exit_code == 0, res.output
    data = html_payload((tmp_path / "h.html").read_text(encoding="utf-8"))
    assert data["has_scores"] is True
    best = max((n for n in data["nodes"] if n["is_leaf"]), key=lambda n: n["score"])
    assert "Oslo" in best["text"] or "Maria" in best["text"]


def test_cli_viz_errors(tmp_path):
    res = runner.invoke(app, ["viz", str(tmp_path / "missing")])
    assert res.exit_code == 1 and "not a saved hiermem memory" in _out(res)
    save = _memory("segtree", dim=384).save(tmp_path / "s")
    res = runner.invoke(app, ["viz", str(save), "--png", str(tmp_path / "p.png"), "--x", "sideways"])
    assert res.exit_code == 1 and "x must be one of" in _out(res)
    assert not (tmp_path / "s.html").exists()
    res = runner.invoke(app, ["viz", str(save), "--png", str(tmp_path / "p.png"), "--x", "time"])
    assert res.exit_code == 1 and "timestamps" in _out(res)


def test_saved_xmemory_renders_through_the_cli(tmp_path):
    mem = _memory("xmemory", dim=384)
    save = mem.save(tmp_path / "x")
    res = runner.invoke(app, ["viz", str(save), "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 0, res.output
    data = html_payload((tmp_path / "x.html").read_text(encoding="utf-8"))
    assert {n["row_name"] for n in data["nodes"]} <= {"theme", "semantic", "episode", "message"}
    assert len(data["nodes"]) == len(_text_nodes(mem))


def test_render_html_path_type(tmp_path):
    assert isinstance(render_html(_memory("hat"), str(tmp_path / "s.html")), Path)
