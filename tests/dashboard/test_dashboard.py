"""The web dashboard in a real headless Chromium, against a real stack (Postgres, Redis, S3,
CDI controller and minion, API, scheduler, two workers as processes).

Every test fails on any error in the browser console (a failed request, an uncaught exception,
a ``console.error``) unless it names the one it expects. Screenshots go to
``test-artifacts/screenshots/``. Chromium is Debian's ``chromium`` package driven by Playwright
(``pip install playwright``; no browser download): absent, the module is skipped locally with
the reason, and fails in CI (``CI`` set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Final

import pytest

from tests.dashboard.support import UUID, Harness, sample, wait_for


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the dashboard tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
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


# --- the browser ------------------------------------------------------------------------------


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
        self.page.goto(f"{self.base_url}/{route}")

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
    yield from _ui(browser, harness, harness.stack.api_key)


@pytest.fixture
def anonymous_ui(browser: Browser, harness: Harness) -> Iterator[UI]:
    yield from _ui(browser, harness, None)


def _ui(browser: Browser, harness: Harness, key: str | None) -> Iterator[UI]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    if key is not None:
        context.add_init_script(_signed_in_as(key))
    page = context.new_page()
    view = UI(page, harness.stack.api_url)
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


# --- the tests, in the order a person would explore -------------------------------------------


def test_start_a_workflow_and_watch_it_complete_without_reloading(ui: UI, harness: Harness) -> None:
    image = harness.upload("ui/start.jpg", sample("sunset.jpg"))
    page = ui.page
    ui.open("#/workflows")
    page.get_by_role("button", name="Start workflow").first.click()
    dialog = page.locator("#start-dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_label("Workflow", exact=True).select_option("image_pipeline")
    dialog.get_by_label("Input image (S3 URI)", exact=True).fill(image)
    dialog.get_by_label("Policy", exact=True).select_option("transfer")
    dialog.get_by_role("button", name="Start", exact=True).click()

    expect(page).to_have_url(re.compile(rf"#/workflows/{UUID}$"))
    run_id = page.url.rsplit("/", 1)[1]
    page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED", timeout=90_000)
    assert page.evaluate("window.__sameDocument === true")
    assert harness.get(run_id)["status"] == "COMPLETED"
    expect(page.locator(".dag .node[data-status=COMPLETED]")).to_have_count(3)
    expect(page.locator("figure[data-image=result][data-available=true] img")).to_be_visible()
    ui.shot("workflow-completed")

    ui.open("#/workflows")
    row = page.locator(f"tr[data-id='{run_id}']")
    expect(row).to_have_attribute("data-status", "COMPLETED")
    ui.assert_clean()


def test_sign_in_with_a_key_and_out_again(anonymous_ui: UI, harness: Harness) -> None:
    """Without a key the dashboard asks for one and asks the API for nothing else; a wrong
    key is refused with the reason; the right one shows who is signed in."""
    ui, page = anonymous_ui, anonymous_ui.page
    ui.allow(r"status of 401")  # the browser logs the refused key's request
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/api/" in r.url else None)
    ui.open("#/workflows")
    dialog = page.locator("#signin")
    expect(dialog).to_be_visible()
    # Nothing asked without a key but readiness, which is open like liveness.
    assert [r for r in requests if not r.endswith(("/api/readyz", "/api/healthz"))] == []
    page.keyboard.press("Escape")
    expect(dialog).to_be_visible()  # no way around it
    dialog.get_by_label("API key").fill("cdf_" + "x" * 43)
    dialog.get_by_role("button", name="Sign in").click()
    expect(page.locator("#signin-error")).to_contain_text("does not accept this key")
    dialog.get_by_label("API key").fill(harness.stack.api_key)
    dialog.get_by_role("button", name="Sign in").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("#who-name")).to_have_text("admin")
    expect(page.locator("#who-role")).to_have_text("admin")
    expect(page.locator("#workflow-table")).to_be_visible()
    assert page.evaluate(f"sessionStorage.getItem({json.dumps(KEY_ITEM)})") == harness.stack.api_key
    ui.shot("signed-in")
    page.locator("#sign-out").click()
    expect(dialog).to_be_visible()
    assert page.evaluate(f"sessionStorage.getItem({json.dumps(KEY_ITEM)})") is None
    ui.assert_clean()


def test_a_viewer_sees_runs_and_who_started_them_but_cannot_act(
    browser: Browser, harness: Harness, napping: str
) -> None:
    reply = harness.api.post("/api/keys", json={"name": "ui-viewer", "role": "viewer"})
    assert reply.status_code == 201, reply.text
    run_id = harness.start(napping, harness.upload("ui/viewer.jpg", sample("night.jpg")))
    for view in _ui(browser, harness, reply.json()["key"]):
        page = view.page
        view.open("#/workflows")
        expect(page.locator("#who-role")).to_have_text("viewer")
        expect(page.locator("#start-workflow")).to_be_disabled()
        expect(page.locator(f"tr[data-id='{run_id}']")).to_be_visible()
        headers = page.locator("table.workflows thead th").all_text_contents()
        row = page.locator(f"tr[data-id='{run_id}'] td").nth(headers.index("Started by"))
        expect(row).to_have_text("admin")
        view.open(f"#/workflows/{run_id}")
        expect(page.locator("#wf-started-by")).to_have_text("admin")
        expect(page.locator("#cancel")).to_be_disabled()
        expect(page.locator("#cancel")).to_have_attribute("title", re.compile("role operator"))
    harness.api.post(f"/api/workflows/{run_id}/cancel")


def test_a_dataless_run_starts_from_the_form_with_no_image(ui: UI, harness: Harness) -> None:
    """An empty image field starts a dataless run; its detail page says there is no image."""
    page = ui.page
    ui.open("#/workflows")
    page.get_by_role("button", name="Start workflow").first.click()
    dialog = page.locator("#start-dialog")
    dialog.get_by_label("Workflow", exact=True).select_option("noop_pipeline")
    dialog.get_by_label("Input image (S3 URI)", exact=True).fill("")
    dialog.get_by_role("button", name="Start", exact=True).click()
    expect(page).to_have_url(re.compile(rf"#/workflows/{UUID}$"))
    run_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED", timeout=60_000)
    assert harness.get(run_id)["input"] == {}
    expect(page.locator(".dag .node[data-status=COMPLETED]")).to_have_count(3)
    expect(page.locator("figure[data-image=input][data-available=false]")).to_be_visible()
    ui.assert_clean()


# For every task run bar longer than a quarter of the timeline (the nap): is its middle covered
# by a "holds the data" band on the same lane?
_RUNS_ON_HELD_LANES: Final = """() => {
  const lane = (el) => Math.floor(Number(el.getAttribute("y")) / 46);
  const bands = [...document.querySelectorAll(".gantt rect.held")];
  const axis = document.querySelector(".gantt").viewBox.baseVal.width;
  const runs = [...document.querySelectorAll(".gantt g.seg-run rect")];
  const long = runs.filter((bar) => Number(bar.getAttribute("width")) > axis / 4);
  return long.map((bar) => {
    const mid = Number(bar.getAttribute("x")) + Number(bar.getAttribute("width")) / 2;
    return bands.some((b) => lane(b) === lane(bar) && Number(b.getAttribute("x")) <= mid
      && mid <= Number(b.getAttribute("x")) + Number(b.getAttribute("width")));
  });
}"""


def test_hand_offs_written_together_are_read_in_the_order_they_happened(ui: UI) -> None:
    """A report's hand-back and the next step's hand-over share a time stamp and come with
    ids in either order: the timeline follows the object from owner to owner."""
    ui.open("")
    owners = ui.page.evaluate("""async () => {
      const { ownership } = await import("/assets/js/gantt.js");
      const at = (s) => `2026-01-01T00:00:0${s}.000Z`;
      const handoffs = [
        // Each hand-over got a lower id than the hand-back written with it.
        { id: 1, at: at(1), from_container: "scheduler-1", to_container: "worker-2" },
        { id: 2, at: at(1), from_container: "worker-1", to_container: "scheduler-1" },
        { id: 3, at: at(2), from_container: "scheduler-1", to_container: "worker-1" },
        { id: 4, at: at(2), from_container: "worker-2", to_container: "scheduler-1" },
      ];
      const runs = [{ worker_id: "worker-1", started_at: at(0), queued_at: at(0) }];
      return ownership(handoffs, Date.parse(at(3)), runs)
        .filter((b) => b.to > b.from).map((b) => b.owner);
    }""")
    assert owners == ["worker-1", "worker-2", "worker-1"]
    ui.assert_clean()


def _ms(stamp: str) -> datetime:
    """An API timestamp cut to whole milliseconds, as the page's ``Date.parse`` reads it."""
    moment = datetime.fromisoformat(stamp)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def test_detail_page_shows_the_timeline_and_every_handoff(
    ui: UI, harness: Harness, napping: str
) -> None:
    run_id = harness.start(napping, harness.upload("ui/detail.jpg", sample("green_field.jpg")))
    done = harness.wait(run_id)
    assert done["status"] == "COMPLETED", done["error"]
    page = ui.page
    ui.open(f"#/workflows/{run_id}")
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED")

    # The Gantt: a lane per container, one run bar per started attempt, an arrow per hand-off.
    started = [r for r in done["task_runs"] if r["started_at"]]
    expect(page.locator(".gantt .seg-run")).to_have_count(len(started))
    lanes = page.locator(".gantt .lane-label").all_text_contents()
    assert {r["worker_id"] for r in started} <= set(lanes), lanes
    assert lanes[0] == done["claimed_by"]
    # Queue wait drawn apart from the run, for every run that waited a millisecond or more
    # (the page works in Date.parse's whole milliseconds; a fast hand-off may wait less).
    waited = [r for r in started if _ms(r["started_at"]) > _ms(r["queued_at"])]
    expect(page.locator(".gantt .seg-queue")).to_have_count(len(waited))
    handoffs = done["handoffs"]
    assert handoffs, "a CDI run hands its object over"
    expect(page.locator(".gantt .handoff")).to_have_count(len(handoffs))
    # "Holds the data" sits on the lane of the worker running the nap, mid-run. (Only the long
    # run: a hand-off is stamped when the scheduler records it, after the instruction went out,
    # so a task of a few milliseconds may be over before its hand-over's stamp.)
    covered = page.evaluate(_RUNS_ON_HELD_LANES)
    assert covered == [True], covered

    # The hand-off table: every transfer, from → to, in order, with its size.
    table = page.locator("table.handoffs tbody tr")
    expect(table).to_have_count(len(handoffs))
    for row, handoff in zip(table.all(), handoffs, strict=True):
        text = row.inner_text()
        assert handoff["from_container"] in text and handoff["to_container"] in text, text
        assert text.index(handoff["from_container"]) < text.rindex(handoff["to_container"])
    expect(page.locator("#handoff-count")).to_have_text(str(len(handoffs)))

    # Both thumbnails are real pictures.
    for role in ("input", "result"):
        picture = page.locator(f"figure[data-image={role}][data-available=true] img")
        expect(picture).to_be_visible()
        loaded = "i => i.complete && i.naturalWidth > 0"
        wait_for(partial(picture.evaluate, loaded), f"the {role} thumbnail to load", timeout=10)
    expect(page.locator("table.runs tbody tr")).to_have_count(len(done["task_runs"]))
    # Each run's own CPU time is shown (the napping task sleeps: little, but some).
    headers = page.locator("table.runs thead th").all_text_contents()
    cpu = [row.locator("td").nth(headers.index("Task CPU")).inner_text()
           for row in page.locator("table.runs tbody tr").all()]  # fmt: skip
    assert all(text.endswith(("ms", " s")) for text in cpu), cpu
    ui.shot("workflow-detail")
    page.locator("#card-timeline").scroll_into_view_if_needed()
    ui.shot("workflow-timeline", full_page=False)
    ui.assert_clean()


def test_a_failed_run_shows_its_reason(ui: UI, harness: Harness) -> None:
    missing = f"s3://{harness.bucket}/ui/nowhere.jpg"
    run_id = harness.start("image_pipeline", missing)
    assert harness.wait(run_id)["status"] == "FAILED"
    page = ui.page
    ui.open(f"#/workflows/{run_id}")
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "FAILED")
    expect(page.locator("#wf-alert")).to_contain_text("does not exist")
    unavailable = page.locator("figure[data-image=input][data-available=false]")
    expect(unavailable).to_contain_text("does not exist")  # a reason, not a broken image
    expect(page.locator("#retry")).to_be_enabled()
    expect(page.locator("#cancel")).to_have_count(0)  # a finished run cannot be cancelled
    ui.assert_clean()


def test_cancel_and_retry_buttons_call_the_api(ui: UI, harness: Harness, napping: str) -> None:
    run_id = harness.start(napping, harness.upload("ui/cancel.jpg", sample("blue_sky.jpg")))
    page = ui.page
    ui.open(f"#/workflows/{run_id}")
    status = page.locator("#wf-status")
    expect(status).to_have_attribute("data-status", "RUNNING", timeout=30_000)
    nap = page.locator(".dag .node[data-ref=nap]")  # the worker holds it: running, live
    expect(nap).to_have_attribute("data-status", "RUNNING", timeout=30_000)
    expect(page.locator(".gantt .seg-run.st-running")).to_have_count(1)
    expect(page.locator("#retry")).to_have_count(0)  # a running run cannot be retried
    page.get_by_role("button", name="Cancel run").click()
    expect(status).to_have_attribute("data-status", "CANCELLED", timeout=30_000)
    assert harness.wait(run_id)["status"] == "CANCELLED"
    expect(page.locator("#cancel")).to_have_count(0)

    page.get_by_role("button", name="Retry").click()
    expect(page).not_to_have_url(re.compile(run_id))
    retried = page.url.rsplit("/", 1)[1]
    assert harness.get(retried)["retry_of"] == run_id
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED", timeout=90_000)
    expect(page.locator("#wf-meta")).to_contain_text(run_id[:8])  # "Retry of" links back
    # Completed: neither action applies, so neither button shows.
    expect(page.locator(".page-head .actions button")).to_have_count(0)
    ui.assert_clean()


def test_filters_and_search_narrow_the_list(ui: UI, harness: Harness) -> None:
    image = harness.upload("ui/filters.jpg", sample("night.jpg"))
    # More than a page of 25 of its own, so it passes alone as well as after the others.
    noop = [harness.start("noop_pipeline", image, "affinity") for _ in range(25)]
    auto = harness.start("image_pipeline", image, "auto")
    failing = harness.start("image_pipeline", f"s3://{harness.bucket}/ui/missing.jpg")
    for run_id in [*noop, auto, failing]:
        harness.wait(run_id)

    def api_ids(**params: str) -> list[str]:
        reply = harness.api.get("/api/workflows", params={"limit": 200, **params})
        return [w["id"] for w in reply.raise_for_status().json()["items"]]

    page = ui.page
    ui.open("#/workflows")
    everything = api_ids()
    assert len(everything) > 25
    expect(page.locator("#count")).to_have_text(f"{len(everything)} in total")
    expect(page.locator("#range-text")).to_have_text(f"1–25 of {len(everything)}")

    # Pagination.
    page.get_by_role("button", name="Next →").click()
    expect(page.locator("#range-text")).to_have_text(
        f"26–{min(50, len(everything))} of {len(everything)}"
    )
    assert rows(page, "table.workflows tbody tr") == everything[25:50]
    page.get_by_role("button", name="← Previous").click()
    expect(page.locator("#range-text")).to_have_text(f"1–25 of {len(everything)}")

    def check(selector: str, value: str, **params: str) -> list[str]:
        page.select_option(selector, value)
        expected = api_ids(**params)
        expect(page.locator("#count")).to_have_text(f"{len(expected)} matching")
        assert rows(page, "table.workflows tbody tr") == expected[:25]
        return expected

    failed = check("select[data-filter=status]", "FAILED", status="FAILED")
    assert failing in failed and all(
        s == "FAILED"
        for s in page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.status)")
    )
    page.select_option("select[data-filter=status]", "")
    assert set(check("select[data-filter=workflow]", "noop_pipeline", workflow="noop_pipeline"))
    assert set(noop) <= set(api_ids(workflow="noop_pipeline"))
    page.select_option("select[data-filter=workflow]", "")
    assert auto in check("select[data-filter=policy]", "auto", policy="auto")
    page.select_option("select[data-filter=policy]", "")
    assert len(check("select[data-filter=range]", "15m")) == len(everything)

    # Search by the leading characters of an id; the URL keeps the filters.
    page.keyboard.press("/")
    search = page.locator("input[data-search]")
    expect(search).to_be_focused()
    search.fill(noop[3][:8])
    expect(page.locator("#count")).to_have_text("1 matching")
    assert rows(page, "table.workflows tbody tr") == [noop[3]]
    assert f"q={noop[3][:8]}" in page.url
    ui.shot("workflows-search", full_page=False)

    # Not an id: said so on the spot, and no request the API would refuse.
    search.fill("not-hex!")
    expect(page.locator("#search-hint")).to_contain_text("0-9, a-f")
    expect(search).to_have_attribute("aria-invalid", "true")

    # A range that holds nothing shows the empty state; "Clear filters" brings everything back.
    search.fill("")
    page.select_option("select[data-filter=range]", "custom")
    page.fill("input[data-filter=after]", "2001-01-01T00:00")
    page.fill("input[data-filter=before]", "2001-01-02T00:00")
    page.locator("input[data-filter=before]").dispatch_event("change")
    expect(page.get_by_text("No workflows match these filters")).to_be_visible()
    page.get_by_role("button", name="Clear filters").first.click()
    expect(page.locator("#count")).to_have_text(f"{len(api_ids())} in total")
    ui.open("#/workflows?status=COMPLETED&policy=affinity")  # a shared link restores filters
    expect(page.locator("select[data-filter=status]")).to_have_value("COMPLETED")
    expected = api_ids(status="COMPLETED", policy="affinity")
    expect(page.locator("#count")).to_have_text(f"{len(expected)} matching")
    ui.shot("workflows")
    ui.assert_clean()


def test_keyboard_reaches_every_page(ui: UI, harness: Harness) -> None:
    page = ui.page
    ui.open("")
    expect(page.locator("h1")).to_have_text("Overview")
    # Tab order: the skip link first, then the navigation.
    page.keyboard.press("Tab")
    expect(page.locator("#skip")).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.locator("[data-nav=overview]")).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Workflows")
    expect(page.locator("h1")).to_be_focused()  # a new page announces itself
    for keys, heading in (("gk", "Workers"), ("gd", "Definitions"), ("gc", "Data"),
                          ("go", "Overview"), ("gw", "Workflows")):  # fmt: skip
        page.keyboard.press(keys[0])
        page.keyboard.press(keys[1])
        expect(page.locator("h1")).to_have_text(heading)
        expect(page.locator("h1")).to_be_focused()
    first = page.locator("table.workflows tbody tr a").first
    first.focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"#/workflows/{UUID}$"))
    page.keyboard.press("?")
    expect(page.locator("#help")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#help")).to_be_hidden()
    ui.assert_clean()


def test_data_page_shows_ownership_move(ui: UI, harness: Harness, napping: str) -> None:
    page = ui.page
    ui.open("#/data")
    expect(page.locator("h1")).to_have_text("Data")
    image = harness.upload("ui/data.jpg", sample("sunset.jpg"))
    run_id = harness.start("double_nap", image)
    others = [harness.start("double_nap", image) for _ in range(2)]  # company for the picture
    held = page.locator(f"tr[data-object^='wf-{run_id}']")
    expect(held).to_have_count(1, timeout=30_000)
    expect(held).to_have_attribute("data-owner", re.compile(r"^worker-\d+$"))
    expect(held).to_contain_text(run_id[:8])
    moved = page.locator(f"#moves-list li[data-move=moved][data-workflow='{run_id}']")
    expect(moved.first).to_be_visible(timeout=30_000)
    wait_for(lambda: page.locator("tr[data-object]").count() >= 2, "two objects", timeout=10)
    ui.shot("data", full_page=False)
    assert harness.wait(run_id)["status"] == "COMPLETED"
    assert all(harness.wait(other)["status"] == "COMPLETED" for other in others)
    expect(held).to_have_count(0, timeout=30_000)  # released when the run ends
    released = page.locator(f"#moves-list li[data-move=released][data-workflow='{run_id}']")
    expect(released.first).to_be_visible()
    ui.assert_clean()


def test_a_bad_definition_shows_the_apis_errors(ui: UI, harness: Harness) -> None:
    page = ui.page
    ui.allow(r"status of 422")  # Chromium logs every 4xx; these are the ones we provoke
    ui.open("#/definitions")
    editor = page.locator("#def-json")
    errors = page.locator("#def-errors")

    # Not JSON: caught in the page, with where.
    editor.fill('{"name": "broken",\n  "tasks": [}')
    page.get_by_role("button", name="Save", exact=True).click()
    expect(errors).to_contain_text("Not valid JSON at line 2")

    # Valid JSON, bad definition: the API's own problems, each listed.
    bad = {
        "name": "broken_pipeline",
        "tasks": [
            {"ref": "a", "task": "no_such_task"},
            {"ref": "b", "task": "deblur", "depends_on": ["a", "c"]},
        ],
    }
    reply = harness.api.post("/api/workflow-definitions", json=bad)
    assert reply.status_code == 422
    problems = reply.json()["problems"]
    assert len(problems) >= 2
    editor.fill(json.dumps(bad, indent=2))
    page.get_by_role("button", name="Save", exact=True).click()
    expect(errors.locator("li")).to_have_count(len(problems))
    for problem in problems:
        expect(errors).to_contain_text(problem)
    expect(editor).to_have_attribute("aria-invalid", "true")
    ui.shot("definition-error")

    # A body the schema refuses (FastAPI's own 422 shape) reads the same way.
    editor.fill('{"name": "no_ref", "tasks": [{"task": "deblur"}]}')
    page.get_by_role("button", name="Save", exact=True).click()
    expect(errors).to_contain_text("tasks.0.ref: Field required")

    # A good one registers and appears in the list, selected.
    page.get_by_role("button", name="Task", exact=True).click()
    page.get_by_role("button", name="Workflow", exact=True).click()
    expect(page.locator("#def-preview svg")).to_be_visible()
    good = '{"name": "ui_pipeline", "tasks": [{"ref": "d", "task": "deblur"}]}'
    editor.fill(good)
    page.get_by_role("button", name="Save", exact=True).click()
    expect(errors).to_contain_text("Saved workflow ui_pipeline, version 1")
    expect(page.locator("[data-def=ui_pipeline]")).to_have_attribute("aria-current", "true")
    assert harness.api.get("/api/workflow-definitions/ui_pipeline").status_code == 200

    # Saved again, changed: a new version, listed beside the first; saved unchanged: none.
    page.locator("#def-edit").click()
    expect(editor).to_have_value(re.compile(r'"ref": "d"'))
    editor.fill(
        '{"name": "ui_pipeline", "tasks": [{"ref": "d", "task": "deblur"},'
        ' {"ref": "c", "task": "classify", "depends_on": ["d"]}]}'
    )
    page.get_by_role("button", name="Save", exact=True).click()
    expect(errors).to_contain_text("Saved workflow ui_pipeline, version 2")
    page.locator("#def-versions-box summary").click()
    expect(page.locator("#def-versions tr[data-version]")).to_have_count(2)
    page.get_by_role("button", name="Save", exact=True).click()
    expect(errors).to_contain_text("Unchanged: workflow ui_pipeline, version 2")
    versions = harness.api.get("/api/workflow-definitions/ui_pipeline/versions").json()
    assert [v["version"] for v in versions] == [2, 1]
    unexpected_422 = [e for e in ui.errors if "422" in e]
    assert len(unexpected_422) == 2, ui.errors  # exactly the two refused registrations
    ui.assert_clean()


def test_overview_counts_throughput_and_latency(ui: UI, harness: Harness) -> None:
    page = ui.page
    ui.open("")
    stats = harness.api.get("/api/stats").raise_for_status().json()
    for status, count in stats["counts"].items():
        expect(page.locator(f"[data-tile={status}]")).to_have_text(f"{count:,}")
    assert stats["counts"]["COMPLETED"] > 0
    expect(page.locator("[data-tile=workers]")).to_have_text("2 / 2")
    expect(page.locator("#throughput .bar.s-completed").first).to_be_visible()
    expect(page.locator("#latency .line.s-p50")).to_have_count(1)
    page.get_by_role("button", name="1 hour").click()
    expect(page.locator("[data-key=tile-COMPLETED] .tile-note")).to_contain_text("in 1 h")
    expect(page.locator("#throughput .chart")).to_be_visible()
    assert "window=60" in page.url
    ui.shot("overview", full_page=False)
    ui.assert_clean()


def test_workers_page_shows_live_metrics(ui: UI, harness: Harness, napping: str) -> None:
    page = ui.page
    ui.open("#/workers")
    run_id = harness.start(napping, harness.upload("ui/workers.jpg", sample("sunset.jpg")))
    busy = page.locator("article.worker [data-running=nap]")
    expect(busy).to_contain_text(f"Running nap of {run_id[:8]}", timeout=30_000)
    cards = page.locator("article.worker")
    expect(cards).to_have_count(2)
    for worker_id in harness.stack.worker_ids:
        card = page.locator(f"article[data-worker={worker_id}]")
        expect(card).to_have_attribute("data-alive", "true")
        expect(card.locator("[role=meter]")).to_have_count(2)
        expect(card).to_contain_text("Last heartbeat at")
        held = re.compile(r"^(none|\d+ · [\d.]+ [KMG]?B)$")  # a count, or none
        expect(card.locator("[data-stat=held]")).to_have_text(held)
        # The worker process's own CPU and memory; the host's on a line of its own.
        expect(card.locator("[data-metric=cpu]")).to_have_text(re.compile(r"^\d+%$"))
        expect(card.locator("[data-metric=memory]")).to_have_text(re.compile(r"^[\d.]+ [KMG]?B$"))
        expect(card.locator("[data-host-load]")).to_contain_text("Host: ")
    beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
    for worker_id in harness.stack.worker_ids:
        beat = beats[worker_id]
        assert beat["rss_bytes"] > 10 * 2**20 and beat["cpu"] is not None  # a Python process
        assert beat["mem"] < beat["host_mem"]  # its own share, not the host's
    ui.shot("workers", full_page=False)
    assert harness.wait(run_id)["status"] == "COMPLETED"
    expect(busy).to_have_count(0)
    ui.assert_clean()


def test_a_killed_worker_is_shown_as_gone_then_back(ui: UI, harness: Harness) -> None:
    """The stack restarts a killed worker only after 30 s, so it is seen gone, then back."""
    page = ui.page
    ui.open("#/workers")
    victim = page.locator("article[data-worker=worker-2]")
    expect(victim).to_have_attribute("data-alive", "true")
    harness.stack.kill_worker("worker-2")
    expect(victim).to_have_attribute("data-alive", "false", timeout=20_000)
    expect(victim.locator("[data-worker-state]")).to_have_text("Gone")
    expect(victim).to_contain_text("presumed dead")
    expect(page.locator("article[data-worker=worker-1]")).to_have_attribute("data-alive", "true")
    ui.shot("worker-gone", full_page=False)
    page.keyboard.press("g")
    page.keyboard.press("o")
    expect(page.locator("[data-tile=workers]")).to_have_text("1 / 2")
    # The supervisor restarts it under the same id; the dashboard notices without a reload.
    expect(page.locator("[data-tile=workers]")).to_have_text("2 / 2", timeout=90_000)
    ui.assert_clean()


def test_readiness_names_a_stalled_scheduler_then_recovers(ui: UI, harness: Harness) -> None:
    """The panel under the live indicator shows /api/readyz: every part ready; a scheduler
    whose loop stops turning (SIGSTOP: alive to the supervisor, silent to everyone else) is
    named, and the panel is ready again once it goes on."""
    ui.allow("503")  # the browser logs the API's 503 while the scheduler is stalled
    page = ui.page
    ui.open("#/")
    ready = page.locator("#ready")
    expect(ready).to_have_attribute("data-state", "ready", timeout=20_000)
    expect(page.locator("#ready-text")).to_have_text("All parts ready")
    scheduler = harness.stack.pid_of(harness.stack.scheduler_id)
    assert scheduler is not None
    os.kill(scheduler, signal.SIGSTOP)
    try:
        expect(ready).to_have_attribute("data-state", "degraded", timeout=30_000)
        expect(page.locator("#ready-text")).to_have_text("Not ready: Scheduler")
        page.locator("#ready summary").click()
        expect(page.locator("#ready-checks [data-check=scheduler]")).to_have_attribute(
            "data-ok", "false"
        )
        expect(page.locator("#ready-checks [data-check=postgres]")).to_have_attribute(
            "data-ok", "true"
        )
        ui.shot("readiness-degraded", full_page=False)
    finally:
        os.kill(scheduler, signal.SIGCONT)
    expect(ready).to_have_attribute("data-state", "ready", timeout=30_000)


def _column(page: Page, ref: str) -> float:
    """The x of a task graph node (its column)."""
    transform = page.locator(f".dag .node[data-ref='{ref}']").get_attribute("transform") or ""
    return float(transform.removeprefix("translate(").split(",")[0])


def test_a_graph_run_draws_its_branches_side_by_side_and_a_skipped_step_greyed(
    ui: UI, harness: Harness
) -> None:
    run_id = harness.start("fork_join_pipeline", harness.upload("ui/fork.jpg", sample("night.jpg")))
    done = harness.wait(run_id)
    assert done["status"] == "COMPLETED", done["error"]
    page = ui.page
    ui.open(f"#/workflows/{run_id}")
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED")
    # The graph: both branches in one column, the join after them, every edge an input draws.
    for ref in ("sharpen", "smooth", "blend", "classify"):
        node = page.locator(f".dag .node[data-ref='{ref}']")
        expect(node).to_have_attribute("data-status", "COMPLETED")
    assert _column(page, "sharpen") == _column(page, "smooth") < _column(page, "blend")
    expect(page.locator(".dag .edge")).to_have_count(3)
    # The timeline: the branches on the lanes of the workers that ran them.
    runs = {r["ref"]: r for r in done["task_runs"]}
    lanes = page.locator(".gantt .lane-label").all_text_contents()
    assert {runs["sharpen"]["worker_id"], runs["smooth"]["worker_id"]} <= set(lanes), lanes
    # The input image, read by both branches at once, was shared with each: two shares.
    shares = [x for x in done["handoffs"] if x["mode"] == "share"]
    assert [x["datum"] for x in shares] == ["input.image", "input.image"], done["handoffs"]
    expect(page.locator("table.handoffs tbody tr[data-mode=share]")).to_have_count(2)
    expect(page.locator(".gantt .handoff-share")).to_have_count(2)
    ui.shot("workflow-fork-join")

    switch = {
        "name": "dark_or_not",
        "tasks": [
            {"ref": "label", "task": "classify"},
            {"ref": "route", "switch": "label.label", "cases": {"dark": ["sharpen"]},
             "default": ["smooth"]},
            {"ref": "sharpen", "task": "deblur", "inputs": {"image": "label.image"}},
            {"ref": "smooth", "task": "denoise", "inputs": {"image": "label.image"}},
        ],
    }  # fmt: skip
    harness.register("/api/workflow-definitions", switch)
    run_id = harness.start("dark_or_not", harness.upload("ui/dark.jpg", sample("night.jpg")))
    done = harness.wait(run_id)
    assert done["status"] == "COMPLETED", done["error"]
    ui.open(f"#/workflows/{run_id}")
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED")
    expect(page.locator(".dag .node[data-ref='sharpen']")).to_have_attribute(
        "data-status", "COMPLETED"
    )
    expect(page.locator(".dag .node[data-ref='smooth']")).to_have_attribute(
        "data-status", "SKIPPED"
    )
    skipped = page.locator(".dag .node[data-ref='smooth']")
    assert float(skipped.evaluate("n => getComputedStyle(n).opacity")) < 1  # greyed
    ran = [r for r in done["task_runs"] if r["worker_id"]]  # not the switch nor the skipped
    expect(page.locator(".gantt .seg-run")).to_have_count(len(ran))
    ui.shot("workflow-switch")
