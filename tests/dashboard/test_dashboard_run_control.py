"""The dashboard on runs that did not go well, in a real headless Chromium against a real
stack: a failed task's traceback under its error, a run that passed its time limit, and a run
that waits for a worker (with the readiness panel saying none is alive)."""

from __future__ import annotations

from typing import Any

from tests.dashboard.browser import UI, browser, ui
from tests.dashboard.support import Harness, sample, wait_for

from playwright.sync_api import Page, expect  # isort: skip

__all__ = ["browser", "ui"]  # the fixtures of tests.dashboard.browser


def _start_dataless(harness: Harness, workflow: str) -> str:
    reply = harness.api.post("/api/workflows", json={"workflow": workflow, "input": {}})
    assert reply.status_code == 201, reply.text
    run_id: str = reply.json()["id"]
    return run_id


def _define(harness: Harness, name: str, steps: list[dict[str, Any]], **settings: Any) -> str:
    harness.register("/api/workflow-definitions", {"name": name, "tasks": steps, **settings})
    return name


def _nap_ended(ui: UI, harness: Harness, name: str, ms: int, status: str, **limits: Any) -> Page:
    """A run of one nap step of ``ms`` ms, ended ``status``, open in the browser."""
    nap = {"ref": "nap", "task": "sleep", "params": {"ms": ms}}
    run_id = _start_dataless(harness, _define(harness, name, [nap], **limits))
    done = harness.wait(run_id)
    assert done["status"] == status, done
    ui.open(f"#/workflows/{run_id}")
    expect(ui.page.locator("#wf-status")).to_have_attribute("data-status", status)
    return ui.page


def test_a_failed_tasks_traceback_unfolds_under_its_error(ui: UI, harness: Harness) -> None:
    page = _nap_ended(ui, harness, "ui_bad_nap", -1, "FAILED")  # sleep refuses -1: it raises
    row = page.locator("table.runs tbody tr[data-ref=nap]")
    expect(row).to_contain_text("param 'ms' must be a finite number")
    text = row.locator("details.traceback pre")
    expect(text).to_be_hidden()  # folded until asked for
    row.locator("details.traceback summary").click()
    expect(text).to_be_visible()
    expect(text).to_contain_text("Traceback (most recent call last):")
    expect(text).to_contain_text("in sleep")
    expect(text).to_contain_text("ValueError: param 'ms' must be a finite number >= 0")
    # The step that ended the run has it under the run's error too, at the top.
    top = page.locator("#wf-traceback")
    expect(top.locator("summary")).to_contain_text("Traceback of step nap (attempt 1, on worker-")
    top.locator("summary").click()
    expect(top.locator("pre")).to_contain_text("in sleep")
    ui.shot("workflow-traceback")
    ui.assert_clean()


def test_a_run_past_its_time_limit_shows_timed_out_with_its_step(ui: UI, harness: Harness) -> None:
    page = _nap_ended(ui, harness, "ui_limited_nap", 20_000, "TIMED_OUT", timeout_s=1)
    expect(page.locator("#wf-alert")).to_contain_text(
        "This run timed out: the run passed its time limit of 1 s in step 'nap'"
    )
    expect(page.locator("#wf-timeout")).to_have_text("1.00 s")
    row = page.locator("table.runs tbody tr[data-ref=nap]")
    expect(row).to_have_attribute("data-status", "TIMED_OUT")
    expect(page.locator("#retry")).to_be_visible()
    ui.shot("workflow-timed-out")
    ui.assert_clean()


def test_a_run_no_worker_can_take_says_what_it_waits_for(ui: UI, harness: Harness) -> None:
    """Both workers killed (the stack restarts them after 30 s): the run shows what it waits
    for and the readiness panel names the workers; once they are back it goes on."""
    ui.allow("503")  # the browser logs the API's 503 while no worker lives
    page = ui.page
    image = harness.upload("ui/waiting.jpg", sample("night.jpg"))
    for worker in harness.stack.worker_ids:
        harness.stack.kill_worker(worker)
    wait_for(lambda: harness.api.get("/api/readyz").status_code == 503, "no live worker", 20)
    run_id = harness.start("image_pipeline", image)
    ui.open(f"#/workflows/{run_id}")
    waiting = page.locator("#wf-waiting")
    expect(waiting).to_contain_text(
        "waiting for a worker that loads 'workflows.image_tasks' to run step 'deblur': no "
        "worker is alive",
        timeout=20_000,
    )
    expect(page.locator("#ready-text")).to_contain_text("Workers", timeout=20_000)
    ui.shot("workflow-waiting")
    done = harness.wait(run_id, timeout=120)  # the workers come back
    assert done["status"] == "COMPLETED", done["error"]
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED")
    expect(waiting).to_have_count(0)
    expect(page.locator("#ready")).to_have_attribute("data-state", "ready", timeout=30_000)
    ui.assert_clean()
