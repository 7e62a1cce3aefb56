"""The Python client end to end: define a workflow, run it on a photo, get the result.

    cdiflow up --detach                                # a stack on this machine
    python docs/examples/client_example.py photo.jpg   # or any JPEG/PNG of yours

The client finds the stack from its data folder (./.data, or $CDIFLOW_DATA_DIR), or takes
$CDIFLOW_API_URL and $CDIFLOW_API_KEY.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from cdiflow.client import AsyncClient, Client, WorkflowFailed


def main(photo: Path) -> None:
    with Client() as api:
        # A workflow definition: saved again unchanged, it stays at its version.
        flow = api.apply_definition(
            {
                "name": "sharpen_then_label",
                "description": "Sharpen the photo, then label it.",
                "tasks": [
                    {"ref": "sharpen", "task": "deblur"},
                    {"ref": "label", "task": "classify", "depends_on": ["sharpen"]},
                ],
            }
        )
        print(f"workflow {flow.name} is at version {flow.version}")

        # Upload the photo, start a run, wait for it (long polls), all in one call.
        try:
            run = api.run(flow.name, photo, policy="affinity", timeout=300)
        except WorkflowFailed as failed:
            sys.exit(f"the run failed: {failed.workflow.error}")
        assert run.output is not None
        print(f"run {run.id}: {run.status}, labelled {run.output['label']!r}")
        for task_run in run.task_runs:
            print(f"  {task_run.ref:<8} on {task_run.worker_id}, {task_run.run_ms:.1f} ms")

        out = photo.with_name(f"{photo.stem}-result.png")
        api.download_result(run.id, out)
        print(f"result saved to {out}")

    asyncio.run(follow_one_more(flow.name, photo))


async def follow_one_more(workflow: str, photo: Path) -> None:
    """The same from asyncio, printing each event as the run goes."""
    async with AsyncClient() as api:
        started = await api.start(workflow, photo, policy="transfer")
        async for event in api.events(started.id):
            print(f"  event {event.kind} {event.data.get('ref', '')}")
        done = await api.wait(started.id)
        print(f"async run {done.id}: {done.status}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/examples/client_example.py PHOTO")
    main(Path(sys.argv[1]))
