"""/docs in a real browser: headless Chromium loads Swagger UI from the server's own copy (the
host has no network) and makes one embedding call through its "Try it out"."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver import Chrome, ChromeOptions
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as shown
from selenium.webdriver.support.wait import WebDriverWait

from tests.support.models import MINILM_NAME
from tests.support.server import running_server
from tests.support.waiting import PATIENCE_S

pytestmark = pytest.mark.process  # a server and a browser of their own

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
MINILM_WIDTH = 384
# Headless, and nothing that reaches past the host: no QUIC, sync, updates or background calls
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,1024")  # fmt: skip
# Swagger UI's block for the operation, found by its path; and in it, once executed, the
# server's answer under "Server response" (in tbody: the header row has the same classes)
BLOCK = "//div[contains(@class, 'opblock-post')][.//*[@data-path='/v1/embeddings']]"
STATUS = (BLOCK + "//table[contains(@class, 'live-responses-table')]/tbody"
          "//td[contains(@class, 'response-col_status')]")  # fmt: skip
RESPONSE_BODY = BLOCK + "//h5[text()='Response body']/following-sibling::*//pre"
# A body put in the textarea as typing would, at once (send_keys took seconds on a busy
# machine): the value through the element's own setter, then the input event React reads
TYPE_INTO = """const [area, text] = arguments;
Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value').set.call(area, text);
area.dispatchEvent(new Event('input', {bubbles: true}));"""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chrome]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs chromium and chromedriver (Debian's chromium, chromium-driver)")
    options = ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    # The driver named: Selenium does not look one up (it would ask the network)
    driver = Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(PATIENCE_S)
    try:
        yield driver
    finally:
        driver.quit()


def test_swagger_ui_tries_out_an_embedding_call_and_shows_the_models_vector(
    browser: Chrome, tmp_path: Path
) -> None:
    wait = WebDriverWait(browser, PATIENCE_S)
    with running_server(tmp_path, preload=MINILM_NAME) as server:
        browser.get(server.url + "/docs")
        wait.until(shown.element_to_be_clickable(in_block("*", "opblock-summary-control"))).click()
        wait.until(shown.element_to_be_clickable(in_block("button", "try-out__btn"))).click()
        body = wait.until(shown.visibility_of_element_located(
            in_block("textarea", "body-param__text")))  # fmt: skip
        typed = json.dumps({"model": MINILM_NAME, "input": "A try from the docs page."})
        browser.execute_script(TYPE_INTO, body, typed)
        browser.find_element(*in_block("button", "execute")).click()
        status = wait.until(shown.visibility_of_element_located((By.XPATH, STATUS))).text
        shown_body = browser.find_element(By.XPATH, RESPONSE_BODY).text
    assert status == "200", shown_body
    reply = json.loads(shown_body)
    assert reply["model"] == MINILM_NAME
    [row] = reply["data"]
    assert len(row["embedding"]) == MINILM_WIDTH
    assert all(isinstance(value, float) for value in row["embedding"])


def in_block(element: str, css_class: str) -> tuple[str, str]:
    """A locator of the `element` of that class inside POST /v1/embeddings' block."""
    return By.XPATH, f"{BLOCK}//{element}[contains(@class, '{css_class}')]"
