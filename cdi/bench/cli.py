"""``cdiflow bench cdi``: the paper's Table I on this machine, TCP vs gRPC vs CDI-SHM; with
``--hosts 2`` its Table II between two hosts (network namespaces) on this machine."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import click

from cdi.bench.handoff import BACKENDS, DEFAULT_BACKENDS, HandoffConfig, measure
from cdi.bench.stats import Result, format_size, render_table, summarize
from cdi.cluster import LocalCluster
from cdi.hosts import HostNetwork
from cdi.minion.config import parse_bytes
from cdi.minion.process import MinionChild

__all__ = ["CROSS_HOST_BACKENDS", "bench_cdi_command", "run_handoff_benchmark"]

# Between hosts only these make sense: CDI-SHM needs one host's memory. cdi-rdma would join
# them where its data path exists (cdi.remote.rdma: not built).
CROSS_HOST_BACKENDS = ("tcp", "grpc", "grpc-stream", "cdi-rpc")


def run_handoff_benchmark(
    sizes: list[int],
    backends: list[str],
    *,
    repeat: int,
    read_all: bool,
    spin_us: int,
    busy_poll_us: int,
    gap_us: int,
    progress: bool = False,
    network: HostNetwork | None = None,
) -> list[Result]:
    """Measure every backend at every size in one run, against a minion started for it.
    ``network``: the sender runs on its first host, the receiver on its second, and CDI-RPC
    between a minion on each (with a controller; ``cdi.cluster``)."""
    results = []
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdi-bench-")))
        sockets = ["", ""]
        if network is not None and "cdi-rpc" in backends:
            cluster = LocalCluster.start(
                2, folder / "hosts", "--busy-poll-us", str(busy_poll_us), network=network
            )
            stack.callback(cluster.close, False)
            sockets = [m.socket_path for m in cluster.minions]
        elif network is None:
            sockets[0] = str(folder / "minion.sock")
            stack.enter_context(MinionChild(sockets[0], "--busy-poll-us", str(busy_poll_us)))
        hosts = (network.hosts[0], network.hosts[1]) if network else (None, None)
        for size in sizes:
            for backend in backends:
                config = HandoffConfig(
                    size=size,
                    repeat=repeat,
                    read_all=read_all,
                    minion_socket=sockets[0],
                    receiver_minion_socket=sockets[1],
                    spin_us=spin_us,
                    gap_s=gap_us / 1e6,
                    sender_host=hosts[0],
                    receiver_host=hosts[1],
                )
                if progress:
                    click.echo(f"  {backend:<11} {format_size(size):>7} ...", err=True)
                results.append(summarize(backend, size, measure(backend, config)))
    return results


@click.command("cdi")
@click.option(
    "--sizes",
    default="10KB,100KB,1MB,10MB",
    show_default=True,
    help="Payload sizes, comma-separated (10KB = 10,000 bytes as in the paper).",
)
@click.option(
    "--repeat",
    default=200,
    show_default=True,
    type=click.IntRange(5, 100_000),
    help="Hand-offs measured per backend and size (after 20 warm-up rounds).",
)
@click.option(
    "--backends",
    default=",".join(DEFAULT_BACKENDS),
    show_default=True,
    help="Also: relay, the floor of any brokered hand-off (two hops through a third process).",
)
@click.option(
    "--read-all", is_flag=True, help="The receiver also reads every byte before the clock stops."
)
@click.option(
    "--spin-us",
    default=2000,
    show_default=True,
    type=click.IntRange(0, 10**6),
    help="How long a CDI receiver polls in access() before sleeping.",
)
@click.option(
    "--busy-poll-us",
    default=1000,
    show_default=True,
    type=click.IntRange(0, 10**6),
    help="How long the minion polls while a container waits in access().",
)
@click.option(
    "--gap-us",
    default=1000,
    show_default=True,
    type=click.IntRange(0, 10**6),
    help="How long the sender waits between hand-offs. Every hand-off then starts from the same "
    "idle state; a short gap measures back-to-back hand-offs on warm caches instead.",
)
@click.option(
    "--hosts",
    type=click.IntRange(1, 2),
    default=1,
    show_default=True,
    help="2: sender and receiver on two hosts (network namespaces, as root; else two loopback "
    f"addresses); backends {', '.join(CROSS_HOST_BACKENDS)}.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON results on stdout.")
def bench_cdi_command(
    sizes: str,
    repeat: int,
    backends: str,
    read_all: bool,
    spin_us: int,
    busy_poll_us: int,
    gap_us: int,
    hosts: int,
    as_json: bool,
) -> None:
    """Hand-off latency of a payload between two processes: raw TCP, gRPC and CDI-SHM."""
    size_list = [parse_bytes(s) for s in sizes.split(",") if s.strip()]
    chosen = [b.strip() for b in backends.split(",") if b.strip()]
    allowed = CROSS_HOST_BACKENDS if hosts == 2 else tuple(BACKENDS)
    if hosts == 2 and backends == ",".join(DEFAULT_BACKENDS):
        chosen = list(CROSS_HOST_BACKENDS)
    unknown = [b for b in chosen if b not in allowed]
    if unknown:
        where = "between two hosts" if hosts == 2 else "on one host"
        raise click.BadParameter(
            f"unknown backend(s) {unknown} {where}; choose from {list(allowed)}"
        )
    if any(s <= 0 for s in size_list):
        raise click.BadParameter("sizes must be positive")
    network = HostNetwork.create(2) if hosts == 2 else None
    try:
        if network is not None and network.kind == "loopback" and not as_json:
            click.echo(
                f"no network namespaces ({network.reason}): two loopback addresses", err=True
            )
        results = run_handoff_benchmark(
            size_list,
            chosen,
            repeat=repeat,
            read_all=read_all,
            spin_us=spin_us,
            busy_poll_us=busy_poll_us,
            gap_us=gap_us,
            progress=not as_json,
            network=network,
        )
    finally:
        if network is not None:
            network.close()
    if as_json:
        report: dict[str, object] = {"results": [r.as_dict() for r in results]}
        if network is not None:
            report["hosts"] = {"count": 2, "kind": network.kind, "reason": network.reason}
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
        return
    what = "hand-off + reading every byte" if read_all else "hand-off (receiver holds the data)"
    where = f"between two hosts ({network.kind})" if network else "on one host"
    click.echo(f"\n{what} {where}, {repeat} rounds each; lower is better\n")
    subject = chosen[-1] if network else "cdi-shm"
    click.echo(render_table(results, baseline="tcp", subject=subject))
