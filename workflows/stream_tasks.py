"""Streaming example tasks (``docs/streaming.md``): a source of numbers, a stage that doubles
each one, and a sink that adds them up, each a long-running step passing items over channels.

The bundled ``stream_numbers`` definition (``workflows.definitions``) wires them::

    count --numbers--> double --doubled--> total

Each takes its channels' names from its step's ``params`` (``to``, ``from``) when given.
"""

from __future__ import annotations

from typing import Any

from workflows.api import TaskContext, task
from workflows.errors import InvalidData

__all__ = ["stream_count", "stream_double", "stream_total"]


def _count_param(ctx: TaskContext, name: str, default: int) -> int:
    value = ctx.params.get(name, ctx.input.get(name, default))
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidData(f"{name} must be a non-negative integer, got {value!r}")
    return value


@task(name="stream_count", timeout_s=600, needs_image=False)
def stream_count(img: None, ctx: TaskContext) -> dict[str, Any]:
    """Publish 1, 2, … ``input.data.count`` (default 100) on channel ``params.to`` (default
    ``numbers``), pausing ``input.data.pause_ms`` (default 0) after each."""
    count = _count_param(ctx, "count", 100)
    pause = _count_param(ctx, "pause_ms", 0) / 1000.0
    out = ctx.channels.publish(ctx.params.get("to", "numbers"))
    for number in range(1, count + 1):
        out.send(number)
        if pause and ctx.cancelled.wait(pause):
            break  # stopped: the worker ends the stream as broken
    return {"sent": count}


@task(name="stream_double", timeout_s=600, needs_image=False)
def stream_double(img: None, ctx: TaskContext) -> dict[str, Any]:
    """Publish twice each item of ``params.from`` (default ``numbers``) on ``params.to``
    (default ``doubled``)."""
    out = ctx.channels.publish(ctx.params.get("to", "doubled"))
    seen = 0
    for number in ctx.channels.subscribe(ctx.params.get("from", "numbers")):
        out.send(number * 2)
        seen += 1
    return {"doubled": seen}


@task(name="stream_total", timeout_s=600, needs_image=False)
def stream_total(img: None, ctx: TaskContext) -> dict[str, Any]:
    """The sum and count of the items of ``params.from`` (default ``doubled``)."""
    total = count = 0
    for number in ctx.channels.subscribe(ctx.params.get("from", "doubled")):
        total += number
        count += 1
    return {"total": total, "count": count}
