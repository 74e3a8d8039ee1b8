"""Opening the serve page in the test browser (shared by the photo and the video browser tests)."""

from __future__ import annotations


def open_ready_page(browser, url: str, viewport: dict, timeout_ms: int):
    """A new page at ``url``, console and page errors collected, once the app says it is ready -> (page, logs)."""
    page = browser.new_page(viewport=viewport)
    logs: list[str] = []
    page.on("console", lambda m: logs.append(m.text))
    page.on("pageerror", lambda e: logs.append(f"pageerror: {e}"))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=timeout_ms)
    return page, logs
