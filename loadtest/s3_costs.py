"""``cdiflow bench s3``: what one S3 GET or PUT costs through boto3 and through cdiflow's client,
on each S3 server asked for.

The figures behind two design choices
(docs/decisions/2026-12-05-s3-client-and-embedded-endpoint.md): cdiflow makes its S3 requests
with obstore, not boto3; and its embedded endpoint is versitygw (``--server
versitygw,moto,s3proxy`` sets the candidates side by side, see ``loadtest/s3_servers.py``).
Each server is started here in a folder of its own and stopped
after; blocks of calls alternate between the clients so a machine that speeds up or slows down
meanwhile favours neither. Per call: wall time, the client process's CPU (every thread:
obstore's I/O threads count) and the server's CPU; per server: how long it took from launch to
answering, and its resident memory after the calls.
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

from loadtest.s3_servers import SERVERS, start_server
from orchestrator.objectstore import ObjectStore
from orchestrator.services.s3 import REGION
from orchestrator.settings import load_settings

__all__ = ["bench_s3_command", "measure_s3_costs"]

_BUCKET = "cdiflow-bench"
Call = Callable[[], object]


def _clients(
    endpoint: str, keys: tuple[str, str], data_dir: Path, key: str, data: bytes
) -> dict[str, dict[str, Call]]:
    access_key_id, secret = keys
    boto = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret,
        config=Config(
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=32,
            # Checksums only where S3 requires them: s3proxy refuses the CRC32 header newer
            # botocore sends with every PUT, and obstore sends none either.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    store = ObjectStore(
        load_settings(
            data_dir=data_dir,
            s3_endpoint_url=endpoint,
            s3_bucket=_BUCKET,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret,
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


def measure_s3_costs(
    sizes: list[int], calls: int, blocks: int, servers: tuple[str, ...] = ("versitygw",)
) -> list[dict[str, Any]]:
    """Per server, size, client and operation: median over ``blocks`` of the per-call costs
    (ms), with the server's start time (s) and resident memory (MB) on every row."""
    results: list[dict[str, Any]] = []
    jar_dir = load_settings().data_dir / "peers"
    for name in servers:
        with tempfile.TemporaryDirectory(prefix="cdiflow-bench-s3-") as tmp:
            began = time.perf_counter()
            endpoint = start_server(name, Path(tmp), _BUCKET, jar_dir)
            start_s = time.perf_counter() - began
            try:
                assert endpoint.pid is not None
                server = psutil.Process(endpoint.pid)
                keys = (
                    str(getattr(endpoint, "access_key_id")),  # noqa: B009 - each server's own
                    str(getattr(endpoint, "secret_access_key")),  # noqa: B009
                )
                rows = _measure(endpoint.url, keys, Path(tmp), server, sizes, calls, blocks)
                rss_mb = round(server.memory_info().rss / 2**20, 1)
            finally:
                endpoint.stop()
            for row in rows:
                results.append(
                    {"server": name, **row, "start_s": round(start_s, 3), "rss_mb": rss_mb}
                )
    return results


def _measure(
    url: str,
    keys: tuple[str, str],
    folder: Path,
    server: psutil.Process,
    sizes: list[int],
    calls: int,
    blocks: int,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for size in sizes:
        data = bytes(range(256)) * (size // 256) + b"\0" * (size % 256)
        clients = _clients(url, keys, folder, f"bench/{uuid.uuid4()}", data)
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
            rows.append(
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
    return rows


def _per_call(costs: list[tuple[float, float, float]], column: int, calls: int) -> float:
    return round(statistics.median(c[column] for c in costs) * 1000 / calls, 3)


@click.command("s3")
@click.option("--sizes", default="10KB,2MB", show_default=True, help="Object sizes.")
@click.option("--calls", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--blocks", default=6, show_default=True, type=click.IntRange(1, 100))
@click.option(
    "--server",
    "servers",
    default="versitygw",
    show_default=True,
    help=f"Comma-separated S3 servers to measure one after another: {', '.join(SERVERS)}.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_s3_command(sizes: str, calls: int, blocks: int, servers: str, as_json: bool) -> None:
    """Cost of one S3 GET and PUT: boto3 against cdiflow's client, on each server asked for
    (default: the embedded endpoint)."""
    from loadtest.cli import parse_sizes

    chosen = tuple(s.strip() for s in servers.split(",") if s.strip())
    if unknown := [s for s in chosen if s not in SERVERS]:
        raise click.BadParameter(f"unknown {unknown}; choose from {', '.join(SERVERS)}")
    results = measure_s3_costs(list(parse_sizes(sizes)), calls, blocks, chosen)
    if as_json:
        click.echo(json.dumps({"results": results}))
        return
    click.echo(f"S3 per call, median of {blocks} blocks of {calls}; lower is better")
    header = ("server", "client", "op", "size", "wall ms", "client cpu", "server cpu",
              "start s", "rss MB")  # fmt: skip
    click.echo("{:10} {:8} {:4} {:>9} {:>8} {:>10} {:>10} {:>8} {:>7}".format(*header))
    for row in results:
        click.echo(
            f"{row['server']:10} {row['client']:8} {row['op']:4} {row['size']:>9} "
            f"{row['wall_ms']:8.2f} {row['client_cpu_ms']:10.2f} {row['server_cpu_ms']:10.2f} "
            f"{row['start_s']:8.2f} {row['rss_mb']:7.1f}"
        )
