"""The Ray peer's load driver: one child process, one Ray job, for every point.

    python -m loadtest.systems.ray_driver ADDRESS     # then one TARGET.json path a line

For each point it runs the closed loop (``concurrency`` workflows in flight, each user
``rounds`` of them, images drawn as locust users draw them) or the open loop (``rounds``
workflows started at the target's ``arrival_rate``) and writes one ``WorkflowRecord`` JSON
line per workflow to the target's ``records`` file. It learns of each end from
``ray.wait`` (no polling). After the point it answers ``done`` and, on the same line, the JSON of
what the object store says of itself (``store_stats``). A child process so the benchmark never
imports Ray nor becomes a Ray driver itself.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import ray

from loadtest.arrivals import Arrivals
from loadtest.images import chain_ops
from loadtest.plan import Target
from loadtest.stats import WorkflowRecord
from loadtest.systems.ray_tasks import submit_chain

__all__ = ["main", "run_point"]


def run_point(target: Target) -> None:
    """One point; records are appended as workflows end."""
    ops = chain_ops(target.tasks)
    arrivals = Arrivals(target.concurrency, target.rounds, target.arrival_rate, target.seed)
    in_flight: dict[ray.ObjectRef[dict[str, Any]], tuple[int, int, float]] = {}
    with open(target.records, "a") as out:

        def submit(user: int) -> None:
            uri, size = arrivals.take(user).choice(target.images)
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
            noticed = time.time() if status == "COMPLETED" else None
            rec = WorkflowRecord(
                "ray", size, target.tasks, submitted, stored, status, error, ops_cpu_ms, noticed
            )
            out.write(json.dumps(rec.as_dict()) + "\n")
            out.flush()
            if arrivals.again(user):
                submit(user)

        def wait_some(due: float | None) -> None:
            # At most a second: workflows past their timeout are cancelled in between.
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=min(1.0, due or 1.0))
            for ref in done:
                record(ref, "COMPLETED")
            now = time.time()
            for ref, (_, _, submitted) in list(in_flight.items()):
                if now - submitted > target.timeout_s:
                    ray.cancel(ref, force=True)
                    record(ref, "TIMEOUT", f"not finished after {target.timeout_s:g} s")

        arrivals.drive(submit, lambda: bool(in_flight), wait_some)


def store_stats(address: str) -> dict[str, int]:
    """The object store's own counters, as ``ray memory --stats-only`` reads them (cumulative
    since the cluster started): bytes spilled to disk and restored, and bytes that did not
    fit and were allocated outside shared memory."""
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    state = get_state_from_address(address)  # type: ignore[no-untyped-call]
    stats = get_memory_info_reply(state).store_stats  # type: ignore[no-untyped-call]
    return {
        "spilled_bytes": int(stats.spilled_bytes_total),
        "restored_bytes": int(stats.restored_bytes_total),
        "fallback_bytes": int(stats.object_store_bytes_fallback),
        "store_capacity_bytes": int(stats.object_store_bytes_avail),
    }


def main(argv: list[str]) -> int:
    """Connect once, then run each target file named on stdin, answering ``done {stats}``
    on stdout: one Ray job for every point, so its workers (and their imports) are warm."""
    (address,) = argv
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
    try:
        for line in sys.stdin:
            run_point(Target.read(Path(line.strip())))
            print(f"done {json.dumps(store_stats(address))}", flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
