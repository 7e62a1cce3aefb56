"""Tracebacks of failed task calls: what the task's own code raised, written out for a person;
and letting go of what a failed call's frames hold.

An exception keeps its traceback, and the traceback keeps every frame's locals alive: a mapped
image, a decoder writing into shared memory, a view of a CDI object. While they live the object
stays exported, and a transfer, resize or destroy of it raises ``BufferInUse``. Whoever handles
such an error and must hand the memory on clears the frames first; the text of the traceback
(``task_traceback``) needs no locals, so it can be written before or after.
"""

from __future__ import annotations

import traceback
from types import FrameType, TracebackType

from workflows.errors import TaskFailed, TaskLoadError

__all__ = ["clear_frames", "from_callee", "stack_of", "task_traceback"]


def clear_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in ``exc``'s traceback and its causes'."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def from_callee(exc: BaseException) -> BaseException:
    """``exc`` with the caller's own frame cut from its traceback, so that it starts where the
    called code (a task function, a task module being imported) took over."""
    tb: TracebackType | None = exc.__traceback__
    return exc.with_traceback(tb.tb_next if tb is not None else None)


def task_traceback(exc: BaseException) -> str:
    """The traceback of what task code raised, as Python prints it (chained exceptions
    included), when ``exc`` is a task's failure (``TaskFailed``) or its module's import
    (``TaskLoadError``); "" for any other error, whose message says it all."""
    if not isinstance(exc, TaskFailed | TaskLoadError) or exc.__cause__ is None:
        return ""
    return "".join(traceback.format_exception(exc.__cause__))


def stack_of(frame: FrameType) -> str:
    """Where a running thread is (``frame``, from ``sys._current_frames()``), innermost call
    last, as a traceback prints it."""
    return "".join(traceback.format_stack(frame))
