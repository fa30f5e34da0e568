"""Helpers of the browser tests: open the page, wait for a figure, save a screenshot."""

from __future__ import annotations

from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def open_page(browser, server, viewport=DESKTOP):
    ctx = browser.new_context(viewport=viewport)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "status of 4" not in m.text else None)
    page.goto(server + "/")
    page.wait_for_selector("body[data-ready=true]", timeout=30000)
    page.js_errors = errors
    return page


def settle(page, fig: str, timeout: float = 20000) -> None:
    """Wait until the figure has drawn its latest answer (data-pending="0")."""
    page.wait_for_selector(f"#{fig}[data-pending='0']", timeout=timeout)


def shoot(page, fig: str, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.locator(f"#{fig}").screenshot(path=str(path))
    return path
