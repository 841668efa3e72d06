"""The web page in a real headless browser: stream an output, then its heatmap and table.

Chromium through Playwright, Firefox through Selenium and geckodriver; each skips with the
reason where its driver or browser is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from .conftest import Client, jsdom_driver  # noqa: E402


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
    node, driver = jsdom_driver()
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


class Browser(Protocol):
    """What the page test does to a page, the same through Playwright and through Selenium."""

    def goto(self, url: str) -> None: ...
    def fill(self, selector: str, text: str) -> None: ...
    def click(self, selector: str) -> None: ...
    def wait(self, selector: str) -> None: ...
    def text(self, selector: str) -> str: ...
    def attribute(self, selector: str, name: str) -> str | None: ...
    def hover(self, selector: str) -> None: ...
    def select(self, selector: str, value: str) -> None: ...
    def count(self, selector: str) -> int: ...
    def screenshot(self, path: Path) -> None: ...


WAIT_MS = 20_000


class PlaywrightBrowser:
    def __init__(self, page: Any) -> None:
        self.page = page

    def goto(self, url: str) -> None:
        self.page.goto(url)

    def fill(self, selector: str, text: str) -> None:
        self.page.fill(selector, text)

    def click(self, selector: str) -> None:
        self.page.click(selector)

    def wait(self, selector: str) -> None:
        self.page.wait_for_selector(selector, timeout=WAIT_MS)

    def text(self, selector: str) -> str:
        return str(self.page.inner_text(selector))

    def attribute(self, selector: str, name: str) -> str | None:
        return self.page.get_attribute(selector, name)

    def hover(self, selector: str) -> None:
        self.page.hover(selector)

    def select(self, selector: str, value: str) -> None:
        self.page.select_option(selector, value)

    def count(self, selector: str) -> int:
        return int(self.page.locator(selector).count())

    def screenshot(self, path: Path) -> None:
        self.page.screenshot(path=str(path), full_page=True)


class SeleniumBrowser:
    """Selenium's WebDriver: Firefox as the system installs it, driven through geckodriver."""

    def __init__(self, driver: Any) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver = driver
        self.waiter = WebDriverWait(driver, WAIT_MS / 1000)

    def find(self, selector: str) -> Any:
        return self.driver.find_element("css selector", selector)

    def goto(self, url: str) -> None:
        self.driver.get(url)

    def fill(self, selector: str, text: str) -> None:
        field = self.find(selector)
        field.clear()
        field.send_keys(text)

    def click(self, selector: str) -> None:
        self.find(selector).click()

    def wait(self, selector: str) -> None:
        self.waiter.until(lambda driver: driver.find_elements("css selector", selector))

    def text(self, selector: str) -> str:
        return str(self.find(selector).text)

    def attribute(self, selector: str, name: str) -> str | None:
        return self.find(selector).get_attribute(name)

    def hover(self, selector: str) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        ActionChains(self.driver).move_to_element(self.find(selector)).perform()

    def select(self, selector: str, value: str) -> None:
        from selenium.webdriver.support.ui import Select

        Select(self.find(selector)).select_by_value(value)

    def count(self, selector: str) -> int:
        return len(self.driver.find_elements("css selector", selector))

    def screenshot(self, path: Path) -> None:
        self.driver.save_full_page_screenshot(str(path))


@contextmanager
def chromium() -> Iterator[Browser]:
    """Playwright's own Chromium, or else the system's (Debian's ``chromium`` package:
    Playwright drives any recent Chromium)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install playwright)"
    )
    with sync_api.sync_playwright() as playwright:
        try:
            try:
                browser = playwright.chromium.launch()
            except Exception:
                system = shutil.which("chromium") or shutil.which("chromium-browser")
                if system is None:
                    raise
                browser = playwright.chromium.launch(executable_path=system)
        except Exception as error:  # no browser binary installed for Playwright
            pytest.skip(f"chromium cannot be launched here: {str(error).splitlines()[0]}")
        try:
            yield PlaywrightBrowser(browser.new_page())
        finally:
            browser.close()


@contextmanager
def firefox() -> Iterator[Browser]:
    """The system's Firefox through Selenium and geckodriver. Playwright cannot drive it: its
    Firefox is a patched build downloaded by ``playwright install``, and its WebDriver BiDi
    mode needs a newer Firefox than the ESR that Debian ships."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="Selenium is not installed (pip install selenium)"
    )
    binary = shutil.which("firefox") or shutil.which("firefox-esr")
    if binary is None:
        pytest.skip("firefox is not installed (Debian: apt install firefox-esr)")
    geckodriver = shutil.which("geckodriver")
    if geckodriver is None:
        pytest.skip("geckodriver is not on PATH: Selenium needs it to drive Firefox")
    options = webdriver.FirefoxOptions()
    options.add_argument("-headless")
    options.binary_location = binary
    service = webdriver.FirefoxService(executable_path=geckodriver)
    try:
        driver = webdriver.Firefox(options=options, service=service)
    except Exception as error:
        pytest.skip(f"firefox cannot be launched here: {str(error).splitlines()[0]}")
    try:
        yield SeleniumBrowser(driver)
    finally:
        driver.quit()


@pytest.mark.parametrize("open_browser", [chromium, firefox], ids=["chromium", "firefox"])
def test_page_translates_and_draws(
    client: Client, open_browser: Callable[[], AbstractContextManager[Browser]], tmp_path: Path
) -> None:
    with open_browser() as page:
        page.goto(f"http://127.0.0.1:{client.port}/")
        page.fill("#source", "3 1 4")
        page.click("#go")
        page.wait("#output-0.chosen")
        assert page.text("#output-0 .text") == "three one four"
        page.wait("#root[data-rendered]")
        assert page.attribute("#root", "data-rendered") == "cross/0/mean"
        page.hover("#root table.heatmap td")
        assert "\u2192" in page.text("#hover")
        page.select("#kind", "encoder")
        page.select("#head", "1")
        assert page.attribute("#root", "data-rendered") == "encoder/0/1"
        page.wait("table.explain")
        assert page.count("table.explain tr") == 1 + steps(client)
        shot = tmp_path / "page.png"
        page.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
