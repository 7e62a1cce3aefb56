"""What each host keeps, in a real headless Chromium against a stack of its own with the input
cache on (``CDIFLOW_INPUT_CACHE=1``): the workers' input cache, a channel topic open between
two containers, and a minion restart that kept its objects (the stack's minion has a state
folder)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from unittest import mock

import httpx
import pytest

import cdi
from cdi import channels
from loadtest.systems.services import s3_client
from orchestrator.stack import Stack
from tests.dashboard.browser import UI, browser, ui
from tests.dashboard.support import Harness, free_port, sample, wait_for

from playwright.sync_api import expect  # isort: skip

__all__ = ["browser", "ui"]  # the fixtures of tests.dashboard.browser

CACHE_ENV = {"CDIFLOW_INPUT_CACHE": "1", "CDIFLOW_INPUT_CACHE_MIB": "256"}


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    """This module's own stack: the cache is on for its workers (they inherit the setting)."""
    folder = tempfile.mkdtemp(prefix="cdiflow-ui-host-")
    os.chmod(folder, 0o755)
    try:
        # The stack's processes inherit the setting.
        with (
            mock.patch.dict(os.environ, CACHE_ENV),
            Stack(folder, workers=2, port=free_port()) as stack,
        ):
            services = stack.services
            s3 = s3_client(services)
            with httpx.Client(
                base_url=stack.api_url, timeout=30, headers=stack.auth_headers
            ) as api:
                yield Harness(stack, api, s3, services.s3_bucket)
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


def _caches(harness: Harness) -> dict[str, dict[str, int]]:
    workers = harness.api.get("/api/workers").raise_for_status().json()
    return {w["id"]: w["input_cache"] for w in workers if w["alive"]}


def test_workers_page_shows_each_workers_input_cache(ui: UI, harness: Harness) -> None:
    data = sample("green_field.jpg")
    image = harness.upload("ui/cached.jpg", data)
    # One workflow fetches the input, then two more find it in the host's cache.
    assert harness.wait(harness.start("image_pipeline", image, "affinity"))["status"] == "COMPLETED"
    for run_id in [harness.start("image_pipeline", image, "affinity") for _ in range(2)]:
        assert harness.wait(run_id)["status"] == "COMPLETED"

    def counted() -> dict[str, dict[str, int]] | None:
        caches = _caches(harness)
        hits = sum(c["hits"] for c in caches.values() if c)
        return caches if len(caches) == 2 and hits == 2 else None

    caches = wait_for(counted, "the heartbeats to count two hits", timeout=15)
    assert sum(c["misses"] for c in caches.values()) == 1
    assert sum(c["saved_bytes"] for c in caches.values()) == 2 * len(data)
    assert sum(c["s3_bytes"] for c in caches.values()) == len(data)  # fetched once
    (holder,) = [w for w, c in caches.items() if c["holder"]]  # one worker holds the host's
    assert caches[holder]["entries"] == 1 and caches[holder]["bytes"] > len(data)  # decoded

    page = ui.page
    ui.open("#/workers")
    for worker_id, cache in caches.items():
        card = page.locator(f"article[data-worker={worker_id}] [data-input-cache]")
        hits, misses = cache["hits"], cache["misses"]
        expect(card.locator("[data-cache=hits]")).to_have_text(
            f"{hits} hit{'' if hits == 1 else 's'}"
        )
        expect(card.locator("[data-cache=misses]")).to_have_text(
            f"{misses} {'miss' if misses == 1 else 'misses'}"
        )
        expect(card.locator("[data-cache=saved]")).to_have_text(
            re.compile(r"^[\d.]+ [KMG]?B saved$")
        )
        expect(card).to_have_attribute(
            "data-input-cache", "holder" if worker_id == holder else "on"
        )
    held = page.locator(f"article[data-worker={holder}] [data-cache=held]")
    expect(held).to_have_text(re.compile(r"^1 input \([\d.]+ [KMG]?B\)$"))
    ui.shot("workers-input-cache", full_page=False)


def test_data_page_shows_a_channel_while_it_is_open(ui: UI, harness: Harness) -> None:
    page = ui.page
    ui.open("#/data")
    box = page.locator("#channels")
    expect(box).to_contain_text("No channel open")
    socket = harness.stack.minion_socket
    with cdi.connect(socket, "ui-writer") as writer, cdi.connect(socket, "ui-reader") as reader:
        topic = channels.open_topic(writer, "ui-frames", readers=["ui-reader"])
        try:
            subscription = channels.subscribe(reader, "ui-frames", timeout=10)
            try:
                topic.publish(b"frame")
                assert subscription.receive(timeout=10) == b"frame"
                row = box.locator("li[data-channel=ui-frames]")
                expect(row).to_contain_text("ui-writer")
                expect(row).to_contain_text("ui-reader")
                listed = harness.api.get("/api/cdi/objects").raise_for_status().json()["channels"]
                (channel,) = [c for c in listed if c["name"] == "ui-frames"]
                assert (channel["writer"], channel["readers"]) == ("ui-writer", ["ui-reader"])
                assert channel["ring_bytes"] > 0
                page.locator("#card-channels").scroll_into_view_if_needed()
                ui.shot("data-channel", full_page=False)
            finally:
                subscription.close()
        finally:
            topic.close()
    expect(box).to_contain_text("No channel open", timeout=15_000)


def test_data_page_shows_a_minion_restart_that_kept_its_objects(ui: UI, harness: Harness) -> None:
    page = ui.page
    ui.open("#/data")
    minion = page.locator("#minions li[data-minion] [data-survival]")
    expect(minion).to_have_attribute("data-survival", "on")  # the stack gives it a state folder
    expect(minion).to_have_attribute("data-restarts", "0")
    expect(minion).to_contain_text("no restart yet")
    with cdi.connect(harness.stack.minion_socket, "ui-keeper") as keeper:
        kept = keeper.create("ui-kept", 4096)
        with kept.view() as view:
            view[:5] = b"hello"
        expect(page.locator("tr[data-object=ui-kept]")).to_have_count(1)
        harness.stack.kill("cdi-minion")  # kill -9 of its launcher: the stack starts another
        expect(minion).to_have_attribute("data-restarts", "1", timeout=30_000)
        count = int(minion.get_attribute("data-kept") or "0")
        assert count >= 1  # ours, and the input cache's from the test above
        expect(minion).to_contain_text(
            f"kept {count} object{'' if count == 1 else 's'} at restart 1"
        )
        # The object is still the keeper's, with its bytes.
        assert keeper.describe("ui-kept")["owner"] == "ui-keeper"
        with kept.view() as view:
            assert bytes(view[:5]) == b"hello"
        expect(page.locator("tr[data-object=ui-kept]")).to_have_attribute("data-owner", "ui-keeper")
        page.locator("#card-minions").scroll_into_view_if_needed()
        ui.shot("data-minion-restart", full_page=False)
        kept.destroy()
    minions = harness.api.get("/api/cdi/objects").raise_for_status().json()["minions"]
    (only,) = minions
    assert (only["keeps_objects"], only["restarts"], only["kept_objects"]) == (True, 1, count)
