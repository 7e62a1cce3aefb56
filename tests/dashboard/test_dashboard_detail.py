"""The dashboard's view of one run and of the data, in a real headless Chromium against a real
stack: the timeline and its hand-offs, the ownership moves on the data page, a graph run's
branches and a skipped step."""

from __future__ import annotations

import itertools
import re
from datetime import datetime
from functools import partial
from typing import Final

from tests.dashboard.browser import UI, browser, ui
from tests.dashboard.support import Harness, sample, wait_for

from playwright.sync_api import Page, expect  # isort: skip

__all__ = ["browser", "ui"]  # the fixtures of tests.dashboard.browser


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
    # A chain's object moves only where its next step runs on another worker, straight there.
    handoffs = done["handoffs"]
    steps = [(a["worker_id"], b["worker_id"]) for a, b in itertools.pairwise(started)]
    moves = [(x["from_container"], x["to_container"]) for x in handoffs]
    assert moves == [(a, b) for a, b in steps if a != b], (steps, handoffs)
    expect(page.locator(".gantt .handoff")).to_have_count(len(handoffs))
    # "Holds the data" sits on the lane of the worker running the nap, mid-run. (Only the long
    # run: a hand-off is stamped when the scheduler records it, after the instruction went out,
    # so a task of a few milliseconds may be over before its hand-over's stamp.)
    covered = page.evaluate(_RUNS_ON_HELD_LANES)
    assert covered == [True], covered

    # The hand-off table: every transfer, from → to, in order, with its size (none when every
    # step ran on one worker; a graph run's go through the scheduler: the test below).
    table = page.locator("table.handoffs tbody tr")
    expect(table).to_have_count(len(handoffs))
    for row, handoff in zip(table.all(), handoffs, strict=True):
        text = row.inner_text()
        assert handoff["from_container"] in text and handoff["to_container"] in text, text
        assert text.index(handoff["from_container"]) < text.rindex(handoff["to_container"])
    if handoffs:
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


def test_data_page_shows_ownership_move(ui: UI, harness: Harness, napping: str) -> None:
    page = ui.page
    ui.open("#/data")
    expect(page.locator("h1")).to_have_text("Data")
    image = harness.upload("ui/data.jpg", sample("sunset.jpg"))
    run_id = harness.start("double_nap", image)
    others = [harness.start("double_nap", image) for _ in range(2)]  # company for the picture
    # A chain's object may stay on its worker throughout; one two steps read goes back to the
    # scheduler after the nap that holds it.
    forked = harness.start("nap_then_fork", image)
    held = page.locator(f"tr[data-object^='wf-{run_id}']")
    expect(held).to_have_count(1, timeout=30_000)
    expect(held).to_have_attribute("data-owner", re.compile(r"^worker-\d+$"))
    expect(held).to_contain_text(run_id[:8])
    moved = page.locator(f"#moves-list li[data-move=moved][data-workflow='{forked}']")
    expect(moved.first).to_be_visible(timeout=30_000)
    wait_for(lambda: page.locator("tr[data-object]").count() >= 2, "two objects", timeout=10)
    # The stack's minion keeps its objects across a restart; no channel is open.
    survival = page.locator("#minions [data-survival]")
    expect(survival).to_have_attribute("data-survival", "on")
    expect(survival).to_contain_text("keeps objects")
    expect(page.locator("#channels")).to_contain_text("No channel open")
    ui.shot("data", full_page=False)
    assert harness.wait(run_id)["status"] == "COMPLETED"
    assert all(harness.wait(other)["status"] == "COMPLETED" for other in [*others, forked])
    expect(held).to_have_count(0, timeout=30_000)  # released when the run ends
    released = page.locator(f"#moves-list li[data-move=released][data-workflow='{run_id}']")
    expect(released.first).to_be_visible()
    ui.assert_clean()


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
