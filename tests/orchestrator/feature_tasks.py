"""Tasks for the end-to-end tests of priorities, limits and pausing (workers load it with
``--tasks``): ``hold`` sleeps and keeps, in a file its workers share, how many runs of it
were running at once at most."""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workflows.api import TaskContext, task


@contextmanager
def _counted(record: Path) -> Iterator[None]:
    """Count this run in ``record`` ({"now", "most"}) while it lasts, under a file lock (the
    runs are in several worker processes)."""

    def change(by: int) -> None:
        with open(record.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            seen: dict[str, Any] = json.loads(record.read_text()) if record.exists() else {}
            now = int(seen.get("now", 0)) + by
            most = max(int(seen.get("most", 0)), now)
            record.write_text(json.dumps({"now": now, "most": most}))

    change(+1)
    try:
        yield
    finally:
        change(-1)


@task(name="hold", timeout_s=30, needs_image=False)
def hold(img: None, ctx: TaskContext) -> dict[str, Any]:
    """Sleep ``params.s`` seconds, counted in ``input.record`` when given."""
    seconds = float(ctx.params.get("s", 0.2))
    record = ctx.input.get("record")
    if not record:
        time.sleep(seconds)
    else:
        with _counted(Path(str(record))):
            time.sleep(seconds)
    return {"held_s": seconds}
