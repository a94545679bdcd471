"""Pictures that explain a query: the top-k hits of the memory's own policy marked with rank, score and
path, nodes shaded by cosine on a fixed scale, a legend; in the HTML page, the PNG and ``hiermem viz``.

Most memories use the deterministic hash embedder (the marks must match ``retrieve`` whatever the vectors
mean); the CLI's query run uses the real local embedder, as ``hiermem viz`` loads a save with it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from shared_core import HAT, MemTree, Message, SegTreeMem
from shared_core.cli import app
from shared_core.types import InvalidInputError, LLMRequiredError, UnknownPolicyError
from shared_core.viz import plot_tree_shape, render_html, tree_figure, tree_layout
from shared_core.viz.layout import LANE_OFFSETS, mark_lanes
from shared_core.viz.query import SCALE, scale_color
from tests.support.viz import PAYLOAD, TEXTS, HashEmbedder, html_payload

QUERY = "Where does my sister live?"
FILLER = [f"Filler note {i}: the weather was mild and the shop had fresh bread." for i in range(24)]


def _xmemory_cls():
    return pytest.importorskip("shared_core.memories.xmemory").XMemory


def _memory(kind: str, texts=TEXTS, dim: int = 32, embedder=None):
    cls = {"segtree": SegTreeMem, "memtree": MemTree, "hat": HAT}.get(kind) or _xmemory_cls()
    kwargs = {"max_episode_messages": 3} if kind == "xmemory" else {}
    mem = cls(embedder=embedder or HashEmbedder(dim), **kwargs)
    mem.add([Message(t, speaker="User", id=f"m{i}") for i, t in enumerate(texts)])
    return mem


def _cosines(mem, query: str) -> dict[int, float]:
    ids, r = mem.relevance(query, "dense")
    return {int(i): min(1.0, float(v)) for i, v in zip(ids.tolist(), r.tolist())}


# =========================================================================== HTML data
@pytest.mark.parametrize(
    ("kind", "policy"),
    [("segtree", None), ("segtree", "top_down"), ("memtree", None), ("hat", "greedy"), ("xmemory", None)],
)
def test_html_marks_the_top_k_hits_of_the_policy_with_rank_score_and_path(kind, policy, tmp_path):
    mem = _memory(kind, TEXTS + FILLER[:6])
    data = html_payload(
        render_html(mem, tmp_path / "q.html", query=QUERY, k=4, policy=policy).read_text("utf-8")
    )
    hits = mem.retrieve(QUERY, k=4, policy=policy)
    assert hits and data["has_scores"] is True
    assert data["policy"] == (policy or mem.default_policy) and data["k"] == 4 and data["query"] == QUERY
    assert [(h["rank"], h["node_id"], h["score"], h["path"], h["text"]) for h in data["hits"]] == [
        (h.rank, h.node_id, h.score, h.path, h.text) for h in hits
    ]
    assert [h["components"] for h in data["hits"]] == [h.components for h in hits]
    assert [h["explain"] for h in data["hits"]] == [h.explain() for h in hits]
    nodes = {n["id"]: n for n in data["nodes"]}
    on_path = {i for h in hits for i in h.path}
    for n in nodes.values():
        hit = next((h for h in hits if h.node_id == n["id"]), None)
        assert n["hit"] == (None if hit is None else {"rank": hit.rank, "explain": hit.explain()})
        assert n["on_path"] == (n["id"] in on_path)
        assert n["components"] == (hit.components if hit is not None else {"dense": n["score"], **(
            {"bm25": n["components"]["bm25"]} if mem.relevance_kind != "dense" else {})})  # fmt: skip
    # every path edge joins a node to its child on the way to a hit, between drawn nodes
    drawn_pairs = set()
    for h in hits:
        drawn = [i for i in h.path if i in nodes]
        drawn_pairs |= set(zip(drawn, drawn[1:]))
    assert {(e["from"], e["to"]) for e in data["edges"]} == drawn_pairs
    for e in data["edges"]:
        assert (e["row_from"], e["row_to"]) == (nodes[e["from"]]["row"], nodes[e["to"]]["row"])


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat", "xmemory"])
def test_html_shades_every_node_by_its_cosine_on_a_fixed_scale(kind, tmp_path):
    mem = _memory(kind)
    data = html_payload(render_html(mem, tmp_path / "q.html", query=QUERY, k=3).read_text("utf-8"))
    cos = _cosines(mem, QUERY)
    hits = {h.node_id: h.score for h in mem.retrieve(QUERY, k=3)}
    for n in data["nodes"]:
        expected = hits.get(n["id"], max(0.0, cos[n["id"]]))
        assert n["score"] == pytest.approx(expected, abs=1e-6)
        assert n["fill"] == scale_color(n["score"])  # the fixed scale, not divided by the best node's
    if mem.relevance_kind in ("bm25", "hybrid"):
        ids, bm = mem.relevance(QUERY, "bm25")
        bm25 = dict(zip(ids.tolist(), bm.tolist()))
        assert all(n["components"]["bm25"] == pytest.approx(bm25[n["id"]]) for n in data["nodes"])


def test_a_message_keeps_its_shade_whatever_else_the_memory_holds(tmp_path):
    small, big = _memory("segtree"), _memory("segtree", TEXTS + FILLER)
    shade = {}
    for name, mem in (("small", small), ("big", big)):
        data = html_payload(render_html(mem, tmp_path / f"{name}.html", query=QUERY).read_text("utf-8"))
        shade[name] = {n["text"]: (n["score"], n["fill"]) for n in data["nodes"] if n["is_leaf"]}
    for text in shade["small"]:
        assert shade["big"][text][0] == pytest.approx(shade["small"][text][0], abs=1e-6)
        assert shade["big"][text][1] == shade["small"][text][1]


def test_html_legend_and_hit_list(tmp_path):
    mem = _memory("hat")
    html = render_html(mem, tmp_path / "q.html", query=QUERY, k=3, policy="top_down").read_text("utf-8")
    data = html_payload(html)
    assert set(data["legend"]) == {"shade", "mark", "path"}
    assert "cosine similarity" in data["legend"]["shade"] and "0" in data["legend"]["shade"]
    assert "top 3 hits of policy 'top_down'" in data["legend"]["mark"]
    assert "path from the root" in data["legend"]["path"]
    assert 'id="legend"' in html and 'id="hits"' in html and 'id="tip"' in html
    assert f"query: {QUERY} · top 3 by top_down" in html
    # the gradient of the legend is the scale of the shading
    assert "linear-gradient(to right, " + ", ".join(f"{c} {s * 100:.0f}%" for s, c in SCALE) in html


def test_hit_texts_are_script_safe_and_ids_name_only_nodes(tmp_path):
    mem = _memory("segtree")
    html = render_html(mem, tmp_path / "all.html", query="an injection", k=50).read_text("utf-8")
    data = html_payload(html)
    assert any(PAYLOAD in h["text"] for h in data["hits"])  # every node is a hit: the hostile one too
    assert PAYLOAD not in html and html.count("<script") == 2 and html.count("</script>") == 2
    assert html.count('"id":') == len(tree_layout(mem).nodes)  # hits name nodes by "node_id"


def test_html_without_a_query_has_no_marks(tmp_path):
    data = html_payload(render_html(_memory("segtree"), tmp_path / "p.html").read_text("utf-8"))
    assert data["has_scores"] is False and data["hits"] == [] and data["edges"] == []
    assert all(n["hit"] is None and not n["on_path"] and n["score"] is None for n in data["nodes"])


def test_scale_color_is_fixed_and_monotone():
    assert scale_color(0.0) == SCALE[0][1] and scale_color(1.0) == SCALE[-1][1]
    assert scale_color(-0.3) == scale_color(0.0) and scale_color(1.7) == scale_color(1.0)
    assert scale_color(0.6) == "#4292c6"
    dark = [sum(int(scale_color(s)[i : i + 2], 16) for i in (1, 3, 5)) for s in np.linspace(0, 1, 41)]
    assert all(a >= b for a, b in zip(dark, dark[1:])) and dark[0] > dark[-1]  # darker as the score grows


# =========================================================================== mark lanes
@settings(deadline=None)  # no timed tests: the machine's load must not fail this
@given(
    st.lists(st.tuples(st.integers(0, 3), st.floats(0, 50, allow_nan=False)), max_size=30),
    st.floats(0.1, 10),
)
def test_mark_lanes_keep_marks_apart(marks, gap):
    lanes = mark_lanes(marks, gap)
    assert lanes == mark_lanes(list(marks), gap) and len(lanes) == len(marks)
    assert all(0 <= lane < len(LANE_OFFSETS) for lane in lanes)
    for row in {r for r, _ in marks}:
        if sum(r == row for r, _ in marks) > len(LANE_OFFSETS):
            continue  # more marks than lanes on a row may have to share one
        for lane in set(lanes):
            xs = sorted(x for (r, x), n in zip(marks, lanes) if r == row and n == lane)
            assert all(b - a >= gap for a, b in zip(xs, xs[1:]))
    if all(abs(a[1] - b[1]) >= gap for i, a in enumerate(marks) for b in marks[i + 1 :] if a[0] == b[0]):
        assert set(lanes) <= {0}  # marks far apart all sit in the middle lane


# =========================================================================== PNG
def _figure_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("kind", ["segtree", "memtree", "xmemory"])
def test_png_figure_marks_hits_and_carries_a_legend(kind):
    mem = _memory(kind, TEXTS + FILLER[:6])
    hits = mem.retrieve(QUERY, k=5)
    fig = tree_figure(mem, query=QUERY, k=5)
    texts = _figure_texts(fig)
    for h in hits:  # a mark with the rank and one with the score, and a line of the hit list
        assert str(h.rank) in texts and f"{h.score:.2f}" in texts
    listing = next(t for t in texts if t.startswith("top 5 by "))
    for h in hits:
        assert f"#{h.rank:<2} {h.score:.2f}  " in listing and f" {h.node_id}: " in listing
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1
    words = " ".join(t.get_text() for t in legends[0].get_texts()).replace("\n", " ")
    assert "cosine similarity" in words and f"top 5 hits of policy '{mem.default_policy}'" in words
    assert "path from the root" in words
    assert f'query "{QUERY}"' in fig.axes[0].get_title()
    # the colour bar of the fixed scale: 0 to 1
    assert any(ax.get_xlim() == (0.0, 1.0) and "cosine" in ax.get_xlabel() for ax in fig.axes)


def test_png_with_a_query_differs_from_one_without(tmp_path):
    mem = _memory("segtree", TEXTS + FILLER[:6])
    plain = plot_tree_shape(mem, tmp_path / "plain.png", dpi=80)
    asked = plot_tree_shape(mem, tmp_path / "asked.png", dpi=80, query=QUERY, k=3)
    other = plot_tree_shape(mem, tmp_path / "other.png", dpi=80, query=QUERY, k=3, policy="bottom_up")
    with Image.open(plain) as a, Image.open(asked) as b, Image.open(other) as c:
        assert a.format == b.format == "PNG"
        assert b.size[0] > a.size[0]  # the side panel: legend, colour bar, hit list
        pixels = np.asarray(b.convert("RGB"))
        # the hit marks' red (MARK_COLOR #d62728) is drawn; the plain picture has none of it
        red = (np.abs(pixels.astype(int) - [0xD6, 0x27, 0x28]).sum(axis=2) < 30).sum()
        assert red > 50
        assert (
            np.abs(np.asarray(a.convert("RGB")).astype(int) - [0xD6, 0x27, 0x28]).sum(axis=2) < 30
        ).sum() == 0
        if [h.node_id for h in mem.retrieve(QUERY, k=3, policy="bottom_up")] != [
            h.node_id for h in mem.retrieve(QUERY, k=3)
        ]:
            assert np.asarray(c.convert("RGB")).tobytes() != pixels.tobytes()


def test_png_shaded_bars_keep_grey_edges_only_while_they_fit():
    small = _memory("segtree")
    big = SegTreeMem(embedder=HashEmbedder(16))
    big.add([f"note {i} on topic {i % 7}" for i in range(201)])
    for mem, width in ((small, 0.3), (big, 0.0)):  # past 200 leaves, edges would hide the shades
        ax = tree_figure(mem, query=QUERY, k=2).axes[0]
        widths = {float(w) for c in ax.collections if c.get_facecolor().any() for w in c.get_linewidths()}
        assert width in widths


def test_png_time_axis_with_a_query(tmp_path):
    mem = SegTreeMem(embedder=HashEmbedder())
    mem.add([Message(t, id=f"m{i}", timestamp=f"2025-12-{1 + i:02d}T09:00:00") for i, t in enumerate(TEXTS)])
    with Image.open(plot_tree_shape(mem, tmp_path / "t.png", x="time", query=QUERY, k=2)) as img:
        assert img.format == "PNG"


# =========================================================================== errors
BAD = [
    ({"k": 0}, InvalidInputError, "k must be a positive integer, got 0"),
    ({"k": -2}, InvalidInputError, "got -2"),
    ({"k": True}, InvalidInputError, "got True"),
    ({"k": "3"}, InvalidInputError, "got '3'"),
    ({"policy": "nope"}, UnknownPolicyError, "no policy 'nope'; choose one of collapsed, top_down"),
    ({"policy": "agent"}, LLMRequiredError, "needs an LLM"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD)
@pytest.mark.parametrize("draw", ["html", "png"])
def test_bad_k_or_policy_raise_typed_errors_and_write_nothing(draw, kwargs, error, message, tmp_path):
    mem = _memory("hat")
    before = mem.to_dict()
    target = tmp_path / "sub" / f"out.{draw}"
    fn = render_html if draw == "html" else plot_tree_shape
    with pytest.raises(error, match=message):
        fn(mem, target, query=QUERY, **kwargs)
    assert not target.exists() and not target.parent.exists()
    if error is not LLMRequiredError:  # k and policy are checked without a query too
        with pytest.raises(error, match=message):
            fn(mem, target, **kwargs)
    with pytest.raises(InvalidInputError, match="non-empty"):
        fn(mem, target, query="  ")
    assert not target.exists() and mem.to_dict() == before


def test_empty_memory_with_a_query(tmp_path):
    mem = SegTreeMem(embedder=HashEmbedder())
    data = html_payload(render_html(mem, tmp_path / "e.html", query=QUERY).read_text("utf-8"))
    assert data["hits"] == [] and data["nodes"] == []
    with Image.open(plot_tree_shape(mem, tmp_path / "e.png", query=QUERY)) as img:
        assert img.format == "PNG"
    assert tree_layout(mem).n_leaves == 0


# =========================================================================== hiermem viz
runner = CliRunner()


def _out(res) -> str:
    return " ".join(res.output.split())


def test_cli_viz_marks_hits_of_the_chosen_policy(local_embedder, tmp_path):
    mem = _memory("segtree", TEXTS + FILLER[:4], embedder=local_embedder)
    save = mem.save(tmp_path / "seg")
    out, png = tmp_path / "q.html", tmp_path / "q.png"
    args = ["viz", str(save), "--query", QUERY, "--k", "3", "--policy", "top_down", "--out", str(out)]
    res = runner.invoke(app, [*args, "--png", str(png)])
    assert res.exit_code == 0, res.output
    data = html_payload(out.read_text("utf-8"))
    hits = mem.retrieve(QUERY, k=3, policy="top_down")
    assert data["policy"] == "top_down" and data["k"] == 3
    assert [(h["rank"], h["node_id"], h["path"]) for h in data["hits"]] == [
        (h.rank, h.node_id, h.path) for h in hits
    ]
    assert [h["score"] for h in data["hits"]] == pytest.approx([h.score for h in hits], abs=1e-6)
    assert "Oslo" in data["hits"][0]["text"] or "Maria" in data["hits"][0]["text"]
    plain = tmp_path / "plain.png"
    assert (
        runner.invoke(
            app, ["viz", str(save), "--out", str(tmp_path / "p.html"), "--png", str(plain)]
        ).exit_code
        == 0
    )
    with Image.open(png) as a, Image.open(plain) as b:
        assert a.size != b.size  # the PNG follows --query (it ignored it before)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--k", "0"], "k must be a positive integer, got 0"),
        (["--k", "-3"], "got -3"),
        (["--policy", "nope"], "has no policy 'nope'; choose one of collapsed, top_down, bottom_up"),
    ],
)
def test_cli_viz_bad_k_or_policy_exit_1_and_write_nothing(args, message, tmp_path):
    save = _memory("segtree", dim=384).save(tmp_path / "s")
    out, png = tmp_path / "o.html", tmp_path / "o.png"
    for query in ([], ["--query", QUERY]):
        res = runner.invoke(app, ["viz", str(save), *query, *args, "--out", str(out), "--png", str(png)])
        assert res.exit_code == 1 and message in _out(res) and "cannot render" in _out(res)
        assert not out.exists() and not png.exists()


def test_cli_viz_help_names_the_new_options():
    res = runner.invoke(app, ["viz", "--help"], terminal_width=80)
    text = _out(res)
    assert "--k" in text and "--policy" in text and "top-k hits" in text


def test_render_html_keeps_its_positional_arguments(tmp_path):
    page = render_html(_memory("hat"), tmp_path / "t.html", None, "A title")
    assert isinstance(page, Path) and "<title>A title</title>" in page.read_text("utf-8")
