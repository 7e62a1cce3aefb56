"""Placement decisions from worker loads (pure functions; no services needed)."""

from __future__ import annotations

import random

from orchestrator.scheduler.placement import WorkerLoad, choose_worker, move_cost_s, read_workers


def load(worker_id: str, backlog: int = 0, alive: bool = True, cpu: float = 0.0) -> WorkerLoad:
    return WorkerLoad(worker_id, alive, cpu, 10.0, backlog, 0, 0)


def test_no_live_worker_means_no_placement() -> None:
    assert choose_worker([load("w1", alive=False)], "transfer", None, task_s=0.1, nbytes=0) is None


def test_transfer_picks_the_least_loaded_worker() -> None:
    workers = [load("w1", 3), load("w2", 0), load("w3", 1)]
    assert choose_worker(workers, "transfer", "w1", task_s=0.1, nbytes=0) == "w2"


def test_cpu_breaks_ties() -> None:
    workers = [load("w1", 1, cpu=90.0), load("w2", 1, cpu=5.0)]
    assert choose_worker(workers, "transfer", None, task_s=0.1, nbytes=0) == "w2"


def test_affinity_stays_while_its_worker_lives() -> None:
    workers = [load("w1", 9), load("w2", 0)]
    assert choose_worker(workers, "affinity", "w1", task_s=0.1, nbytes=0) == "w1"
    workers = [load("w1", 0, alive=False), load("w2", 0)]
    assert choose_worker(workers, "affinity", "w1", task_s=0.1, nbytes=0) == "w2"


def test_auto_moves_only_when_waiting_costs_more_than_moving() -> None:
    busy_here = [load("w1", 4), load("w2", 0)]
    assert choose_worker(busy_here, "auto", "w1", task_s=0.05, nbytes=1_000_000) == "w2"
    slightly_busier = [load("w1", 1), load("w2", 0)]
    # one queued 0.1 ms task is cheaper than moving 10 MB
    assert choose_worker(slightly_busier, "auto", "w1", task_s=0.0001, nbytes=10_000_000) == "w1"
    assert move_cost_s(10_000_000) > move_cost_s(0)


def test_in_flight_counts_when_heartbeats_lag() -> None:
    beats = {
        "w1": {"last_heartbeat": "100", "queue_depth": "0", "running": "0"},
        "w2": {"last_heartbeat": "100", "queue_depth": "0", "running": "0"},
    }
    loads = read_workers(beats, {"w1": 3}, dead_after_s=6, now=101)
    assert (
        choose_worker(loads, "transfer", None, task_s=0.1, nbytes=0, rng=random.Random(1)) == "w2"
    )


def test_stale_or_malformed_heartbeats_read_as_dead() -> None:
    beats = {"old": {"last_heartbeat": "10"}, "bad": {"last_heartbeat": "soon"}}
    loads = {w.worker_id: w for w in read_workers(beats, {}, dead_after_s=6, now=100)}
    assert not loads["old"].alive and not loads["bad"].alive
