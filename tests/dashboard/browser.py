"""The dashboard tests' browser: Debian's ``chromium`` package, headless, driven by Playwright
(``pip install playwright``; no browser download), and a page on the dashboard that records every
error in the browser console (a failed request, an uncaught exception, a ``console.error``): a
test fails on any it does not name. Screenshots go to ``test-artifacts/screenshots/``.

Without Playwright or Chromium a module that imports this one is skipped locally with the
reason, and fails in CI (``CI`` set). The fixtures (``browser``, ``ui``, ``anonymous_ui``) are
shared by importing them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from tests.dashboard.support import Harness

__all__ = ["KEY_ITEM", "UI", "anonymous_ui", "browser", "rows", "ui", "ui_with_key"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the dashboard tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    from playwright.sync_api import Browser, Page, sync_playwright
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError as exc:  # pragma: no cover - depends on the machine
    _unavailable(f"playwright is not installed ({exc}); run `pip install playwright`")

CHROMIUM: Final = (
    os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
)
if CHROMIUM is None:  # pragma: no cover - depends on the machine
    _unavailable("no Chromium found; install Debian's `chromium` package or set CHROMIUM_PATH")

CHROMIUM_ARGS: Final = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS: Final = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
KEY_ITEM: Final = "cdiflow.apiKey"  # where the dashboard keeps the key (sessionStorage)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class UI:
    """One browser page on the dashboard, recording every console error."""

    page: Page
    base_url: str
    errors: list[str] = field(default_factory=list)
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    def open(self, route: str = "") -> None:
        """Go to ``route`` and wait for the dashboard to draw it. A load whose scripts Chromium
        dropped because the machine's network changed (other tests make host namespaces)
        draws nothing: it is loaded afresh, at most twice more. (Pages other than the
        dashboard's, such as the API's docs, have no ``#main``.)"""
        for attempt in range(3):
            before = len(self.errors)
            if attempt == 0:
                self.page.goto(f"{self.base_url}/{route}")
            else:  # (going to the URL again, which differs at most in its fragment, would
                self.page.reload()  # stay on the document whose scripts were dropped)
            if self.page.locator("#main").count() == 0:
                return
            try:
                self.page.locator("#main > *").first.wait_for(timeout=15_000)
                return
            except PlaywrightTimeout:
                dropped = any("ERR_NETWORK_CHANGED" in e for e in self.errors[before:])
                if not dropped or attempt == 2:
                    raise

    def allow(self, pattern: str) -> None:
        """Expect console errors matching ``pattern`` (e.g. the browser logging a 422)."""
        self.allowed.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]

    def assert_clean(self) -> None:
        assert not self.unexpected(), f"errors in the browser console: {self.unexpected()}"

    def shot(self, name: str, *, full_page: bool = True) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page, animations="disabled")
        return path


def _signed_in_as(key: str) -> str:
    """A page script that keeps ``key`` in the tab's session, as the sign-in form does."""
    return f"sessionStorage.setItem({json.dumps(KEY_ITEM)}, {json.dumps(key)})"


@pytest.fixture
def ui(browser: Browser, harness: Harness) -> Iterator[UI]:
    """A page signed in with the stack's admin key (the sign-in itself is tested below)."""
    yield from ui_with_key(browser, harness, harness.stack.api_key)


@pytest.fixture
def anonymous_ui(browser: Browser, harness: Harness) -> Iterator[UI]:
    yield from ui_with_key(browser, harness, None)


def ui_with_key(browser: Browser, harness: Harness, key: str | None) -> Iterator[UI]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    if key is not None:
        context.add_init_script(_signed_in_as(key))
    page = context.new_page()
    # Chromium drops requests when the machine's network changes, which other tests do (host
    # namespaces, container networks): the dashboard sends a GET again; the log line stays.
    view = UI(page, harness.stack.api_url, allowed=[re.compile("ERR_NETWORK_CHANGED")])
    page.on("console", lambda m: view.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: view.errors.append(f"uncaught {e.name}: {e.message}"))
    try:
        yield view
    finally:
        context.close()
    view.assert_clean()


def rows(page: Page, selector: str) -> list[str]:
    """The ``data-id`` of every row of a workflow table."""
    return [r.get_attribute("data-id") or "" for r in page.locator(selector).all()]
