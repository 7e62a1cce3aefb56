"""Placement decisions from worker loads: each policy's choice (``policies``) and the loads and
costs it weighs (``placement``); pure functions, no services needed."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from orchestrator.contract.vocabulary import Policy
from orchestrator.scheduler.placement import (
    Link,
    Route,
    WorkerLoad,
    capable,
    loaded_modules,
    move_cost_s,
    read_workers,
)
from orchestrator.scheduler.policies import POLICIES, Choice, pinned
from orchestrator.scheduler.policies.auto import stays


def choose_worker(
    workers: Sequence[WorkerLoad],
    policy: Policy,
    previous: str | None,
    *,
    task_s: float,
    nbytes: int,
    rng: random.Random | None = None,
    route: Route | None = None,
) -> str | None:
    """``policy``'s choice for a step of a chain whose data (and home) is on ``previous``."""
    choice = Choice(workers, task_s, nbytes, near=previous, home=previous,
                    route=route or Route(), rng=rng or random.Random())  # fmt: skip
    return POLICIES[policy].choose(choice)


def test_every_policy_has_its_part() -> None:
    assert set(POLICIES) == set(Policy)


def load(worker_id: str, backlog: int = 0, alive: bool = True, cpu: float = 0.0) -> WorkerLoad:
    return WorkerLoad(worker_id, alive, cpu, 10.0, backlog, 0, 0)


def test_no_live_worker_means_no_placement() -> None:
    assert (
        choose_worker([load("w1", alive=False)], Policy.TRANSFER, None, task_s=0.1, nbytes=0)
        is None
    )


def test_transfer_picks_the_least_loaded_worker() -> None:
    workers = [load("w1", 3), load("w2", 0), load("w3", 1)]
    assert choose_worker(workers, Policy.TRANSFER, "w1", task_s=0.1, nbytes=0) == "w2"


def test_cpu_breaks_ties() -> None:
    workers = [load("w1", 1, cpu=90.0), load("w2", 1, cpu=5.0)]
    assert choose_worker(workers, Policy.TRANSFER, None, task_s=0.1, nbytes=0) == "w2"


def test_affinity_stays_while_its_worker_lives() -> None:
    workers = [load("w1", 9), load("w2", 0)]
    assert choose_worker(workers, Policy.AFFINITY, "w1", task_s=0.1, nbytes=0) == "w1"
    workers = [load("w1", 0, alive=False), load("w2", 0)]
    assert choose_worker(workers, Policy.AFFINITY, "w1", task_s=0.1, nbytes=0) == "w2"


def test_affinity_beyond_a_chain_places_each_step_on_the_best_worker() -> None:
    workers = [load("w1", 9), load("w2", 0)]
    graph = Choice(workers, 0.1, 0, home="w1", chain=False)
    assert POLICIES[Policy.AFFINITY].choose(graph) == "w2"


def test_a_step_pinned_to_a_worker_queues_there_until_it_dies() -> None:
    workers = [busy("w1", 5), busy("w2", 0)]
    assert pinned(Choice(workers, 0.4, 0), "w1") == "w1"  # no room, yet it can run only there
    workers = [busy("w1", 0, alive=False), busy("w2", 0)]
    assert pinned(Choice(workers, 0.4, 0), "w1") == "w2"
    # A worker that lost the step is taken only when no other lives.
    workers = [busy("w1", 0), busy("w2", 0)]
    assert pinned(Choice(workers, 0.4, 0, avoid=frozenset({"w1"})), None) == "w2"
    assert pinned(Choice(workers[:1], 0.4, 0, avoid=frozenset({"w1"})), None) == "w1"


def test_the_best_worker_regardless_of_room_is_the_least_loaded_alive() -> None:
    """What a chain's next step is handed to when no worker has room for it."""
    workers = [busy("w1", 3), busy("w2", 2), busy("w3", 0, alive=False)]
    assert Choice(workers, 0.4, 0).best() is None
    least = Choice(workers, 0.4, 0).best(room=False)
    assert least is not None and least.worker_id == "w2"
    assert Choice(workers[2:], 0.4, 0).best(room=False) is None


def test_auto_moves_only_when_waiting_costs_more_than_moving() -> None:
    busy_here = [load("w1", 4), load("w2", 0)]
    assert choose_worker(busy_here, Policy.AUTO, "w1", task_s=0.05, nbytes=1_000_000) == "w2"
    slightly_busier = [load("w1", 1), load("w2", 0)]
    # one queued 0.1 ms task is cheaper than moving 10 MB
    assert (
        choose_worker(slightly_busier, Policy.AUTO, "w1", task_s=0.0001, nbytes=10_000_000) == "w1"
    )
    assert move_cost_s(10_000_000) > move_cost_s(0)


def test_in_flight_counts_when_heartbeats_lag() -> None:
    beats = {
        "w1": {"last_heartbeat": "100", "queue_depth": "0", "running": "0"},
        "w2": {"last_heartbeat": "100", "queue_depth": "0", "running": "0"},
    }
    loads = read_workers(beats, {"w1": 3}, dead_after_s=6, now=101)
    assert (
        choose_worker(loads, Policy.TRANSFER, None, task_s=0.1, nbytes=0, rng=random.Random(1))
        == "w2"
    )


def test_a_beat_older_than_the_workers_last_report_does_not_count_its_tasks() -> None:
    """w1's beat (at 100) still counts the task it reported at 100.5; w2 is really busy."""
    beats = {
        "w1": {"last_heartbeat": "100", "queue_depth": "0", "running": "1"},
        "w2": {"last_heartbeat": "100", "queue_depth": "0", "running": "1"},
    }
    reported = {"w1": 100.5, "w2": 99.0}
    read = read_workers(beats, {"w2": 1}, dead_after_s=6, now=101, reported_at=reported)
    loads = {w.worker_id: w for w in read}
    assert (loads["w1"].backlog, loads["w2"].backlog) == (0, 1)
    assert choose_worker(list(loads.values()), Policy.TRANSFER, None, task_s=0.1, nbytes=0) == "w1"


def test_stale_or_malformed_heartbeats_read_as_dead() -> None:
    beats = {"old": {"last_heartbeat": "10"}, "bad": {"last_heartbeat": "soon"}}
    loads = {w.worker_id: w for w in read_workers(beats, {}, dead_after_s=6, now=100)}
    assert not loads["old"].alive and not loads["bad"].alive


# --- late binding: tasks free to go anywhere wait for a worker with room ---------------------


def busy(
    worker_id: str, in_flight: int, slots: int = 1, backlog: int | None = None, alive: bool = True
) -> WorkerLoad:
    queued = in_flight if backlog is None else backlog
    return WorkerLoad(worker_id, alive, 0.0, 10.0, queued, 0, in_flight, slots=slots)


def test_room_is_the_slots_plus_a_prefetch_that_grows_for_short_tasks() -> None:
    one_slot = busy("w1", in_flight=2)
    assert not one_slot.has_room(task_s=0.4)  # running + one queued: a 0.4 s task waits
    assert busy("w1", in_flight=1).has_room(task_s=0.4)
    assert busy("w1", in_flight=2, slots=2).has_room(task_s=0.4)
    assert one_slot.has_room(task_s=0.002)  # 2 ms tasks: 50 may queue behind the running one
    assert not busy("w1", in_flight=51).has_room(task_s=0.002)


def test_transfer_waits_when_no_worker_has_room() -> None:
    assert (
        choose_worker([busy("w1", 2), busy("w2", 1)], Policy.TRANSFER, "w1", task_s=0.4, nbytes=0)
        == "w2"
    )
    assert (
        choose_worker([busy("w1", 2), busy("w2", 2)], Policy.TRANSFER, "w1", task_s=0.4, nbytes=0)
        is None
    )


def test_affinity_binds_only_its_first_task_late() -> None:
    full = [busy("w1", 5), busy("w2", 5)]
    assert choose_worker(full, Policy.AFFINITY, None, task_s=0.4, nbytes=0) is None
    assert choose_worker(full, Policy.AFFINITY, "w1", task_s=0.4, nbytes=0) == "w1"  # pinned


def test_auto_moves_to_a_worker_with_room_or_waits_for_its_own() -> None:
    # Same host: moving 26 MB costs ~13 ms, far less than waiting for a 0.4 s task.
    workers = [busy("w1", 2), busy("w2", 0)]
    assert choose_worker(workers, Policy.AUTO, "w1", task_s=0.4, nbytes=26_000_000) == "w2"
    # Moving 4 GB (~2 s) costs more than waiting for the two 0.4 s tasks ahead: it waits.
    assert choose_worker(workers, Policy.AUTO, "w1", task_s=0.4, nbytes=4_000_000_000) is None
    # Its own worker has room and moving would not pay: it stays.
    assert (
        choose_worker(
            [busy("w1", 1), busy("w2", 0)], Policy.AUTO, "w1", task_s=0.4, nbytes=4_000_000_000
        )
        == "w1"
    )


def test_slots_come_from_the_heartbeat() -> None:
    beats = {
        "w1": {"last_heartbeat": "100", "slots": "4"},
        "w2": {"last_heartbeat": "100"},  # a worker from before the field: one slot
        "w3": {"last_heartbeat": "100", "slots": "0"},
    }
    loads = {w.worker_id: w for w in read_workers(beats, {}, dead_after_s=6, now=101)}
    assert (loads["w1"].slots, loads["w2"].slots, loads["w3"].slots) == (4, 1, 1)


def test_a_task_goes_only_to_workers_that_loaded_its_module() -> None:
    gpu = json.dumps({"modules": {"gpu_tasks": {}, "workflows.image_tasks": {}}, "errors": {}})
    plain = json.dumps({"modules": {"workflows.image_tasks": {}}, "errors": {}})
    beats = {
        "w1": {"last_heartbeat": "100", "queue_depth": "0", "tasks": plain},
        "w2": {"last_heartbeat": "100", "queue_depth": "5", "tasks": gpu},
        "w3": {"last_heartbeat": "100", "queue_depth": "0", "tasks": "not json"},
    }
    workers = read_workers(beats, {}, dead_after_s=6, now=101)
    assert [w.worker_id for w in capable(workers, "gpu_tasks:render")] == ["w2"]
    assert {w.worker_id for w in capable(workers, "workflows.image_tasks:deblur")} == {"w1", "w2"}
    assert capable(workers, "other:fn") == []
    # The least loaded worker (w1) cannot run it: the busier one that can gets it.
    able = capable(workers, "gpu_tasks:render")
    assert choose_worker(able, Policy.TRANSFER, None, task_s=0.1, nbytes=0) == "w2"
    assert loaded_modules(gpu) == frozenset({"gpu_tasks", "workflows.image_tasks"})


# -- hosts ------------------------------------------------------------------------------------


def on(worker_id: str, host: str, backlog: int = 0) -> WorkerLoad:
    return WorkerLoad(worker_id, True, 0.0, 10.0, backlog, 0, 0, host=host)


def test_an_equal_worker_on_the_objects_host_wins_over_one_across() -> None:
    here = Route("h1", "h1", Link(bytes_per_s=125e6, rtt_s=0.0005))
    workers = [on("far", "h2"), on("near", "h1")]
    for seed in range(20):  # no tie to break at random: the crossing decides
        rng = random.Random(seed)
        assert (
            choose_worker(workers, Policy.TRANSFER, None, task_s=0.1, nbytes=2_000_000,
                          rng=rng, route=here)
            == "near"
        )  # fmt: skip


def test_a_worker_across_wins_when_its_queue_is_shorter_by_more_than_the_crossing() -> None:
    link = Link(bytes_per_s=125e6, rtt_s=0.0005)  # 2 MB: ~16.5 ms to cross
    here = Route("h1", "h1", link)
    busy_near = [on("far", "h2", backlog=0), on("near", "h1", backlog=1)]
    assert choose_worker(busy_near, Policy.TRANSFER, None, task_s=0.4, nbytes=2_000_000,
                         route=here) == "far"  # fmt: skip
    # A slow link: crossing costs more than waiting for one short task.
    slow = Route("h1", "h1", Link(bytes_per_s=1e6, rtt_s=0.05))
    assert choose_worker(busy_near, Policy.TRANSFER, None, task_s=0.4, nbytes=2_000_000,
                         route=slow) == "near"  # fmt: skip


def test_auto_stays_rather_than_cross_a_slow_link() -> None:
    slow = Route("h1", "h1", Link(bytes_per_s=1e6, rtt_s=0.05))
    workers = [on("w1", "h1", backlog=2), on("w2", "h2", backlog=0)]
    # On one host w2 would win (2 tasks of 0.1 s against a zero-copy move) ...
    assert choose_worker(workers, Policy.AUTO, "w1", task_s=0.1, nbytes=2_000_000) == "w2"
    # ... across a 1 MB/s link the 2 MB would take 2 s: staying is cheaper.
    assert choose_worker(workers, Policy.AUTO, "w1", task_s=0.1, nbytes=2_000_000,
                         route=slow) == "w1"  # fmt: skip


def test_auto_keeps_on_another_host_what_it_would_move_on_one() -> None:
    """``stays`` decides whether a worker keeps a chain's object for the next step."""
    gigabit = Link(bytes_per_s=125e6, rtt_s=0.0005)
    decoded = 20_000_000  # a 2 MB JPEG's pixels
    # One host: a 0.1 s task ahead costs more than a zero-copy move to an idle worker.
    assert not stays(on("w1", "h1", backlog=1), [on("w2", "h1")], task_s=0.1, nbytes=decoded,
                     route=Route("h1", "h1", gigabit))  # fmt: skip
    # On host 2, the scheduler on host 1: handing back and moving on crosses once (0.16 s)
    # to reach the idle worker on host 1, more than the task ahead.
    assert stays(on("w2", "h2", backlog=1), [on("w1", "h1")], task_s=0.1, nbytes=decoded,
                 route=Route("h2", "h1", gigabit))  # fmt: skip
    # ... but not more than three tasks ahead.
    assert not stays(on("w2", "h2", backlog=3), [on("w1", "h1")], task_s=0.1, nbytes=decoded,
                     route=Route("h2", "h1", gigabit))  # fmt: skip
    # Nothing ahead, or no other worker: stay.
    assert stays(on("w1", "h1"), [on("w2", "h1")], task_s=0.1, nbytes=0)
    assert stays(on("w1", "h1", backlog=9), [], task_s=0.1, nbytes=0)


def test_crossings_count_the_hosts_the_object_passes() -> None:
    assert Route("h1", "h1").crossings("h1") == 0
    assert Route("h1", "h1").crossings("h2") == 1
    assert Route("h2", "h1").crossings("h2") == 2  # from a worker on h2, via the scheduler on h1
    assert Route("h2", "h1").crossings("h1") == 1
    assert Route("", "").crossings("h2") == 0  # one host, hosts unknown
    assert move_cost_s(2_000_000, 2, Link(125e6, 0.0005)) > move_cost_s(2_000_000)


def test_the_link_learns_from_transfers() -> None:
    link = Link(bytes_per_s=125e6, rtt_s=0.0005)
    for _ in range(30):
        link.observe(10_000, 0.002)  # small: round trip
        link.observe(10_000_000, 0.102)  # large: 100 MB/s after the round trip
    assert 0.0019 < link.rtt_s < 0.0021
    assert 95e6 < link.bytes_per_s < 105e6
