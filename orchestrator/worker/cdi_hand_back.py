"""The end of a ``cdi`` instruction (``cdi_plane``): the objects the step leaves (the object that
holds the workflow's image now, and the named outputs it wrote) are kept by this worker,
handed on to the next step's worker (``hand_to``), or handed back to the instruction's
``return_to``, and the report says which (``kept``, ``handed_to``; one that could not go on is
among ``returned``).

A hand-on is one ownership transfer from this worker to the next one; the object keeps the
scheduler as its recovery container (set when it was made), so if the next worker dies holding
it, it goes back to the scheduler. If that worker is gone already (``UnknownContainer``), the
object goes back to ``return_to`` as after a failed task.
"""

from __future__ import annotations

import logging
import time

import cdi
from cdi import ObjectKey
from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.worker.execution import EXIT_MINION_LOST, Execution

__all__ = ["hand_outputs", "keep_or_hand_back"]

log = logging.getLogger(__name__)


def keep_or_hand_back(ins: Instruction, obj: cdi.CDIObject | None, exe: Execution) -> None:
    """Keep the current object, hand it on to ``hand_to`` or back to ``return_to``; record
    which in ``exe`` (after ``hand_outputs``, whose record it keeps)."""
    if exe.stored:
        # The result is in S3 and the object destroyed: nothing to hand back.
        exe.key = ObjectKey("")
        return
    if obj is None:
        # A fetch that failed made no object: the retry fetches again.
        exe.key = ObjectKey("") if ins.input_uri else ins.key
        if exe.key and (exe.handed_to or exe.kept):
            exe.returned.append(exe.key)  # gone: not among the named outputs kept or on
        return
    exe.key = obj.key
    # A worker about to exit gives everything back: what it kept would die with it. A
    # failed task gives it back too, so the scheduler can retry elsewhere or clean up.
    done = _done(exe)
    if ins.keep and done:
        exe.kept = True
        return
    if ins.hand_to and done:
        if _hand_on(ins.hand_to, obj, exe):
            return
        if exe.handed_to:
            exe.returned.append(obj.key)  # the named outputs went on without it
    if not ins.return_to:
        exe.kept = True
        exe.note(f"the instruction names no return_to, so this worker keeps {obj.key!r}")
        return
    started = time.perf_counter_ns()
    try:
        try:
            obj.transfer(ins.return_to)
        except cdi.BufferInUse:
            if not exe.exit_code:
                raise
            # A task thread that would not stop still reads the input, and this worker
            # is about to exit: leave it the mapping and hand the object back now.
            obj.transfer(ins.return_to, detach=True)
        exe.return_us = (time.perf_counter_ns() - started) / 1000
    except cdi.NotOwner:
        log.warning("%r is not ours to hand back to %s", obj.key, ins.return_to)
    except cdi.ObjectNotFound:
        log.warning("%r vanished before it could be handed back", obj.key)
    except cdi.MinionUnavailable as exc:
        exe.fail(exc)  # the object died with the minion: the task must run again
        exe.exit_code = EXIT_MINION_LOST
    except cdi.CDIError as exc:
        # E.g. return_to is not registered (a scheduler restarting): it stays with us.
        exe.kept = True
        exe.note(f"could not hand {obj.key!r} back to {ins.return_to!r}: {exc}")


def hand_outputs(ins: Instruction, made: list[cdi.CDIObject], exe: Execution) -> None:
    """The named outputs the task wrote, where its image goes: kept (``keep``), handed on
    (``hand_to``; one that does not go on goes back, among ``returned``), or handed back to
    ``return_to``."""
    if not made:
        return
    done = _done(exe)
    if ins.keep and done:
        exe.kept = True
        return
    for obj in made:
        if ins.hand_to and done and _hand_on(ins.hand_to, obj, exe):
            continue
        if not ins.return_to:
            continue
        try:
            obj.transfer(ins.return_to)
        except cdi.CDIError as exc:
            exe.note(f"could not hand output {obj.key!r} back to {ins.return_to!r}: {exc}")
        if ins.hand_to and done:
            exe.returned.append(obj.key)


def _done(exe: Execution) -> bool:
    """The task completed and this worker goes on: what it made may stay or go on."""
    return not exe.exit_code and exe.status == TaskRunStatus.COMPLETED


def _hand_on(to: str, obj: cdi.CDIObject, exe: Execution) -> bool:
    """Transfer ``obj`` to the next step's worker ``to``; False when it did not go (that
    worker is gone, or the transfer failed otherwise): it is then handed back."""
    started = time.perf_counter_ns()
    try:
        obj.transfer(to)
    except cdi.UnknownContainer:
        log.info("the next step's worker %s is gone; handing %r back", to, obj.key)
        return False
    except cdi.CDIError as exc:
        log.warning("could not hand %r on to %s (%s); handing it back", obj.key, to, exc)
        return False
    exe.return_us += (time.perf_counter_ns() - started) / 1000
    exe.handed_to = to
    return True
