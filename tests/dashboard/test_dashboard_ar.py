"""The dashboard on the AR video workflow: its per-frame fan-out is one node with the count
of its runs, which lists every frame's run, and every run is on the timeline."""

from __future__ import annotations

from dataclasses import replace

from cdiflow.demo_ar import demo_sample, start_ar_video
from tests.dashboard.browser import UI, browser, ui  # skips without Playwright
from tests.dashboard.support import Harness

from playwright.sync_api import expect  # isort: skip

__all__ = ["browser", "ui"]  # the fixtures this module shares with the other dashboard tests

FRAMES = 6


def test_the_ar_video_fan_out_shows_one_node_with_every_frames_run(
    ui: UI, harness: Harness
) -> None:
    sample = replace(demo_sample(), frames=FRAMES)
    run_id, _ = start_ar_video(harness.api, harness.s3, harness.bucket, sample, "ui/ar.mp4")
    done = harness.wait(run_id)
    assert done["status"] == "COMPLETED", done["error"]
    page = ui.page
    ui.open(f"#/workflows/{run_id}")
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED")
    detect = page.locator(".dag .node[data-ref='detect']")
    expect(detect).to_have_attribute("data-runs", str(FRAMES))
    expect(detect).to_have_attribute("data-status", "COMPLETED")
    expect(detect).to_contain_text(f"×{FRAMES}")
    tip = detect.locator("title").text_content() or ""
    assert all(f"detect[{i}]: " in tip for i in range(FRAMES)), tip
    # decode to detect, detect to combine, decode (its fps) to combine
    expect(page.locator(".dag .edge")).to_have_count(3)
    expect(page.locator(".gantt .seg-run")).to_have_count(FRAMES + 2)
    expect(page.locator("#wf-images .images")).to_be_visible()  # no image either side
    ui.shot("workflow-ar-video")
