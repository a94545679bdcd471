"""The HTML tree page in a real browser: headless Chromium (Debian's ``chromium`` + ``chromium-driver``)
driven by Selenium. Clicking a node's SVG rect shows its text in the side panel; a hostile node text is
shown as text and runs nothing; with a query, the hits' marks, paths, legend and hover figures are visible.

Skips when Selenium, ``chromium`` or ``chromedriver`` is missing (CI installs them). Selenium Manager is
never used: the driver and browser paths are given explicitly, so nothing is downloaded.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from shared_core import HAT, SegTreeMem
from shared_core.viz import render_html
from tests.support.viz import PAYLOAD, TEXTS, HashEmbedder, html_payload

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install selenium)"
)
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def _find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = _find("chromium", "chromium-browser")
CHROMEDRIVER = _find("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="headless browser test needs Debian's chromium and chromium-driver "
    "(apt-get install -y chromium chromium-driver); not found on PATH",
)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
]


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="hiermem-chromium-")
    options = Options()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _no_alert(driver) -> None:
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018


def _click(driver, nid: int) -> tuple[str, str]:
    el = driver.find_element(By.ID, f"node-{nid}")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'});", el)
    el.click()
    text = driver.find_element(By.ID, "text").get_attribute("textContent")
    info = driver.find_element(By.ID, "info").get_attribute("textContent")
    assert "selected" in (el.get_attribute("class") or "")
    return text, info


@pytest.mark.parametrize("cls", [SegTreeMem, HAT])
def test_clicking_a_node_shows_its_text(browser, cls, tmp_path: Path):
    mem = cls(embedder=HashEmbedder())
    mem.add(TEXTS)
    page = render_html(mem, tmp_path / "tree.html", query="Where does my sister live?")
    data = html_payload(page.read_text(encoding="utf-8"))
    browser.get(page.as_uri())
    _no_alert(browser)
    rects = browser.find_elements(By.CSS_SELECTOR, "rect.node")
    assert sorted(r.get_attribute("id") for r in rects) == sorted(f"node-{n['id']}" for n in data["nodes"])
    assert browser.find_element(By.ID, "text").get_attribute("textContent") == ""

    leaf = next(n for n in data["nodes"] if n["is_leaf"] and n["text"].endswith(TEXTS[2]))
    inner = next(n for n in data["nodes"] if not n["is_leaf"])
    hostile = next(n for n in data["nodes"] if n["is_leaf"] and PAYLOAD in n["text"])
    for node in (leaf, inner, hostile):
        text, info = _click(browser, node["id"])
        assert text == node["text"]  # the panel shows the node's own text, verbatim
        assert f"node {node['id']} " in info and f"span [{node['span'][0]}, {node['span'][1]}]" in info
        assert "score" in info
    _no_alert(browser)  # the hostile text was displayed, not executed
    assert browser.execute_script("return document.scripts.length") == 2
    # one node selected at a time
    assert len(browser.find_elements(By.CSS_SELECTOR, "rect.node.selected")) == 1


BOX = "const r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.width, r.height];"


def _inside(driver, el, box) -> bool:
    r = driver.execute_script(BOX, el)
    return r[2] > 0 and r[3] > 0 and box[0] <= r[0] and r[0] + r[2] <= box[0] + box[2] + 1 and box[1] <= r[1]


@pytest.mark.parametrize(("cls", "policy"), [(SegTreeMem, None), (HAT, "top_down")])
def test_query_marks_hits_paths_and_legend(browser, cls, policy, tmp_path: Path):
    from selenium.webdriver.common.action_chains import ActionChains

    mem = cls(embedder=HashEmbedder())
    mem.add(TEXTS)
    hits = mem.retrieve("Where does my sister live?", k=3, policy=policy)
    page = render_html(mem, tmp_path / "q.html", query="Where does my sister live?", k=3, policy=policy)
    data = html_payload(page.read_text(encoding="utf-8"))
    browser.get(page.as_uri())
    _no_alert(browser)
    svg_box = browser.execute_script(BOX, browser.find_element(By.ID, "svg"))
    # one visible red mark per hit, showing its rank and score, inside the drawing
    for h in hits:
        mark = browser.find_element(By.ID, f"hit-{h.rank}")
        assert mark.is_displayed() and _inside(browser, mark, svg_box)
        assert mark.get_attribute("textContent") == f"{h.rank}{h.score:.2f}"
        assert "hit" in browser.find_element(By.ID, f"node-{h.node_id}").get_attribute("class").split()
    assert len(browser.find_elements(By.CSS_SELECTOR, "g.hit-mark")) == len(hits)
    # the path from the root to each hit: drawn nodes outlined, joined by one line per edge
    on_path = {i for h in hits for i in h.path}
    outlined = {
        int(r.get_attribute("id")[5:]) for r in browser.find_elements(By.CSS_SELECTOR, "rect.node.on-path")
    }
    assert outlined == on_path & {n["id"] for n in data["nodes"]}
    edges = browser.find_elements(By.CSS_SELECTOR, "line.path-edge")
    # (a vertical edge has a box of zero width, which Selenium's is_displayed calls hidden: check the
    # drawing itself: a stroke, a length, nothing hiding it)
    shown = (
        "const r = arguments[0].getBoundingClientRect(), s = getComputedStyle(arguments[0]);"
        "return (r.width > 0 || r.height > 0) && s.visibility !== 'hidden' && s.display !== 'none'"
        " && s.stroke !== 'none' && parseFloat(s.strokeWidth) > 0 && parseFloat(s.opacity) > 0;"
    )
    assert len(edges) == len(data["edges"]) > 0 and all(browser.execute_script(shown, e) for e in edges)
    # the legend and the hit list are visible and say what the marks mean
    legend = browser.find_element(By.ID, "legend")
    assert legend.is_displayed()
    words = legend.text
    assert "cosine similarity" in words and "top 3 hits of policy" in words and "path from the root" in words
    items = browser.find_elements(By.CSS_SELECTOR, "#hits li")
    assert [li.text.split(" · ")[:2] for li in items] == [[f"#{h.rank}", f"{h.score:.2f}"] for h in hits]
    # hovering a node shows its figures; a hit's include its rank score and BM25 where the memory reads it
    top = hits[0]
    tip = browser.find_element(By.ID, "tip")
    assert not tip.is_displayed()
    node = browser.find_element(By.ID, f"node-{top.node_id}")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'});", node)
    ActionChains(browser).move_to_element(node).perform()
    assert tip.is_displayed()
    assert f"hit #1 by {top.policy}" in tip.text and f"score {top.score:.4f}" in tip.text
    assert f"rank score {top.components['rank']:.4f}" in tip.text
    if "bm25" in top.components:
        assert f"BM25 {top.components['bm25']:.2f}" in tip.text
    other = next(n for n in data["nodes"] if n["hit"] is None)
    el = browser.find_element(By.ID, f"node-{other['id']}")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'});", el)
    ActionChains(browser).move_to_element(el).perform()
    assert f"score {other['score']:.4f} (cosine similarity)" in tip.text and "rank score" not in tip.text
    # clicking a hit in the list selects its node and explains it
    items[0].click()
    assert (
        browser.find_element(By.CSS_SELECTOR, "rect.node.selected").get_attribute("id")
        == f"node-{top.node_id}"
    )
    assert top.explain() in browser.find_element(By.ID, "info").text
    _no_alert(browser)
