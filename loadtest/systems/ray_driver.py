"""The Ray peer's load driver: one child process, one Ray job, for every point.

    python -m loadtest.systems.ray_driver ADDRESS     # then one TARGET.json path a line

For each point it runs the closed loop (``concurrency`` workflows in flight, each user
``rounds`` of them, images drawn as locust users draw them) and writes one
``WorkflowRecord`` JSON line per workflow to the target's ``records`` file. A child process
so the benchmark never imports Ray nor becomes a Ray driver itself.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import ray

from loadtest.images import chain_ops
from loadtest.plan import Target
from loadtest.stats import WorkflowRecord
from loadtest.systems.ray_tasks import submit_chain

__all__ = ["main", "run_point"]


def run_point(target: Target) -> None:
    """The closed loop of one point; records are appended as workflows end."""
    ops = chain_ops(target.tasks)
    users = [random.Random(target.seed * 100_003 + i) for i in range(target.concurrency)]
    left = {i: target.rounds for i in range(target.concurrency)}
    in_flight: dict[ray.ObjectRef[dict[str, Any]], tuple[int, int, float]] = {}
    with open(target.records, "a") as out:

        def submit(user: int) -> None:
            left[user] -= 1
            uri, size = users[user].choice(target.images)
            submitted = time.time()
            in_flight[submit_chain(ops, uri)] = (user, size, submitted)

        def record(ref: ray.ObjectRef[dict[str, Any]], status: str, error: str = "") -> None:
            user, size, submitted = in_flight.pop(ref)
            stored: float | None = None
            ops_cpu_ms: float | None = None
            if status == "COMPLETED":
                try:
                    value = ray.get(ref)
                    stored, ops_cpu_ms = float(value["stored_at"]), float(value["ops_cpu_ms"])
                except Exception as exc:
                    status, error = "FAILED", f"{type(exc).__name__}: {exc}"
            rec = WorkflowRecord(
                "ray", size, target.tasks, submitted, stored, status, error, ops_cpu_ms
            )
            out.write(json.dumps(rec.as_dict()) + "\n")
            out.flush()
            if left[user] > 0:
                submit(user)

        for user in range(target.concurrency):
            submit(user)
        while in_flight:
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in done:
                record(ref, "COMPLETED")
            now = time.time()
            for ref, (_, _, submitted) in list(in_flight.items()):
                if now - submitted > target.timeout_s:
                    ray.cancel(ref, force=True)
                    record(ref, "TIMEOUT", f"not finished after {target.timeout_s:g} s")


def main(argv: list[str]) -> int:
    """Connect once, then run each target file named on stdin, answering ``done`` on
    stdout: one Ray job for every point, so its workers (and their imports) are warm."""
    (address,) = argv
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
    try:
        for line in sys.stdin:
            run_point(Target.read(Path(line.strip())))
            print("done", flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
