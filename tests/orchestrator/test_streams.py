"""A worker's channels for streaming steps (``orchestrator.worker.streams``) on a real minion
and Redis, with two "workers" (two CDI containers) as threads: a publisher with one
subscriber in its own process (an in-memory queue) and one in the other (a CDI ring), every
kind of item, a publisher that fails (its subscribers get ``StreamBroken``), a peer that never
comes, and a step stopped while it waits."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.worker.streams import RunChannels, StreamHub
from tests.cdi.conftest import MinionProcess, shared_dir, start_minion, stop_minion
from workflows.streaming import StreamBroken

__all__ = ["shared_dir"]  # the fixture, used by ``minion`` below

# The group: src publishes "items" to "near" (in src's process) and "far" (in the other).
PLAN: dict[str, dict[str, Any]] = {
    "src": {"publish": {"items": ["near", "far"]}},
    "near": {"subscribe": {"items": "src"}},
    "far": {"subscribe": {"items": "src"}},
}


@pytest.fixture(scope="module")
def minion(shared_dir: Path) -> Iterator[MinionProcess]:
    running = start_minion(shared_dir)
    try:
        yield running
    finally:
        stop_minion(running)


@pytest.fixture
def hubs(minion: MinionProcess, redis_url: str) -> Iterator[tuple[StreamHub, StreamHub]]:
    client = redis.Redis.from_url(redis_url)
    one = minion.client(f"worker-a-{uuid.uuid4().hex[:6]}")
    two = minion.client(f"worker-b-{uuid.uuid4().hex[:6]}")
    try:
        yield StreamHub(one, client, peer_wait_s=5), StreamHub(two, client, peer_wait_s=5)
    finally:
        client.close()


def _ins(run: str, ref: str, plan: dict[str, Any]) -> Instruction:
    return Instruction(
        task_run_id=1, workflow_id=run, ref=ref, task="t", attempt=1, timeout_s=30,
        reply_to="r", data_plane=DataPlane.NONE, channels=plan,
    )  # fmt: skip


def _step(
    hub: StreamHub, run: str, ref: str, body: Callable[[RunChannels], Any],
    stop: threading.Event | None = None,
) -> Any:  # fmt: skip
    channels = hub.open(_ins(run, ref, PLAN[ref]), stop or threading.Event())
    assert channels is not None
    failed = True
    try:
        result = body(channels)
        failed = False
        return result
    finally:
        channels.close(failed=failed)


def _receive_all(channels: RunChannels) -> list[Any]:
    return list(channels.subscribe("items"))


def test_items_reach_a_subscriber_in_the_same_process_and_one_in_another(
    hubs: tuple[StreamHub, StreamHub],
) -> None:
    here, there = hubs
    run = str(uuid.uuid4())
    frame = np.arange(2 * 300 * 400 * 3, dtype=np.uint8).reshape(2, 300, 400, 3)  # 720 KB
    items = [b"raw", {"n": 1, "xs": [1.5, None]}, frame, 7, "text", b""]

    def publish(channels: RunChannels) -> None:
        out = channels.publish("items")
        for item in items * 20:
            out.send(item)

    with ThreadPoolExecutor(3) as pool:
        near = pool.submit(_step, here, run, "near", _receive_all)
        far = pool.submit(_step, there, run, "far", _receive_all)
        pool.submit(_step, here, run, "src", publish).result(timeout=60)
        got = [near.result(timeout=60), far.result(timeout=60)]
    for received in got:
        assert len(received) == len(items) * 20
        assert received[:2] == items[:2] and received[3:6] == items[3:6]
        assert np.array_equal(received[2], frame) and not received[2].flags.writeable


def test_a_publisher_that_fails_breaks_its_subscribers_streams(
    hubs: tuple[StreamHub, StreamHub],
) -> None:
    here, there = hubs
    run = str(uuid.uuid4())

    def fail_midway(channels: RunChannels) -> None:
        channels.publish("items").send(1)
        raise RuntimeError("the task's own failure")

    with ThreadPoolExecutor(3) as pool:
        near = pool.submit(_step, here, run, "near", _receive_all)
        far = pool.submit(_step, there, run, "far", _receive_all)
        with pytest.raises(RuntimeError):
            pool.submit(_step, here, run, "src", fail_midway).result(timeout=60)
        for subscriber in (near, far):
            with pytest.raises(StreamBroken, match="step 'src'"):
                subscriber.result(timeout=30)


def test_a_peer_that_never_comes_fails_the_step_saying_which(
    hubs: tuple[StreamHub, StreamHub],
) -> None:
    here, _ = hubs
    with pytest.raises(StreamBroken, match="waited 5 s for the subscribers of 'items'"):
        _step(here, str(uuid.uuid4()), "src", lambda channels: None)


def test_a_step_stopped_while_it_waits_for_its_peers_ends_at_once(
    hubs: tuple[StreamHub, StreamHub],
) -> None:
    here, _ = hubs
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(StreamBroken, match="was stopped while waiting for the publisher"):
        _step(here, str(uuid.uuid4()), "far", _receive_all, stop)


def test_a_step_names_only_its_own_channels(hubs: tuple[StreamHub, StreamHub]) -> None:
    here, there = hubs
    run = str(uuid.uuid4())

    def wrong(channels: RunChannels) -> None:
        with pytest.raises(Exception, match="does not publish channel 'other'"):
            channels.publish("other")
        channels.publish("items").send(b"x")

    with ThreadPoolExecutor(3) as pool:
        near = pool.submit(_step, here, run, "near", _receive_all)
        far = pool.submit(_step, there, run, "far", _receive_all)
        pool.submit(_step, here, run, "src", wrong).result(timeout=60)
        assert near.result(timeout=30) == far.result(timeout=30) == [b"x"]
