"""The whole stack on two hosts (`cdiflow up --hosts 2`): the image pipeline under every policy
gives what it gives on one host, objects cross between the hosts (at most once a step along a
chain), and a worker killed on the second host has its task rerun with its object recovered
across."""

from __future__ import annotations

import itertools
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cdi
from orchestrator.stack import Stack
from tests.dashboard.browser import UI, browser, ui
from tests.orchestrator.test_e2e import (
    MAX_ACTIVE,
    Harness,
    assert_result_is_the_pipelines,
    free_port,
    napping,
    wait_for,
)
from workflows.samples import bundled_samples

__all__ = ["browser", "napping", "ui"]  # fixtures this module uses

OPEN = ("QUEUED", "RUNNING")  # a task run not reported yet


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    folder = tempfile.mkdtemp(prefix="cdiflow-hosts-")
    os.chmod(folder, 0o755)
    os.environ["MAX_ACTIVE_WORKFLOWS"] = str(MAX_ACTIVE)
    try:
        with Stack(folder, workers=2, hosts=2, port=free_port()) as stack:
            assert stack.worker_host == {"worker-1": "host1", "worker-2": "host2"}
            h = Harness(stack)
            yield h
            h.api.close()
            for host in ("host1", "host2"):  # every workflow finished: no object anywhere
                with cdi.Client(stack.cdi.socket_of(host)) as probe:
                    wait_for(_empty(probe), f"{host}'s minion to hold no object", timeout=30)
    finally:
        os.environ.pop("MAX_ACTIVE_WORKFLOWS", None)
        subprocess.run(["rm", "-rf", folder], check=False)


def _empty(probe: cdi.Client) -> Callable[[], bool]:
    return lambda: not probe.list_objects()


def _crossed(harness: Harness, done: dict[str, Any]) -> list[dict[str, Any]]:
    """The workflow's hand-offs whose two containers are on different hosts."""
    where = {**harness.stack.worker_host, harness.stack.scheduler_id: "host1"}
    return [h for h in done["handoffs"] if where[h["from_container"]] != where[h["to_container"]]]


def test_each_worker_runs_in_its_hosts_namespace(harness: Harness) -> None:
    """Its Postgres, Redis and S3 connections leave its host, through the link emulator."""
    stack = harness.stack
    for worker_id, host in stack.worker_host.items():
        where = stack.cdi.host_of(host)
        if where is None:
            pytest.skip("no link between the hosts here (no namespaces or no nft): workers "
                        "stay in the root namespace")  # fmt: skip
        pid = stack.pid_of(worker_id)
        assert pid is not None and where.namespace is not None
        inside = os.stat(f"/proc/{pid}/ns/net").st_ino
        assert inside == os.stat(f"/run/netns/{where.namespace}").st_ino, worker_id
        assert inside != os.stat("/proc/self/ns/net").st_ino
        assert stack.worker_metrics[worker_id].startswith(f"http://{where.address}:")


@pytest.mark.parametrize(
    ("policy", "plane"),
    [("affinity", "cdi"), ("transfer", "cdi"), ("auto", "cdi"), ("affinity", "object-store")],
)
def test_every_policy_gives_the_one_host_result(harness: Harness, policy: str, plane: str) -> None:
    sample = bundled_samples()["green_field.jpg"]
    image = harness.upload(f"in/hosts-{policy}-{plane}.jpg", sample.read_bytes())
    done = harness.wait(harness.start(image, policy, plane))
    assert done["status"] == "COMPLETED", done["error"]
    assert_result_is_the_pipelines(harness, done, sample)


def test_transfer_hands_objects_between_hosts_straight_from_worker_to_worker(
    harness: Harness,
) -> None:
    """Under transfer a chain's object goes from one step's worker straight to the next one's:
    it crosses between the hosts at most once a step, and never through the scheduler."""
    sample = bundled_samples()["sunset.jpg"]
    image = harness.upload("in/hosts-crossing.jpg", sample.read_bytes())
    ids = [harness.start(image, "transfer") for _ in range(4)]
    done = [harness.wait(i) for i in ids]
    assert all(d["status"] == "COMPLETED" for d in done), [d["error"] for d in done]
    where = harness.stack.worker_host
    for d in done:
        assert_result_is_the_pipelines(harness, d, sample)
        runs = d["task_runs"]
        steps = [(a["worker_id"], b["worker_id"]) for a, b in itertools.pairwise(runs)]
        moves = [(h["from_container"], h["to_container"]) for h in d["handoffs"]]
        assert moves == [(a, b) for a, b in steps if a != b], (steps, d["handoffs"])
        crossings = sum(1 for a, b in steps if where[a] != where[b])
        assert len(_crossed(harness, d)) == crossings, d["handoffs"]
    ran_on_host2 = [d for d in done if any(r["worker_id"] == "worker-2" for r in d["task_runs"])]
    assert ran_on_host2, "no task ran on host 2"


def test_auto_keeps_each_chains_object_on_its_worker_and_never_crosses(
    harness: Harness, napping: str
) -> None:
    """Two runs at once under auto: the second is started while the first's nap is placed on
    its worker (so in flight when the second is placed, however slow the machine), and goes to
    the other one; with nothing queued anywhere every next step is predicted to stay, so each worker
    keeps its run's object: all of a run's tasks on one worker, and no hand-off between the
    hosts."""
    sample = bundled_samples()["blue_sky.jpg"]
    image = harness.upload("in/hosts-auto-keeps.jpg", sample.read_bytes())
    first = harness.start(image, "auto", workflow=napping)

    def napping_worker() -> str | None:  # the nap placed and not reported (3 s)
        naps = [r for r in harness.get(first)["task_runs"] if r["ref"] == "nap"]
        return str(naps[-1]["worker_id"]) if naps and naps[-1]["status"] in OPEN else None

    busy = wait_for(napping_worker, "the first run's nap placed", timeout=60)
    ids = [first, harness.start(image, "auto")]
    done = [harness.wait(i) for i in ids]
    assert all(d["status"] == "COMPLETED" for d in done), [d["error"] for d in done]
    ran_on: list[str] = []
    for d in done:
        assert_result_is_the_pipelines(harness, d, sample)
        workers = {r["worker_id"] for r in d["task_runs"]}
        assert len(workers) == 1, d["task_runs"]
        ran_on += workers
        assert not _crossed(harness, d), d["handoffs"]
    assert ran_on[0] == busy and sorted(ran_on) == ["worker-1", "worker-2"]


def test_a_worker_killed_on_the_second_host_has_its_task_rerun(
    harness: Harness, napping: str
) -> None:
    """The victim holds the object on host 2; its death sends the object back across to the
    scheduler, its recovery container, and the task reruns. Three runs at once: host 1's
    worker takes two (one running, one queued), so one nap runs on host 2."""
    sample = bundled_samples()["night.jpg"]
    image = harness.upload("in/hosts-kill.jpg", sample.read_bytes())
    ids = [harness.start(image, "transfer", workflow=napping) for _ in range(3)]

    def napping_on_host2() -> str | None:
        beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
        for run_id in ids:
            naps = [r for r in harness.get(run_id)["task_runs"] if r["ref"] == "nap"]
            if naps and naps[-1]["worker_id"] == "worker-2" and naps[-1]["status"] in OPEN:
                return run_id if beats.get("worker-2", {}).get("running", 0) >= 1 else None
        return None

    victim_run = wait_for(napping_on_host2, "a nap running on host 2's worker", timeout=90)
    harness.stack.kill_worker("worker-2")
    done = {run_id: harness.wait(run_id, timeout=180) for run_id in ids}
    for body in done.values():
        assert body["status"] == "COMPLETED", body["error"]
        assert_result_is_the_pipelines(harness, body, sample)
    naps = [r for r in done[victim_run]["task_runs"] if r["ref"] == "nap"]
    assert naps[0]["status"] == "FAILED" and naps[0]["worker_id"] == "worker-2", naps
    assert naps[-1]["status"] == "COMPLETED"


def test_the_dashboard_shows_hosts_and_every_cross_host_move(
    harness: Harness, ui: UI, napping: str
) -> None:
    from playwright.sync_api import expect

    sample = bundled_samples()["sunset.jpg"]

    def both_alive() -> bool:  # the test before killed worker-2: placement skips it till back
        return all(w["alive"] for w in harness.api.get("/api/workers").json())

    wait_for(both_alive, "both workers alive", 60)
    image = harness.upload("in/hosts-dashboard.jpg", sample.read_bytes())
    # A fork whose branches start side by side, one on each (idle) host: its join reads both,
    # through the scheduler on host 1. Then three 3 s naps at once.
    ids = [harness.start(image, "transfer", workflow="fork_join_pipeline")]
    ids += [harness.start(image, "transfer", workflow=napping) for _ in range(3)]
    runs = [harness.wait(i) for i in ids]
    assert all(r["status"] == "COMPLETED" for r in runs), [r["error"] for r in runs]
    done = next((r for r in runs if _crossed(harness, r)), None)
    assert done is not None, "no run crossed between the hosts"
    crossed = _crossed(harness, done)
    # The API records both hosts of every hand-off.
    assert all(h["from_host"] and h["to_host"] for h in done["handoffs"]), done["handoffs"]
    page = ui.page
    ui.open(f"#/workflows/{done['id']}")
    expect(page.locator("table.handoffs tbody tr")).to_have_count(len(done["handoffs"]))
    expect(page.locator("tr[data-crosses-hosts=yes]")).to_have_count(len(crossed))
    expect(page.locator("#handoff-crossings")).to_have_text(str(len(crossed)))
    for row in page.locator("tr[data-crosses-hosts=yes]").all():
        assert "@host1" in row.inner_text() and "@host2" in row.inner_text()
    ui.shot("multihost-workflow")
    # Which worker is where: each worker's card names its host.
    ui.open("#/workers")
    for worker, host in harness.stack.worker_host.items():
        card = page.locator(".worker-head", has_text=worker)
        expect(card).to_contain_text(f"on {host}")
    # The hosts themselves: a minion per host on the data page.
    ui.open("#/data")
    for host in ("host1", "host2"):
        expect(page.locator(f"[data-minion={host}]")).to_have_count(1)


def test_two_schedulers_on_two_hosts(harness: Harness) -> None:
    """A second scheduler on host 2: each workflow is run by one of them, once, and objects
    cross to and from either scheduler's host."""
    second = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.scheduler", "--id", "scheduler-2"],
        env=harness.stack.environment("host2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sample = bundled_samples()["blue_sky.jpg"]
        image = harness.upload("in/hosts-two.jpg", sample.read_bytes())
        ids = [harness.start(image, policy) for policy in ("transfer", "auto") * 4]
        finished = [harness.wait(i) for i in ids]
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    for done in finished:
        assert done["status"] == "COMPLETED", done["error"]
        assert [r["ref"] for r in done["task_runs"]] == ["deblur", "denoise", "classify"]
        assert_result_is_the_pipelines(harness, done, sample)
    # Each scheduler's hand-offs name its own host (the others go from worker to worker).
    for done in finished:
        home = "host2" if done["claimed_by"] == "scheduler-2" else "host1"
        for handoff in done["handoffs"]:
            if handoff["from_container"].startswith("scheduler"):
                assert handoff["from_host"] == home, (done["claimed_by"], handoff)
            elif handoff["to_container"].startswith("scheduler"):
                assert handoff["to_host"] == home, (done["claimed_by"], handoff)


def test_a_killed_minion_on_the_second_host_comes_back_with_its_objects(harness: Harness) -> None:
    """Host 2's minion keeps its objects in its own state folder: killed (its launcher, the
    piece the stack supervises), it is started again, and an object that lived there is found
    again with its owner, its bytes and, in the directory, its time of creation."""
    stack = harness.stack
    socket_path = stack.cdi.socket_of("host2")
    state = Path(socket_path).parent / "minion-state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700, "the state folder is the minion's only"
    me = f"hosts-keeper-{os.getpid()}"
    made = time.time()
    with cdi.connect(socket_path, me) as keeper:
        obj = keeper.create("hosts-kept", 4096)
        obj.access()[:4] = b"kept"
        time.sleep(2)  # an age counted from the restart would be this much short
        before = stack.restarts("cdi-minion-host2")
        killed_at = time.time()
        stack.kill("cdi-minion-host2")
        wait_for(lambda: stack.restarts("cdi-minion-host2") > before, "its restart", 60)
        # The client carries on with the new minion: the same store, the object as it was.
        assert keeper.describe("hosts-kept")["owner"] == me
        assert bytes(keeper.use("hosts-kept").access()[:4]) == b"kept"

        def reannounced() -> dict[str, Any] | None:
            directory = harness.api.get("/api/cdi/objects").json()
            host2 = [m for m in directory["minions"] if m["host"] == "host2"]
            if not host2 or host2[0]["restarts"] < 1:
                return None
            kept = [o for o in directory["objects"] if o["key"] == "hosts-kept"]
            return kept[0] if kept and kept[0]["updated_at"] > killed_at else None

        info = wait_for(reannounced, "the object announced again by host 2's minion", 30)
        assert (info["host"], info["owner"]) == ("host2", me)
        assert made - 1 < info["created_at"] < killed_at, "its time of creation, not the restart's"
        assert info["age_s"] > 2
        keeper.use("hosts-kept").destroy()


def test_a_killed_link_emulator_is_restarted_and_the_hosts_workers_go_on(
    harness: Harness,
) -> None:
    """The workers on the hosts reach Redis, Postgres and S3 through it: killed, it comes back
    (the supervisor), the workers reconnect, and workflows complete. Last in this module."""
    stack = harness.stack
    if stack.cdi.emulator is None:
        pytest.skip("no link between the hosts here (no namespaces or no nft)")
    before = stack.restarts("link-emulator")
    killed_at = time.time()
    stack.kill("link-emulator")
    wait_for(lambda: stack.restarts("link-emulator") > before, "the emulator's restart", 60)
    sample = bundled_samples()["sunset.jpg"]
    image = harness.upload("in/hosts-after-link.jpg", sample.read_bytes())
    done = [harness.wait(harness.start(image, "transfer"), timeout=180) for _ in range(3)]
    for body in done:
        assert body["status"] == "COMPLETED", body["error"]
        assert_result_is_the_pipelines(harness, body, sample)

    def both_beat_since() -> bool:
        beats = {w["id"]: w for w in harness.api.get("/api/workers").json()}
        # None while a worker is listed without a beat (its hash being written again)
        return all(
            (beats.get(w, {}).get("last_heartbeat") or 0) > killed_at
            for w in ("worker-1", "worker-2")
        )

    wait_for(both_beat_since, "both workers' heartbeats since the kill", 60)
