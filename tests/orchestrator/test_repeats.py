"""A worker's memory of the instructions it ran (``orchestrator.worker.repeats``)."""

from __future__ import annotations

from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import DataPlane, TaskRunStatus
from orchestrator.worker.repeats import RUNNING, Repeats


def _ins(task_run_id: int, attempt: int = 1) -> Instruction:
    return Instruction(task_run_id, "wf", "step", "noop", attempt, 5.0, "replies", DataPlane.NONE)


def test_a_repeat_is_told_apart_while_running_and_once_finished() -> None:
    repeats = Repeats(keep=2)
    assert repeats.begin(_ins(7)) is None  # new: run it
    assert repeats.begin(_ins(7)) == RUNNING
    assert repeats.begin(_ins(7, attempt=2)) is None  # another attempt is another run
    report = Report(7, "wf", "w", TaskRunStatus.COMPLETED, 1.0, 2.0)
    repeats.finish(_ins(7), report)
    assert repeats.begin(_ins(7)) == report
    assert repeats.begin(_ins(0)) is None and repeats.begin(_ins(0)) is None  # release no-ops
    repeats.begin(_ins(8))
    assert repeats.begin(_ins(7)) is None  # forgotten: only the newest two are kept
