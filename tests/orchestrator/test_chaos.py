"""The chaos suite's short version, on one real stack under load: each fault that used to leave
workflows stuck, and Postgres killed inside a scheduler turn's transaction, struck for real
(SIGKILL by PID, FLUSHALL); then a burst of starts at once and a short soak. Every workflow must
end completed with the right pixels or failed with a reason, none lost, no object left in the
minion, and a workflow started after the fault must complete. With fork/join graphs in flight
under ``transfer`` and ``auto`` (a join's inputs go straight to the join's worker, which holds
them ahead of the join), the worker holding such an input is killed, and so is the scheduler
while one is held (``join_faults.py``).
``cdiflow bench chaos`` runs the whole catalogue, 60 workflows a case, embedded and against
external services, a burst of 5,000 and an hour's soak; the faults that last (an S3 outage, a
full disk, a partition between hosts) have short versions of their own in
``test_chaos_held.py`` and ``tests/multihost/test_chaos_hosts.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadtest.chaos.burst import run_burst
from loadtest.chaos.faults import FAULTS, QUICK_FAULTS, QUICK_GRAPH_FAULTS, Fault, Target
from loadtest.chaos.run import chaos_stack, run_case
from loadtest.chaos.sampling import pieces_of
from loadtest.chaos.soak import run_soak
from tests.orchestrator.chaos_support import passed

WORKFLOWS = 12  # a case: some in flight on each policy when the fault strikes
GRAPHS = 8  # a graph case: some in flight on each of its two policies


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with chaos_stack() as running:
        yield running


@pytest.mark.parametrize(
    "fault", [f for f in FAULTS if f.name in QUICK_FAULTS], ids=lambda f: str(f.name)
)
def test_every_workflow_ends_right_after(target: Target, fault: Fault[Target]) -> None:
    result = run_case(target, fault, workflows=WORKFLOWS, deadline_s=120.0)
    assert passed(result), result.as_dict()
    assert result.completed + result.failed == result.workflows + result.probes + result.fed
    if fault.name == "minion":
        # Its objects outlive it (docs/minion-restart.md): no workflow starts over.
        assert result.rerun_from_input == 0, result.as_dict()


@pytest.mark.parametrize(
    "fault", [f for f in FAULTS if f.name in QUICK_GRAPH_FAULTS], ids=lambda f: str(f.name)
)
def test_every_graph_ends_right_after(target: Target, fault: Fault[Target]) -> None:
    """Struck once a worker holds a join's input ahead of the join: killed, the input comes
    back to the scheduler (``scheduler/ahead.py``); the scheduler killed, its successor finds
    where each held input is. Every graph ends with the reference's pixels and label."""
    result = run_case(target, fault, workflows=GRAPHS, deadline_s=120.0, workload="graph")
    assert passed(result), result.as_dict()
    assert result.completed + result.failed == result.workflows + result.probes + result.fed


def test_a_burst_is_taken_without_a_5xx_and_every_run_completes(target: Target) -> None:
    """100 starts from 50 connections at once: where the API is full it answers 429 and the
    client sends the start again after its Retry-After; no 5xx; each taken once (the 429 itself:
    test_api_back_pressure.py)."""
    result = run_burst(target, workflows=100, clients=50, deadline_s=600.0)
    assert passed(result), result.as_dict()
    assert result.server_errors == 0, result.answers
    assert result.answers.get("201") == 100, result.answers
    assert result.completed == 100


def test_a_soak_samples_every_piece_and_every_run_ends_right(target: Target) -> None:
    """The machinery of the hour's soak, for a few seconds: the peak, the steady load, a
    sample of every piece. Whether memory stays flat is the benchmark's to judge (over half an
    hour; this is all warm-up)."""
    result = run_soak(target, duration_s=12.0, peak_s=6.0, inflight=16, sample_every_s=1.5)
    assert (result.stuck, result.lost, result.wrong, result.leaked_objects) == (0, 0, 0, 0)
    assert result.completed + result.failed == result.workflows and not result.problems
    assert result.peak_wps > 0
    # Read from the runs' own end times: some finished during the steady load, and no more
    # were behind at its end than were started in it.
    assert 0 < result.completed_wps * result.duration_s <= result.workflows
    assert 0 <= result.behind_at_end <= result.workflows
    expected = {f"{kind}:{piece}" for piece in pieces_of(target.stack) for kind in ("rss", "fds")}
    assert expected | {"postgres_bytes", "redis_bytes"} <= set(result.growth)
    assert len(result.samples) >= 5
