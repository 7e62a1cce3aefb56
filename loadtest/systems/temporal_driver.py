"""The Temporal peer's load driver: one child process, one client, for every point.

    python -m loadtest.systems.temporal_driver ADDRESS   # then one TARGET.json path a line

For each point it runs the closed or open loop (``loadtest.arrivals``), starting each
workflow with ``Client.start_workflow`` and learning of its end from ``handle.result()``
(a long poll of the workflow's history: no polling), and appends one ``WorkflowRecord`` JSON
line per workflow to the target's ``records`` file; then it answers ``done {}``
(``loadtest.systems.driver_proc``). asyncio, not locust: the SDK is asyncio's.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import IO

from temporalio.client import Client

from loadtest.arrivals import Arrivals
from loadtest.images import chain_ops
from loadtest.plan import Target
from loadtest.stats import WorkflowRecord
from loadtest.systems.temporal_app import TASK_QUEUE, WORKFLOW, ChainInput

__all__ = ["main", "run_point"]


async def _one(client: Client, target: Target, rng: random.Random, out: IO[str]) -> None:
    uri, size = rng.choice(target.images)
    workflow_id = uuid.uuid4().hex
    args = ChainInput(uri, chain_ops(target.tasks), workflow_id, target.intermediate)
    submitted = time.time()
    stored: float | None = None
    ops_cpu_ms: float | None = None
    status, error = "COMPLETED", ""
    try:
        handle = await client.start_workflow(WORKFLOW, args, id=workflow_id, task_queue=TASK_QUEUE)
        value = await asyncio.wait_for(handle.result(), target.timeout_s)
        stored, ops_cpu_ms = float(value["stored_at"]), float(value["ops_cpu_ms"])
    except TimeoutError:
        status, error = "TIMEOUT", f"not finished after {target.timeout_s:g} s"
    except Exception as exc:  # the workflow failed, or the server refused its start
        status, error = "FAILED", f"{type(exc).__name__}: {exc} {exc.__cause__ or ''}".strip()
    noticed = time.time() if status == "COMPLETED" else None
    record = WorkflowRecord(
        "temporal", size, target.tasks, submitted, stored, status, error, ops_cpu_ms, noticed
    )
    out.write(json.dumps(record.as_dict()) + "\n")
    out.flush()


async def run_point(client: Client, target: Target) -> None:
    arrivals = Arrivals(target.concurrency, target.rounds, target.arrival_rate, target.seed)
    with open(target.records, "a") as out:

        async def closed_user(user: int) -> None:
            await _one(client, target, arrivals.take(user), out)
            while arrivals.again(user):
                await _one(client, target, arrivals.take(user), out)

        if not arrivals.open_loop:
            await asyncio.gather(*(closed_user(u) for u in arrivals.initial()))
            return
        started: list[asyncio.Task[None]] = []
        while (due := arrivals.due_in()) is not None:
            if due > 0:
                await asyncio.sleep(due)
            rng = arrivals.take(0)  # counted now: the next start is due from this one
            started.append(asyncio.create_task(_one(client, target, rng, out)))
        await asyncio.gather(*started)


async def _serve(address: str) -> None:
    client = await Client.connect(address)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        await run_point(client, Target.read(Path(line.strip())))
        print("done {}", flush=True)


def main(argv: list[str]) -> int:
    (address,) = argv
    asyncio.run(_serve(address))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
