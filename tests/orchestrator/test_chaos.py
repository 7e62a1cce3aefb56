"""The chaos suite's short version: on one real stack under load, each fault that used to leave
workflows stuck, struck for real (SIGKILL by PID, FLUSHALL). Every workflow must end completed
with the right pixels or failed with a reason, none lost, no object left in the minion, and a
workflow started after the fault must complete. ``cdiflow bench chaos`` runs the whole
catalogue, 60 workflows a case, embedded and against external services."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadtest.chaos.faults import FAULTS, QUICK_FAULTS, Fault, Target
from loadtest.chaos.run import chaos_stack, run_case

WORKFLOWS = 12  # a case: some in flight on each policy when the fault strikes


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with chaos_stack() as running:
        yield running


@pytest.mark.parametrize(
    "fault", [f for f in FAULTS if f.name in QUICK_FAULTS], ids=lambda f: str(f.name)
)
def test_every_workflow_ends_right_after(target: Target, fault: Fault[Target]) -> None:
    result = run_case(target, fault, workflows=WORKFLOWS, deadline_s=120.0)
    assert result.passed, result.as_dict()
    assert result.completed + result.failed == result.workflows + result.probes
