"""One Temporal worker process: the ``BenchChain`` workflow and its ``image_step`` activity.

    python -m loadtest.systems.temporal_worker ADDRESS    # TemporalSystem starts ``workers``

Shaped as Temporal's Python SDK documentation advises for CPU-bound synchronous activities:
scale by worker *processes*, each running its activities in a thread pool, here of one thread
(``max_concurrent_activities=1``), so ``workers`` processes run as many operations at once as
cdiflow's workers and Celery's pool do. Workflow tasks run on the same processes' event
loops. Prints ``ready`` once polling.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from loadtest.systems.temporal_app import TASK_QUEUE, BenchChain, image_step

__all__ = ["main"]


async def _serve(address: str) -> None:
    client = await Client.connect(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with ThreadPoolExecutor(1) as pool:
        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[BenchChain],
            activities=[image_step],
            activity_executor=pool,
            max_concurrent_activities=1,
            # The harness's package resolves paths on import, which the sandbox forbids; the
            # workflow itself only awaits its activities in turn (deterministic).
            workflow_runner=SandboxedWorkflowRunner(
                restrictions=SandboxRestrictions.default.with_passthrough_modules("loadtest")
            ),
        )
        async with worker:
            print("ready", flush=True)
            await stop.wait()


def main(argv: list[str]) -> int:
    (address,) = argv
    asyncio.run(_serve(address))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
