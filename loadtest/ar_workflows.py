"""``cdiflow bench ar-workflows``: the AR application as workflows, one task per frame
(``ar_video``) against streaming steps (``ar_video_stream``), on the same stack.

One stack of ``--workers`` workers with ``--slots`` slots each runs both, one run at a time,
alternating for ``--rounds`` rounds on the same generated video (``--frames`` frames,
``DEFAULT_SIZE``, as ``cdiflow bench ar`` makes it). ``ar_video`` decodes the whole video, runs one
``detect`` step per frame over every slot, and combines; ``ar_video_stream`` runs decode, one
detect step per slot left (``workers x slots - 2``) and combine at once, the frames flowing
over channels. A row per system (its median round by fps): ``fps`` is frames over the run's
time from its start to its end as the API records them (``wall_s``). ``stream_over_ar_video``
is the streaming row's fps over the other's. A warm-up run of each, on a few frames, comes
first (the workers load OpenCV's model once) and is not counted.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Final

import boto3
import click

from loadtest.cdiflow_api import connect, ensure_definition, stamp
from loadtest.cli import one_run_per_folder, terminated_by_signal
from loadtest.runner import machine_state
from orchestrator.child_process import free_port
from orchestrator.stack import Stack
from orchestrator.stack.defaults import WORKER_COMMAND
from workflows.ar.sample import DEFAULT_SIZE
from workflows.definitions import ar_stream_definition

__all__ = ["ar_workflows_table", "bench_ar_workflows_command", "measure_ar_workflows"]

SYSTEMS: Final = ("ar_video", "ar_video_stream")
WARMUP_FRAMES: Final = 4
WAIT_S: Final = 1800.0


def _upload(stack: Stack, path: Path) -> str:
    services = stack.services
    s3: Any = boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.aws_region,
        aws_access_key_id=services.aws_access_key_id,
        aws_secret_access_key=services.aws_secret_access_key,
    )
    s3.put_object(Bucket=services.s3_bucket, Key="bench-ar/in.mp4", Body=path.read_bytes())
    return f"s3://{services.s3_bucket}/bench-ar/in.mp4"


def _one_run(api: Any, workflow: str, video: str, frames: int) -> dict[str, Any]:
    started = api.start(workflow, data={"video": video, "frames": frames}, policy="transfer")
    detail = api.wait(started.id, WAIT_S)
    body = detail.model_dump(mode="json")
    if body["status"] != "COMPLETED":
        why = f"{workflow}: run {started.id} ended {body['status']}: {body['error']}"
        raise click.ClickException(why)
    count = body["output"]["frame_count"]
    if count != frames:
        raise click.ClickException(f"{workflow}: {count} frames out of {frames}")
    wall_s = stamp(body["finished_at"]) - stamp(body["started_at"] or body["created_at"])
    return {"wall_s": round(wall_s, 3), "fps": round(frames / wall_s, 2)}


def measure_ar_workflows(
    data_dir: Path, *, frames: int, workers: int, slots: int, rounds: int
) -> dict[str, Any]:
    """Both systems on one stack; what ``cdiflow bench ar-workflows --json`` prints."""
    from apps.ar.bench import sample_for_bench  # the optional ``ar`` dependencies

    folder = data_dir.absolute()
    detectors = workers * slots - 2
    if detectors < 1:
        raise click.UsageError("ar_video_stream needs at least 3 slots: raise --workers or --slots")
    before = machine_state()
    video = sample_for_bench(folder, frames)
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    command = (*WORKER_COMMAND, "--concurrency", str(slots))
    with (
        Stack(folder / "stack", workers=workers, port=free_port(), worker_command=command) as stack,
        connect(stack.api_url, stack.api_key) as api,
    ):
        uri = _upload(stack, video)
        names = {
            "ar_video": "ar_video",
            "ar_video_stream": ensure_definition(
                api, ar_stream_definition(detectors, f"ar_video_stream_{detectors}")
            ),
        }
        for system in SYSTEMS:
            _one_run(api, names[system], uri, WARMUP_FRAMES)
        for _ in range(rounds):
            for system in SYSTEMS:
                runs[system].append(_one_run(api, names[system], uri, frames))
    rows = []
    for system, rounds_of in runs.items():
        ranked = sorted(rounds_of, key=lambda r: r["fps"])
        median = ranked[(len(ranked) - 1) // 2]
        rows.append({"system": system, **median, "rounds_fps": [r["fps"] for r in rounds_of]})
    by = {r["system"]: r for r in rows}
    return {
        "machine": {**before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "frames": frames,
        "width": DEFAULT_SIZE[0],
        "height": DEFAULT_SIZE[1],
        "workers": workers,
        "slots": slots,
        "detectors_stream": detectors,
        "rounds": rounds,
        "rows": rows,
        "stream_over_ar_video": round(by["ar_video_stream"]["fps"] / by["ar_video"]["fps"], 3),
    }


def ar_workflows_table(result: dict[str, Any]) -> str:
    lines = [
        f"AR as workflows: {result['frames']} frames of {result['width']}x{result['height']}, "
        f"{result['workers']} workers x {result['slots']} slots; ar_video_stream with "
        f"{result['detectors_stream']} detect steps",
        f"  {'system':<17}{'fps':>8}{'wall s':>9}  rounds (fps)",
    ]
    for r in result["rows"]:
        rounds = ", ".join(f"{fps:.2f}" for fps in r["rounds_fps"])
        lines.append(f"  {r['system']:<17}{r['fps']:>8.2f}{r['wall_s']:>9.2f}  {rounds}")
    lines.append(f"  ar_video_stream / ar_video fps: {result['stream_over_ar_video']:.2f}x")
    return "\n".join(lines)


@click.command("ar-workflows")
@click.option("--frames", default=150, show_default=True, type=click.IntRange(5, 500),
              help="Frames of the generated video (ar_video takes at most 500).")  # fmt: skip
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 32))
@click.option("--slots", default=2, show_default=True, type=click.IntRange(1, 32),
              help="Each worker's slots (--concurrency).")  # fmt: skip
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 10),
              help="Rounds, the systems alternating; the median round is reported.")  # fmt: skip
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".data/bench-ar-workflows"),
    show_default=True,
    help="Folder for the stack and the video (a run of its own).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_ar_workflows_command(
    frames: int, workers: int, slots: int, rounds: int, data_dir: Path, as_json: bool
) -> None:
    """The AR workflow one task per frame (ar_video) against its streaming variant
    (ar_video_stream) on the same workers: fps of each, side by side."""
    signal.signal(signal.SIGTERM, terminated_by_signal)  # unwind: stop what was started
    began = time.monotonic()
    with one_run_per_folder(data_dir):
        result = measure_ar_workflows(
            data_dir, frames=frames, workers=workers, slots=slots, rounds=rounds
        )
    result["bench_s"] = round(time.monotonic() - began, 1)
    click.echo(json.dumps(result, indent=1) if as_json else ar_workflows_table(result))
