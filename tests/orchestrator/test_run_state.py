"""The scheduler's bookkeeping of images a worker holds instead of writing them."""

from __future__ import annotations

import uuid

from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.scheduler.runs import RunState, StepSpec


def _run(*refs: str) -> RunState:
    steps = [StepSpec(ref, ref, f"m:{ref}", 30.0, 2, 0.1) for ref in refs]
    return RunState(uuid.uuid4(), Policy.AFFINITY, DataPlane.CDI, steps, "s3://b/in.jpg")


def _complete(run: RunState, task_run_id: int, *, held: bool) -> None:
    """The current step was placed and completed; the next one becomes current."""
    run.attempts[run.current.ref] = run.attempt
    assert not run.follow_held(task_run_id, held=held, lost=False)
    run.advance()


def test_a_chain_of_held_images_remembers_where_it_started() -> None:
    run = _run("a", "b", "c", "d")
    _complete(run, 1, held=False)  # a's image was written: nothing to recompute before b
    _complete(run, 2, held=True)
    _complete(run, 3, held=True)
    assert (run.held, run.held_from, run.step) == ("3", 1, 3)


def test_a_written_image_ends_the_chain() -> None:
    run = _run("a", "b", "c")
    _complete(run, 1, held=True)
    _complete(run, 2, held=False)
    assert run.held == ""
    assert not run.follow_held(3, held=False, lost=True)  # nothing held: nothing to recompute
    assert run.step == 2


def test_a_lost_held_image_rewinds_to_its_first_step_at_its_last_attempt() -> None:
    run = _run("a", "b", "c", "d")
    _complete(run, 1, held=False)
    _complete(run, 2, held=True)  # b, attempt 1
    _complete(run, 3, held=True)  # c
    run.attempts[run.current.ref] = run.attempt  # d placed
    assert run.follow_held(4, held=False, lost=True)
    assert (run.current.ref, run.attempt, run.held) == ("b", 1, "")
    # The retry that follows is b's attempt 2; c runs again as its attempt 2.
    run.attempt += 1
    _complete(run, 5, held=True)
    assert (run.current.ref, run.attempt, run.held_from) == ("c", 2, 1)
