"""``cdiflow bench s3``: what one S3 GET or PUT costs through boto3 and through cdiflow's client.

The figures behind a design choice (docs/architecture.md, *S3 access*): cdiflow makes its S3
requests with obstore, not boto3. Both clients talk to the same embedded S3 endpoint (moto,
started here and stopped after); blocks of calls alternate between the clients so a machine
that speeds up or slows down meanwhile favours neither. Per call: wall time, the client
process's CPU (every thread: obstore's I/O threads count) and the endpoint's CPU.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import click
import psutil
from botocore.config import Config

from orchestrator.objectstore import ObjectStore
from orchestrator.services.s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, S3Service
from orchestrator.settings import load_settings

__all__ = ["bench_s3_command", "measure_s3_costs"]

_BUCKET = "cdiflow-bench"
Call = Callable[[], object]


def _clients(endpoint: str, data_dir: Path, key: str, data: bytes) -> dict[str, dict[str, Call]]:
    boto = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=32),
    )
    store = ObjectStore(
        load_settings(
            data_dir=data_dir,
            s3_endpoint_url=endpoint,
            s3_bucket=_BUCKET,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            aws_region=REGION,
        )
    )
    uri = store.uri(key)
    return {
        "boto3": {
            "put": lambda: boto.put_object(Bucket=_BUCKET, Key=key, Body=data),
            "get": lambda: boto.get_object(Bucket=_BUCKET, Key=key)["Body"].read(),
        },
        "cdiflow": {
            "put": lambda: store.put(uri, data),
            "get": lambda: store.get(uri, limit=len(data)),
        },
    }


def _block(call: Call, n: int, server: psutil.Process) -> tuple[float, float, float]:
    """Seconds of wall, client CPU and server CPU for ``n`` calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    served = sum(server.cpu_times()[:2])
    for _ in range(n):
        call()
    return (
        time.perf_counter() - wall,
        time.process_time() - cpu,
        sum(server.cpu_times()[:2]) - served,
    )


def measure_s3_costs(sizes: list[int], calls: int, blocks: int) -> list[dict[str, Any]]:
    """Per size, client and operation: median over ``blocks`` of the per-call costs (ms)."""
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="cdiflow-bench-s3-") as tmp,
        S3Service(Path(tmp), bucket=_BUCKET) as endpoint,
    ):
        assert endpoint.pid is not None
        server = psutil.Process(endpoint.pid)
        for size in sizes:
            data = bytes(range(256)) * (size // 256) + b"\0" * (size % 256)
            clients = _clients(endpoint.url, Path(tmp), f"bench/{uuid.uuid4()}", data)
            for ops in clients.values():  # warm up: connections, credentials, imports
                for _ in range(5):
                    ops["put"]()
                    ops["get"]()
            samples: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
            for block in range(blocks):
                order = list(clients) if block % 2 == 0 else list(reversed(clients))
                for client in order:
                    for op in ("put", "get"):
                        cost = _block(clients[client][op], calls, server)
                        samples.setdefault((client, op), []).append(cost)
            for (client, op), costs in samples.items():
                results.append(
                    {
                        "client": client,
                        "op": op,
                        "size": size,
                        "calls": calls * blocks,
                        "wall_ms": _per_call(costs, 0, calls),
                        "client_cpu_ms": _per_call(costs, 1, calls),
                        "server_cpu_ms": _per_call(costs, 2, calls),
                    }
                )
    return results


def _per_call(costs: list[tuple[float, float, float]], column: int, calls: int) -> float:
    return round(statistics.median(c[column] for c in costs) * 1000 / calls, 3)


@click.command("s3")
@click.option("--sizes", default="10KB,2MB", show_default=True, help="Object sizes.")
@click.option("--calls", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--blocks", default=6, show_default=True, type=click.IntRange(1, 100))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_s3_command(sizes: str, calls: int, blocks: int, as_json: bool) -> None:
    """Cost of one S3 GET and PUT: boto3 against cdiflow's client, on the embedded endpoint."""
    from loadtest.cli import _sizes

    results = measure_s3_costs(list(_sizes(sizes)), calls, blocks)
    if as_json:
        click.echo(json.dumps({"results": results}))
        return
    click.echo(f"S3 per call, median of {blocks} blocks of {calls}; lower is better")
    header = ("client", "op", "size", "wall ms", "client cpu", "server cpu")
    click.echo("{:8} {:4} {:>9} {:>8} {:>10} {:>10}".format(*header))
    for row in results:
        click.echo(
            f"{row['client']:8} {row['op']:4} {row['size']:>9} {row['wall_ms']:8.2f} "
            f"{row['client_cpu_ms']:10.2f} {row['server_cpu_ms']:10.2f}"
        )
