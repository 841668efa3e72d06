"""The web page in a real headless browser: stream an output, then its heatmap and table.

Needs Playwright and a browser it can launch; skips with the reason where there is none.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from .conftest import Client  # noqa: E402


def test_page_scripts_parse(client: Client, tmp_path: Path) -> None:
    """Without a browser, at least every inline script of the served page is valid JavaScript."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's scripts cannot be syntax-checked")
    scripts = re.findall(r"<script(?: [^>]*)?>(.*?)</script>", client.get("/").text, re.S)
    assert len(scripts) == 2  # the attention drawing (run per output) and the page's own
    for n, script in enumerate(scripts):
        path = tmp_path / f"script{n}.js"
        path.write_text(script, encoding="utf-8")
        checked = subprocess.run([node, "--check", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("browser_name", ["chromium", "firefox"])
def test_page_translates_and_draws(client: Client, browser_name: str) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install playwright)"
    )
    with sync_api.sync_playwright() as playwright:
        try:
            browser = getattr(playwright, browser_name).launch()
        except Exception as error:  # no browser binary installed for Playwright
            pytest.skip(f"{browser_name} cannot be launched here: {str(error).splitlines()[0]}")
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{client.port}/")
            page.fill("#source", "3 1 4")
            page.click("#go")
            page.wait_for_selector("#output-0.chosen", timeout=20_000)
            assert page.inner_text("#output-0 .text") == "three one four"
            page.wait_for_selector("#root[data-rendered]", timeout=20_000)
            assert page.get_attribute("#root", "data-rendered") == "cross/0/mean"
            page.hover("#root table.heatmap td")
            assert "\u2192" in page.inner_text("#hover")
            page.select_option("#kind", "encoder")
            page.select_option("#head", "1")
            assert page.get_attribute("#root", "data-rendered") == "encoder/0/1"
            page.wait_for_selector("table.explain", timeout=20_000)
            assert page.locator("table.explain tr").count() == 1 + 4  # header, 3 tokens, <eos>
        finally:
            browser.close()
