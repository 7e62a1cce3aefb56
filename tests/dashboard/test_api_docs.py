"""The API's own docs (Swagger UI at ``/docs``, ReDoc at ``/redoc``) in a real headless
Chromium that may reach nothing but the stack: they are served from the package, so they work
on a machine without internet access."""

from __future__ import annotations

from urllib.parse import urlsplit

from playwright.sync_api import Route, expect

# The browser and page fixtures of the dashboard tests (which skip, or fail in CI, without
# Chromium).
from tests.dashboard.browser import UI, browser, ui

__all__ = ["browser", "ui"]


def test_the_api_docs_render_offline(ui: UI) -> None:
    """Swagger UI and ReDoc load every script and style from the API itself: requests to
    anywhere else are refused here, and none is even tried."""
    page = ui.page
    elsewhere: list[str] = []

    def local_only(route: Route) -> None:
        if urlsplit(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", local_only)
    ui.open("docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("cdiflow")
    expect(page).to_have_title("cdiflow API")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    expect(page.locator("[data-path='/api/workflows/{workflow_id}/result']").first).to_be_visible()
    ui.shot("docs-swagger", full_page=False)
    ui.open("redoc")
    expect(page.get_by_text("/api/inputs").first).to_be_attached(timeout=20_000)
    expect(page.locator("h1").first).to_contain_text("cdiflow")
    # ReDoc's footer logo is drawn inline, not fetched from its maker's CDN (which the page's
    # policy would refuse, and assert_clean report).
    logo = page.locator("img[alt='redocly logo']")
    expect(logo).to_be_visible()
    assert (logo.get_attribute("src") or "").startswith("data:image/svg+xml,")
    ui.shot("docs-redoc", full_page=False)
    assert elsewhere == []
    ui.assert_clean()
