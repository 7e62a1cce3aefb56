"""Files in and out through the dashboard, in a real headless Chromium against the real stack:
the Start dialog uploads any file (an MP4 passed as ``ar_video``'s ``video``) with JSON data
and a version, refuses what it cannot send with the reason, and a run's page links each stored
result, which downloads with its content."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from tests.dashboard.browser import UI, browser, ui  # skips without Playwright
from tests.dashboard.support import UUID, Harness
from workflows.ar.sample import SampleVideo, make_sample_video
from workflows.ar.video import read_frames
from workflows.filetypes import detect

from playwright.sync_api import expect  # isort: skip

__all__ = ["browser", "ui"]  # the fixtures this module shares with the other dashboard tests

FRAMES = 4


def _open_start_dialog(ui: UI) -> None:
    ui.open("#/workflows")
    ui.page.get_by_role("button", name="Start workflow").first.click()
    expect(ui.page.locator("#start-dialog")).to_be_visible()


def test_an_uploaded_video_runs_and_its_result_downloads_from_the_run_page(
    ui: UI, harness: Harness, tmp_path: Path
) -> None:
    video = make_sample_video(tmp_path / "walk.mp4", SampleVideo(width=320, height=180, frames=8))
    page = ui.page
    dialog = page.locator("#start-dialog")
    _open_start_dialog(ui)
    dialog.get_by_label("Workflow", exact=True).select_option("ar_video")
    expect(dialog.get_by_label("Version", exact=True).locator("option")).to_contain_text(
        ["current (v1)", "v1"]
    )
    dialog.get_by_label("Version", exact=True).select_option("1")
    dialog.get_by_label("Input image (S3 URI)", exact=True).fill("")
    dialog.get_by_label("Upload a file", exact=True).set_input_files(video)
    dialog.get_by_label("Data (JSON object)", exact=True).fill(json.dumps({"frames": FRAMES}))
    # Passed as the image, a video is refused with what to do instead.
    dialog.get_by_role("button", name="Start", exact=True).click()
    expect(dialog.locator(".alert-error")).to_contain_text("walk.mp4 is video/mp4, not an image")
    dialog.get_by_label("Pass the file as", exact=True).fill("video")
    dialog.get_by_role("button", name="Start", exact=True).click()

    expect(page).to_have_url(re.compile(rf"#/workflows/{UUID}$"))
    run_id = page.url.rsplit("/", 1)[1]
    done = harness.wait(run_id)
    assert done["status"] == "COMPLETED", done["error"]
    assert done["workflow_version"] == 1 and done["input"]["data"]["frames"] == FRAMES
    assert done["input"]["data"]["video"].endswith("/walk.mp4")
    expect(page.locator("#wf-status")).to_have_attribute("data-status", "COMPLETED")
    link = page.locator("#card-results a[data-result='combine.video']")
    expect(link).to_be_visible()
    with page.expect_download() as download:
        link.click()
    saved = tmp_path / "saved.mp4"
    download.value.save_as(saved)
    assert download.value.suggested_filename == "combine.video.mp4"
    assert detect(saved.read_bytes()).content_type == "video/mp4"
    assert len(list(read_frames(saved))) == FRAMES
    via_api = harness.api.get(f"/api/workflows/{run_id}/results/combine.video")
    assert saved.read_bytes() == via_api.content
    ui.shot("workflow-results")
    ui.assert_clean()


def test_the_start_dialog_takes_json_data_and_an_older_version(ui: UI, harness: Harness) -> None:
    name = f"versions_{uuid.uuid4().hex[:8]}"
    for tasks in ([{"ref": "one", "task": "noop"}],
                  [{"ref": "one", "task": "noop"}, {"ref": "two", "task": "noop"}]):  # fmt: skip
        saved = harness.api.put(f"/api/workflow-definitions/{name}",
                                json={"name": name, "tasks": tasks})  # fmt: skip
        assert saved.status_code in (200, 201), saved.text
    page = ui.page
    dialog = page.locator("#start-dialog")
    _open_start_dialog(ui)
    dialog.get_by_label("Workflow", exact=True).select_option(name)
    version = dialog.get_by_label("Version", exact=True)
    expect(version.locator("option")).to_contain_text(["current (v2)", "v2", "v1"])
    version.select_option("1")
    dialog.get_by_label("Input image (S3 URI)", exact=True).fill("")
    data = dialog.get_by_label("Data (JSON object)", exact=True)
    data.fill('{"n": 3,}')
    dialog.get_by_role("button", name="Start", exact=True).click()
    expect(dialog.locator(".alert-error")).to_contain_text("Data is not JSON")
    expect(data).to_have_attribute("aria-invalid", "true")
    data.fill('{"n": 3, "label": "from the dialog"}')
    dialog.get_by_role("button", name="Start", exact=True).click()
    expect(page).to_have_url(re.compile(rf"#/workflows/{UUID}$"))
    run_id = page.url.rsplit("/", 1)[1]
    done = harness.wait(run_id)
    assert done["status"] == "COMPLETED" and done["workflow_version"] == 1
    assert done["input"] == {"data": {"n": 3, "label": "from the dialog"}}
    assert [r["ref"] for r in done["task_runs"]] == ["one"]
    expect(page.locator("#card-results")).to_contain_text("No stored results")
    ui.assert_clean()
