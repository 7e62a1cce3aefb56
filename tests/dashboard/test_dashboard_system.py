"""The dashboard's view of the system, in a real headless Chromium against a real stack: the
overview's counts and charts, live worker metrics, a killed worker gone then back, readiness
with a stalled scheduler."""

from __future__ import annotations

import os
import re
import signal

from tests.dashboard.browser import UI, browser, ui
from tests.dashboard.support import Harness, sample

from playwright.sync_api import expect  # isort: skip

__all__ = ["browser", "ui"]  # the fixtures of tests.dashboard.browser


def test_overview_counts_throughput_and_latency(ui: UI, harness: Harness) -> None:
    # A run of its own: the tests before it in this process (if any) need not have run one.
    image = harness.upload("ui/overview.jpg", sample("sunset.jpg"))
    assert harness.wait(harness.start("image_pipeline", image))["status"] == "COMPLETED"
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
    # A nap of several of the page's polls (2 s), so a busy machine's slow poll still sees it.
    harness.register(
        "/api/workflow-definitions",
        {"name": "long_nap", "tasks": [{"ref": "nap", "task": "nap", "params": {"ms": 8000}}]},
    )
    run_id = harness.start("long_nap", harness.upload("ui/workers.jpg", sample("sunset.jpg")))
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
        # This stack runs without the input cache (test_dashboard_host_data: with it).
        expect(card.locator("[data-input-cache]")).to_have_text("Input cache off")
    beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
    for worker_id in harness.stack.worker_ids:
        beat = beats[worker_id]
        assert beat["rss_bytes"] > 10 * 2**20 and beat["cpu"] is not None  # a Python process
        assert beat["mem"] < beat["host_mem"]  # its own share, not the host's
        assert beat["input_cache"] is None
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
