"""Schedules, webhooks and pausing in the dashboard, in a real headless Chromium against a real
stack: a schedule made from the page shows its next fire times and pauses; a webhook registered
from the page shows its secret once and its delivery log; a run paused and resumed from its
page; a definition's queue paused from the definitions page."""

from __future__ import annotations

import re
import uuid

from tests.dashboard.browser import UI, browser, ui
from tests.dashboard.support import Harness, sample, wait_for

from playwright.sync_api import expect  # isort: skip

__all__ = ["browser", "ui"]  # the fixtures of tests.dashboard.browser


def test_a_schedule_is_made_shown_paused_and_deleted_from_the_page(
    ui: UI, harness: Harness
) -> None:
    page = ui.page
    name = f"hourly-{uuid.uuid4().hex[:6]}"
    ui.open("#/schedules")
    page.locator("#schedule-name").fill(name)
    page.locator("#schedule-workflow").select_option("image_pipeline")
    page.locator("#schedule-cron").fill("0 * * * *")
    page.locator("#schedule-timezone").fill("Europe/Paris")
    page.locator("#schedule-submit").click()
    row = page.locator(f"tr[data-name={name}]")
    expect(row).to_be_visible()
    expect(row.locator("[data-next] li")).to_have_count(3)
    expect(row.locator("[data-next] li").first).to_have_text(re.compile(r":00:00"))
    expect(row.locator("[data-state]")).to_have_attribute("data-state", "active")
    shown = harness.api.get(f"/api/schedules/{name}").json()
    assert shown["timezone"] == "Europe/Paris" and len(shown["next_fire_times"]) == 5
    row.locator("[data-action=pause]").click()
    expect(row.locator("[data-state]")).to_have_attribute("data-state", "paused")
    assert harness.api.get(f"/api/schedules/{name}").json()["paused_at"]
    ui.shot("schedules")
    # A bad expression is refused with the API's reason beside the form.
    page.locator("#schedule-name").fill(f"bad-{uuid.uuid4().hex[:6]}")
    page.locator("#schedule-cron").fill("61 * * * *")
    page.locator("#schedule-submit").click()
    expect(page.locator("#schedule-errors")).to_contain_text("not a cron expression")
    row.locator("[data-action=delete]").click()
    expect(row).to_have_count(0)
    assert harness.api.get(f"/api/schedules/{name}").status_code == 404
    ui.allow(r"status of 422")  # Chromium logs the refused POST
    ui.assert_clean()


def test_a_webhook_shows_its_secret_once_and_its_deliveries(ui: UI, harness: Harness) -> None:
    page = ui.page
    name = f"hook-{uuid.uuid4().hex[:6]}"
    ui.open("#/webhooks")
    page.locator("#webhook-name").fill(name)
    page.locator("#webhook-url").fill("http://127.0.0.1:9/nobody-listens")
    page.locator("#webhook-workflow").fill("image_pipeline")
    page.locator("#webhook-submit").click()
    secret = page.locator("#webhook-secret-value")
    expect(secret).to_have_text(re.compile(r"^whsec_"))
    expect(page.locator(f"tr[data-name={name}]")).to_be_visible()
    assert "whsec_" not in str(harness.api.get("/api/webhooks").json())
    run = harness.start("image_pipeline", harness.upload("ui/hook.jpg", sample("sunset.jpg")))
    harness.wait(run)
    page.locator(f"tr[data-name={name}] button.linkish").click()
    delivery = page.locator("#delivery-log tr[data-delivery]")
    expect(delivery).to_have_count(1, timeout=15_000)
    expect(delivery).to_contain_text("workflow.completed")
    expect(delivery).to_contain_text(run[:8])
    # Nobody listens there: the attempt failed, the page says why, and another is due.
    expect(delivery).to_contain_text("ConnectError", timeout=15_000)
    expect(delivery.locator("[data-status]")).to_have_text("PENDING")
    expect(delivery).to_contain_text("next try")
    ui.shot("webhooks")
    page.locator(f"tr[data-name={name}] [data-action=delete]").click()
    expect(page.locator(f"tr[data-name={name}]")).to_have_count(0)
    ui.assert_clean()


def test_a_run_is_paused_and_resumed_from_its_page(ui: UI, harness: Harness, napping: str) -> None:
    page = ui.page
    # A first nap long enough that the page is open and the run paused while it runs, however
    # busy the machine (checked below): the second must wait for the resume.
    name = f"pause_{uuid.uuid4().hex[:8]}"
    harness.register(
        "/api/workflow-definitions",
        {"name": name, "tasks": [
            {"ref": "nap1", "task": "nap", "params": {"ms": 8000}},
            {"ref": "nap2", "task": "nap", "depends_on": ["nap1"], "params": {"ms": 500}},
        ]},
    )  # fmt: skip
    run = harness.start(name, harness.upload("ui/pause.jpg", sample("sunset.jpg")))
    ui.open(f"#/workflows/{run}")
    page.locator("#pause").click()
    expect(page.locator("#wf-paused")).to_be_visible()
    first = harness.get(run)["task_runs"]
    assert not first or first[0]["status"] in ("QUEUED", "RUNNING"), "nap1 ended before the pause"
    wait_for(lambda: harness.get(run)["task_runs"][:1] and
             harness.get(run)["task_runs"][0]["status"] == "COMPLETED", "nap1 to end")  # fmt: skip
    assert [t["ref"] for t in harness.get(run)["task_runs"]] == ["nap1"]  # nap2 waits
    page.locator("#resume").click()
    expect(page.locator("#wf-paused")).to_have_count(0)
    assert harness.wait(run)["status"] == "COMPLETED"
    ui.assert_clean()


def test_a_definitions_queue_is_paused_and_resumed_from_the_page(ui: UI, harness: Harness) -> None:
    page = ui.page
    ui.open("#/definitions?name=fork_join_pipeline")
    toggle = page.locator("#def-queue-toggle")
    expect(toggle).to_have_text("Pause queue")
    toggle.click()
    expect(page.locator("#def-queue [data-queue=paused]")).to_be_visible()
    assert harness.api.get("/api/workflow-definitions/fork_join_pipeline").json()["paused_at"]
    toggle = page.locator("#def-queue-toggle")
    expect(toggle).to_have_text("Resume queue")
    toggle.click()
    expect(page.locator("#def-queue [data-queue=open]")).to_be_visible()
    assert (
        harness.api.get("/api/workflow-definitions/fork_join_pipeline").json()["paused_at"] is None
    )
    ui.assert_clean()
