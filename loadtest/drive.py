"""Run one point under locust, headless, in a child process; collect its workflow records.

A child process because locust patches the standard library for gevent on import, which
the benchmark's own process (supervising stacks, pools, a proxy) must not be subjected to.
Its periodic statistics table is the progress display; it goes to stderr so ``--json``
output stays clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Final

from cdi.child import ChildProcess
from loadtest import harness_env
from loadtest.plan import Target
from loadtest.stats import WorkflowRecord

__all__ = ["LOCUSTFILE", "read_records", "run_locust"]

LOCUSTFILE: Final = Path(__file__).with_name("locustfile.py")


def read_records(path: Path) -> list[WorkflowRecord]:
    if not path.exists():
        return []
    with path.open() as f:
        return [WorkflowRecord.from_dict(json.loads(line)) for line in f if line.strip()]


def run_locust(
    target: Target,
    folder: Path,
    *,
    time_limit_s: float,
    progress: IO[str] | None = None,
) -> list[WorkflowRecord]:
    """All ``target.concurrency * target.rounds`` records; the ones locust never wrote (it
    was stopped at ``time_limit_s``, or crashed) come back as ``MISSING``."""
    folder.mkdir(parents=True, exist_ok=True)
    target_file = folder / "target.json"
    records_file = Path(target.records)
    records_file.unlink(missing_ok=True)
    target.write(target_file)
    users = str(target.concurrency)
    argv = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-u",
        users,
        "-r",
        users,
        "--run-time",
        f"{int(time_limit_s)}s",
        "--stop-timeout",
        "5",
        "--target-file",
        str(target_file),
        "--loglevel",
        "WARNING",
        "--exit-code-on-error",
        "0",
        "--only-summary",
        "WorkflowUser",
    ]
    env = harness_env(os.environ) | {"PYTHONUNBUFFERED": "1"}
    out = progress if progress is not None else subprocess.DEVNULL
    locust = ChildProcess("locust", argv, stream=out, env=env).start()
    try:
        ended = locust.wait(time_limit_s + 60)
        status = locust.returncode if ended and locust.returncode is not None else -1
    finally:
        locust.stop(15.0)  # still there: by its PID, then its whole process group
    records = read_records(records_file)
    missing = target.concurrency * target.rounds - len(records)
    reason = f"locust exited with status {status} before this workflow was recorded"
    records += [
        WorkflowRecord(target.system, 0, target.tasks, 0.0, None, "MISSING", reason)
        for _ in range(max(0, missing))
    ]
    return records
