"""Headless Chromium through Playwright, against a live server; skipped when either is missing."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("SQLTASKS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``browser`` (make test leaves them to CI's database legs), and
    skip them when Playwright or Chromium is missing."""
    here = [item for item in items if Path(str(item.fspath)).is_relative_to(Path(__file__).parent)]
    for item in here:
        item.add_marker(pytest.mark.browser)
    reason = None
    # Looked up, not imported: every pytest process runs this hook, and an import of Playwright
    # costs about half a second of CPU in each, browser tests selected or not.
    if importlib.util.find_spec("playwright") is None:
        reason = "browser tests need the playwright package (pip install playwright)"
    if reason is None and not os.access(CHROMIUM, os.X_OK):
        reason = f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium)"
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in here:
        item.add_marker(skip)


@pytest.fixture(scope="package")
def browser(live_server: Any) -> Iterator[Any]:
    """Chromium, started once for the browser tests a pytest process runs in a row (pytest ends
    it before any test outside this folder): a start costs about a second of CPU."""
    from playwright.sync_api import sync_playwright  # optional: these tests skip without it

    # Playwright's sync API keeps an event loop running on this thread, which Django takes
    # for an async context; the tests' own ORM calls are synchronous, so allow them. The loop
    # and the setting end with this fixture, before a test outside this folder runs.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def screenshot(page: Any) -> Any:
    """Save a full-page screenshot as artifacts/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
