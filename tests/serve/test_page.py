"""The web page in a real headless browser: stream an output, then its heatmap and table.

Needs Playwright and a browser it can launch; skips with the reason where there is none.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

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


def steps(client: Client) -> int:
    """The explain table's rows for "3 1 4" (a header aside): its tokens and <eos>."""
    answer = client.post("/v1/translate", {"inputs": "3 1 4"}).json()
    return answer["results"][0]["outputs"][0]["length"] + 1


def test_page_runs_in_jsdom(client: Client) -> None:
    """The page's scripts run in jsdom against the real server: the output streams in, the
    heatmap draws and answers hover and the selectors, the explain table fills, a refused
    setting shows its one line. Not a browser (no layout), but every line of the script."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page cannot be run in jsdom")
    if subprocess.run([node, "-e", "require('jsdom')"], capture_output=True).returncode != 0:
        pytest.skip("jsdom cannot be loaded by node (npm install jsdom; NODE_PATH)")
    driver = Path(__file__).with_name("page_driver.js")
    run = subprocess.run([node, str(driver), f"http://127.0.0.1:{client.port}/"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    greedy, beam, sampled, refused, page = (json.loads(x) for x in run.stdout.splitlines())
    assert page["errors"] == [] and "parameters" in page["model"]
    assert greedy["error"] == "" and greedy["outputs"] == ["three one four"]
    assert greedy["chosen"] == "output-0" and greedy["explainRows"] == 1 + steps(client)
    assert greedy["rendered"] == "cross/0/mean" and greedy["cells"] > 0
    assert "\u2192" in greedy["hover"] and greedy["renderedAfter"] == "encoder/0/1"
    assert len(beam["outputs"]) == 2 and beam["outputs"][0] == "three one four"
    assert len(sampled["outputs"]) == 2 and sampled["error"] == ""
    assert refused["error"] == "error: --beam-size 0 must be >= 1 (1 = no beam)"
    assert refused["outputs"] == [] and "rendered" not in refused


def launch(playwright: Any, browser_name: str) -> Any:
    """Playwright's own build of the browser, or else the system's Chromium (Debian's
    ``chromium`` package: Playwright drives any recent Chromium)."""
    kind = getattr(playwright, browser_name)
    try:
        return kind.launch()
    except Exception:
        system = shutil.which("chromium") or shutil.which("chromium-browser")
        if browser_name != "chromium" or system is None:
            raise
        return kind.launch(executable_path=system)


@pytest.mark.parametrize("browser_name", ["chromium", "firefox"])
def test_page_translates_and_draws(client: Client, browser_name: str, tmp_path: Path) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install playwright)"
    )
    with sync_api.sync_playwright() as playwright:
        try:
            browser = launch(playwright, browser_name)
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
            assert page.locator("table.explain tr").count() == 1 + steps(client)
            shot = tmp_path / f"{browser_name}.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        finally:
            browser.close()
