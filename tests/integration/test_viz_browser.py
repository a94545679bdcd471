"""The HTML tree page in a real browser: headless Chromium (Debian's ``chromium`` + ``chromium-driver``)
driven by Selenium. Clicking a node's SVG rect shows its text in the side panel; a hostile node text is
shown as text and runs nothing.

Skips when Selenium, ``chromium`` or ``chromedriver`` is missing (CI installs them). Selenium Manager is
never used: the driver and browser paths are given explicitly, so nothing is downloaded.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from shared_core import HAT, SegTreeMem
from shared_core.viz import render_html
from tests.support.viz import PAYLOAD, TEXTS, HashEmbedder

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


def _data(html: str) -> dict:
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


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
    data = _data(page.read_text(encoding="utf-8"))
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
