"""``cdiflow bench cache``: the per-host input cache against the same stack without it.

``--inputs`` distinct photo-like JPEGs of ``--size`` each are read by ``--per-input`` workflows
each (one ``--task`` and the result stored, under ``affinity``), all started at once on one
host with ``--workers`` workers; with ``CDIFLOW_INPUT_CACHE=1`` (``cache``) and without
(``no-cache``), each on a fresh stack over the same services, alternating for ``--rounds``
rounds. A row per system (the median round by throughput): workflows a second from the first
start to the last end (``throughput_wps``) and the input bytes the workers GET from S3 meanwhile
(``s3_bytes_fetched``, from their ``cdiflow_worker_input_s3_bytes`` counters), beside
``distinct_input_bytes``. Every run must end COMPLETED. A warm-up workflow on an input of its
own runs first on each stack and is not counted.

*The task:* the cache spares a workflow its GET and decode (about 40 ms at 2 MB) and costs it a
HEAD and a copy (about 10 ms), so what it gains in throughput depends on what else the workflow
does: ``classify`` (8 ms) leaves the fetch a large share, ``deblur`` (200 ms) a small one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import click
import httpx

from loadtest.cdiflow_api import connect, ensure_definition, start, wait_all
from loadtest.cli import one_run_per_folder, parse_sizes, terminated_by_signal
from loadtest.images import CHAIN_OPS, make_jpeg
from loadtest.runner import machine_state
from loadtest.systems.services import BenchServices
from orchestrator.child_process import free_port
from orchestrator.services import RunningServices
from orchestrator.stack import Stack

__all__ = ["bench_cache_command", "measure_cache"]

SYSTEMS = ("no-cache", "cache")
_SAMPLE = re.compile(r"^(cdiflow_worker_input_\w+?)(?:_total)? ([0-9.e+]+)$", re.M)


def _input_figures(stack: Stack) -> dict[str, float]:
    total: dict[str, float] = {}
    for url in stack.worker_metrics.values():
        for name, value in _SAMPLE.findall(httpx.get(url, timeout=10).text):
            total[name] = total.get(name, 0.0) + float(value)
    return total


def _upload(services: RunningServices, inputs: dict[str, bytes]) -> dict[str, str]:
    s3: Any = boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.aws_region,
        aws_access_key_id=services.aws_access_key_id,
        aws_secret_access_key=services.aws_secret_access_key,
    )
    uris = {}
    for name, data in inputs.items():
        s3.put_object(Bucket=services.s3_bucket, Key=f"bench-cache/{name}", Body=data)
        uris[name] = f"s3://{services.s3_bucket}/bench-cache/{name}"
    return uris


def _run_system(
    system: str,
    shared: BenchServices,
    folder: Path,
    uris: list[str],
    warmup: str,
    *,
    per_input: int,
    workers: int,
    task: str,
    budget_mib: int,
    label: str,
) -> dict[str, Any]:
    env = {"CDIFLOW_INPUT_CACHE": "1" if system == "cache" else "0",
           "CDIFLOW_INPUT_CACHE_MIB": str(budget_mib)}  # fmt: skip
    with (
        mock.patch.dict(os.environ, env),  # the stack's processes inherit it
        Stack(
            folder / f"stack-{label}",
            workers=workers,
            port=free_port(),
            services=shared.for_system(label.replace("-", "_")),
        ) as stack,
        connect(stack.api_url, stack.api_key) as api,
    ):
        workflow = ensure_definition(api, {
            "name": f"bench_cache_{task}",
            "description": f"{task} on the input, result stored (cdiflow bench cache)",
            "tasks": [{"ref": task, "task": task}],
        })  # fmt: skip
        warm = wait_all(api, [str(start(api, workflow, warmup, "affinity").id)])
        before = _input_figures(stack)
        order = [uris[i % len(uris)] for i in range(per_input * len(uris))]
        began = time.perf_counter()
        ids = [str(start(api, workflow, uri, "affinity").id) for uri in order]
        done = wait_all(api, ids)
        wall_s = time.perf_counter() - began
        after = _input_figures(stack)
    failed = [d.id for d in [*warm.values(), *done.values()] if d.status != "COMPLETED"]
    if failed:
        raise click.ClickException(f"{system}: {len(failed)} workflows did not complete: {failed}")

    def grew(name: str) -> int:
        return round(after.get(name, 0.0) - before.get(name, 0.0))

    return {
        "system": system,
        "workflows": len(ids),
        "wall_s": round(wall_s, 3),
        "throughput_wps": round(len(ids) / wall_s, 3),
        "s3_bytes_fetched": grew("cdiflow_worker_input_s3_bytes"),
        "cache_hits": grew("cdiflow_worker_input_cache_hits"),
        "cache_misses": grew("cdiflow_worker_input_cache_misses"),
    }


def measure_cache(
    data_dir: Path,
    *,
    size: int,
    inputs: int,
    per_input: int,
    workers: int,
    task: str,
    budget_mib: int,
    rounds: int,
    services: RunningServices | None = None,
    redis_db: int = 1,
) -> dict[str, Any]:
    """Both systems on the same inputs; the result ``cdiflow bench cache --json`` prints.
    ``services``: running ones to use (tests), the stacks taking Redis databases from
    ``redis_db``."""
    folder = data_dir.absolute()
    before = machine_state()
    images = {f"input-{i}.jpg": make_jpeg(size, seed=20240601 + i) for i in range(inputs)}
    images["warmup.jpg"] = make_jpeg(size, seed=20240600)
    distinct = sum(len(images[f"input-{i}.jpg"]) for i in range(inputs))
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    with BenchServices(folder / "services", given=services, first_redis_db=redis_db) as shared:
        uris = _upload(shared.running, images)
        warmup = uris.pop("warmup.jpg")
        for round_ in range(rounds):
            for system in SYSTEMS:
                runs[system].append(_run_system(
                    system, shared, folder, list(uris.values()), warmup, per_input=per_input,
                    workers=workers, task=task, budget_mib=budget_mib,
                    label=f"{system}-{round_ + 1}"))  # fmt: skip
    rows = []
    for rounds_of in runs.values():
        ranked = sorted(rounds_of, key=lambda r: r["throughput_wps"])
        median = ranked[(len(ranked) - 1) // 2]
        rows.append({**median, "rounds_wps": [r["throughput_wps"] for r in rounds_of]})
    by = {r["system"]: r for r in rows}
    return {
        "machine": {**before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "size": size,
        "inputs": inputs,
        "per_input": per_input,
        "workers": workers,
        "task": task,
        "rounds": rounds,
        "distinct_input_bytes": distinct,
        "rows": rows,
        "s3_bytes_over_distinct": round(by["cache"]["s3_bytes_fetched"] / distinct, 3),
        "throughput_ratio": round(
            by["cache"]["throughput_wps"] / by["no-cache"]["throughput_wps"], 3
        ),
    }


def cache_table(result: dict[str, Any]) -> str:
    lines = [
        f"input cache: {result['inputs']} inputs of {result['size']:,} B, "
        f"{result['per_input']} workflows each ({result['task']}, affinity), "
        f"{result['workers']} workers on one host; distinct inputs "
        f"{result['distinct_input_bytes']:,} B",
        f"  {'system':<10}{'workflows/s':>12}{'S3 bytes fetched':>18}{'x distinct':>11}"
        f"{'hits':>6}{'misses':>7}",
    ]
    for r in result["rows"]:
        ratio = r["s3_bytes_fetched"] / result["distinct_input_bytes"]
        lines.append(
            f"  {r['system']:<10}{r['throughput_wps']:>12.2f}{r['s3_bytes_fetched']:>18,}"
            f"{ratio:>11.2f}{r['cache_hits']:>6}{r['cache_misses']:>7}"
        )
    lines.append(
        f"  cache / no-cache throughput: {result['throughput_ratio']:.2f}x; S3 bytes "
        f"{result['s3_bytes_over_distinct']:.2f}x the distinct inputs"
    )
    return "\n".join(lines)


@click.command("cache")
@click.option("--size", default="2MB", show_default=True, help="Each input's JPEG size.")
@click.option("--inputs", default=3, show_default=True, type=click.IntRange(1, 100),
              help="Distinct inputs.")  # fmt: skip
@click.option("--per-input", default=10, show_default=True, type=click.IntRange(1, 1000),
              help="Workflows reading each input.")  # fmt: skip
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--task", default="classify", show_default=True, type=click.Choice(CHAIN_OPS),
              help="The workflow's one task.")  # fmt: skip
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 10),
              help="Rounds, the systems alternating; the median round is reported.")  # fmt: skip
@click.option("--budget-mib", default=1024, show_default=True, type=click.IntRange(1, 1 << 20),
              help="The cache's budget (CDIFLOW_INPUT_CACHE_MIB).")  # fmt: skip
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".data/bench-cache"),
    show_default=True,
    help="Folder for the services and stacks (a run of its own).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_cache_command(
    size: str,
    inputs: int,
    per_input: int,
    workers: int,
    task: str,
    rounds: int,
    budget_mib: int,
    data_dir: Path,
    as_json: bool,
) -> None:
    """The input cache: workflows a second and S3 bytes fetched, with and without it."""
    signal.signal(signal.SIGTERM, terminated_by_signal)  # unwind: stop what was started
    (nbytes,) = parse_sizes(size)
    with one_run_per_folder(data_dir):
        result = measure_cache(data_dir, size=nbytes, inputs=inputs, per_input=per_input,
                               workers=workers, task=task, budget_mib=budget_mib,
                               rounds=rounds)  # fmt: skip
    click.echo(json.dumps(result, indent=1) if as_json else cache_table(result))
