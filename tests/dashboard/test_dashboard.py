"""The web dashboard in a real headless Chromium (``browser``), against a real stack (Postgres,
Redis, S3, CDI controller and minion, API, scheduler, two workers as processes): starting runs
and watching them, signing in, what a viewer may do, failures, cancel and retry, filters, the
keyboard, a refused definition. A run's detail and the data page are in
``test_dashboard_detail``, the overview, workers and readiness in ``test_dashboard_system``.
"""

from __future__ import annotations

import json
import re

from tests.dashboard.browser import KEY_ITEM, UI, anonymous_ui, browser, rows, ui, ui_with_key
from tests.dashboard.support import UUID, Harness, sample

from playwright.sync_api import Browser, expect  # isort: skip

__all__ = ["anonymous_ui", "browser", "ui"]  # the fixtures of tests.dashboard.browser


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
    for view in ui_with_key(browser, harness, reply.json()["key"]):
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
    page.get_by_role("button", name="Older →").click()
    expect(page.locator("#range-text")).to_have_text(
        f"26–{min(50, len(everything))} of {len(everything)}"
    )
    assert "cursor=" in page.url  # the page is found again by where it starts
    assert rows(page, "table.workflows tbody tr") == everything[25:50]
    page.get_by_role("button", name="← Newer").click()
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
