"""``cdiflow bench channels``: pub/sub latency and throughput of CDI channels against Mosquitto
(MQTT, QoS 0) and Redis pub/sub, one publisher and one subscriber, on one host or (``--hosts
2``) on two hosts: network namespaces on one bridge (``cdi.hosts``), the publisher on the first,
the subscriber on the second, CDI's topic carried between them by the gateways.

Each row: a subscriber process joins, then the publisher (this process) sends ``samples``
messages one at a time, ``gap_us`` apart, each stamped with the monotonic clock (shared by the
processes of one host): the subscriber's receive time minus the stamp is one latency sample.
Then it sends ``burst`` messages back to back: ``messages_per_s`` is how many the subscriber
received, divided by the time from the first send to the last receive. CDI runs twice: with
the default wake-up (the reader sleeps on a futex) and with the reader polling (``spin_us``).

Every message is its send time, its number, a fixed pseudo-random body and (from 24 bytes) its
number again at the end: the subscriber counts the messages that arrived whole and unaltered
(``intact``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import click

from cdi.bench.stats import summarize
from cdi.errors import CDIError
from cdi.hosts import HostNetwork
from cdi.minion.config import parse_bytes
from loadtest.channel_peers import (
    Endpoint,
    ServerUnavailable,
    System,
    open_publisher,
    open_subscriber,
    running,
)

__all__ = ["ChannelRow", "bench_channels_command", "measure_channels"]

SIZES = "16,100KiB"
RECEIVE_TIMEOUT_S = 10.0
STAMP = 16  # bytes: the send time, then the message's number
TAIL = 8  # bytes: the number again, at the end of a message of STAMP + TAIL bytes or more


@dataclass(frozen=True)
class ChannelRow:
    system: str
    hosts: int
    message_bytes: int
    wake: str  # how the subscriber waits: "futex" (CDI's default), "spin", or "socket"
    p50_us: float | None
    p99_us: float | None
    samples: int
    messages_per_s: float | None
    sent: int  # messages in the burst
    delivered: int  # of them, how many the subscriber received
    received: int  # messages received in all (paced and burst)
    intact: int  # of them, how many arrived whole and unaltered
    not_run: str | None = None  # why this system was not measured


def _has_tail(size: int) -> bool:
    return size >= STAMP + TAIL


def _body(size: int) -> bytes:
    """The fixed part of every message of ``size`` bytes (the same in every process)."""
    return random.Random(size).randbytes(size - STAMP - (TAIL if _has_tail(size) else 0))


def _stamped(size: int, body: bytes, number: int) -> bytes:
    tag = number.to_bytes(8, "little")
    head = time.perf_counter_ns().to_bytes(8, "little") + tag
    return b"".join((head, body, tag if _has_tail(size) else b""))


def _intact(message: bytes, size: int, body: bytes) -> bool:
    if len(message) != size or message[STAMP : STAMP + len(body)] != body:
        return False
    return not _has_tail(size) or message[-TAIL:] == message[8:STAMP]


def _subscribe_and_measure(
    endpoint: Endpoint, spin_us: int, size: int, samples: int, burst: int, results: Connection
) -> None:
    """The subscriber's process: latencies of the paced messages, then the burst's timing."""
    if endpoint.subscriber_host is not None:
        endpoint.subscriber_host.enter()  # before any socket: they are made on that host
    subscriber = open_subscriber(endpoint, spin_us)
    body = _body(size)
    results.send("ready")
    latencies: list[int] = []
    count, first_sent, last_received, received, intact = 0, 0, 0, 0, 0
    try:
        while True:
            message = subscriber.receive(RECEIVE_TIMEOUT_S)
            now = time.perf_counter_ns()
            if message is None:
                break
            sent = int.from_bytes(message[:8], "little")
            number = int.from_bytes(message[8:16], "little")
            received += 1
            intact += _intact(message, size, body)
            if number < samples:
                latencies.append(now - sent)
                continue
            if count == 0:
                first_sent = sent
            count += 1
            last_received = now
            if number == samples + burst - 1:
                break
    finally:
        results.send({
            "latencies": latencies, "count": count, "span": last_received - first_sent,
            "received": received, "intact": intact,
        })  # fmt: skip
        subscriber.close()


def _measure_one(
    system: System, endpoint: Endpoint, size: int, samples: int, burst: int, gap_us: int,
    spin_us: int,
) -> ChannelRow:  # fmt: skip
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(
        target=_subscribe_and_measure, args=(endpoint, spin_us, size, samples, burst, theirs)
    )
    child.start()
    body = _body(size)
    try:
        with endpoint.on_publisher_host():
            publisher = open_publisher(endpoint)
        if not ours.poll(60) or ours.recv() != "ready":
            raise click.ClickException(f"the {system} subscriber did not start")
        try:
            for number in range(samples):
                publisher.publish(_stamped(size, body, number))
                publisher.flush()
                time.sleep(gap_us / 1e6)
            for number in range(samples, samples + burst):
                publisher.publish(_stamped(size, body, number))
            publisher.flush()
            if not ours.poll(RECEIVE_TIMEOUT_S * 3 + burst / 1000):
                raise click.ClickException(f"the {system} subscriber sent no results")
            report: dict[str, Any] = ours.recv()
        finally:
            publisher.close()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
    latency = summarize(str(system), size, report["latencies"])
    span_s = report["span"] / 1e9
    wake = "socket" if system is not System.CDI else ("spin" if spin_us else "futex")
    return ChannelRow(
        system=str(system),
        hosts=endpoint.hosts,
        message_bytes=size,
        wake=wake,
        p50_us=latency.p50_us,
        p99_us=latency.p99_us,
        samples=latency.n,
        messages_per_s=round(report["count"] / span_s, 1) if span_s > 0 else 0.0,
        sent=burst,
        delivered=report["count"],
        received=report["received"],
        intact=report["intact"],
    )


def measure_channels(
    systems: list[System], sizes: list[int], *, samples: int, burst: int, gap_us: int,
    spin_us: int, network: HostNetwork | None = None,
) -> list[ChannelRow]:  # fmt: skip
    """Every system at every size, each against a server started for it (across the first two
    hosts of ``network`` if given); a system whose server cannot start here gets rows saying
    why."""
    rows: list[ChannelRow] = []
    hosts = 1 if network is None else 2
    for system in systems:
        try:
            with running(system, network) as endpoint:
                for size in sizes:
                    spins = (0, spin_us) if system is System.CDI and spin_us else (0,)
                    for spin in spins:
                        n_burst = burst if size < 10_000 else max(1, burst // 20)
                        row = _measure_one(system, endpoint, size, samples, n_burst, gap_us, spin)
                        rows.append(row)
        except ServerUnavailable as exc:
            rows.extend(_not_run(system, hosts, size, str(exc)) for size in sizes)
    return rows


def _not_run(system: System, hosts: int, size: int, reason: str) -> ChannelRow:
    return ChannelRow(
        system=str(system), hosts=hosts, message_bytes=size, wake="socket", p50_us=None,
        p99_us=None, samples=0, messages_per_s=None, sent=0, delivered=0, received=0,
        intact=0, not_run=reason,
    )  # fmt: skip


def format_size(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def ratios(rows: list[ChannelRow]) -> list[dict[str, Any]]:
    """How many times lower CDI's p50 is than each peer's, per hosts, size and CDI wake-up."""
    out = []
    for cdi_row in (r for r in rows if r.system == System.CDI):
        for peer in (r for r in rows if r.system != System.CDI):
            ours, theirs = cdi_row.p50_us, peer.p50_us
            same = (peer.hosts, peer.message_bytes) == (cdi_row.hosts, cdi_row.message_bytes)
            if same and ours and theirs is not None:
                out.append({
                    "hosts": cdi_row.hosts, "message_bytes": cdi_row.message_bytes,
                    "cdi_wake": cdi_row.wake,
                    "peer": peer.system, "p50_ratio": round(theirs / ours, 2),
                })  # fmt: skip
    return out


def render(rows: list[ChannelRow], load: tuple[float, float], where: str) -> str:
    lines = [
        f"{'system':<10}{'hosts':<6}{'wake':<8}{'size':>9}{'p50 us':>10}{'p99 us':>10}"
        f"{'msgs/s':>12}{'delivered':>12}{'intact':>12}"
    ]
    for r in rows:
        head = f"{r.system:<10}{r.hosts:<6}{r.wake:<8}{format_size(r.message_bytes):>9}"
        if r.not_run is not None:
            lines.append(f"{head}  not run: {r.not_run}")
            continue
        lines.append(
            f"{head}{r.p50_us or 0:>10.1f}{r.p99_us or 0:>10.1f}{r.messages_per_s or 0:>12.0f}"
            f"{f'{r.delivered}/{r.sent}':>12}{f'{r.intact}/{r.received}':>12}"
        )
    lines.append(where)
    lines.append("")
    for ratio in ratios(rows):
        lines.append(
            f"cdi ({ratio['cdi_wake']}) p50 {ratio['p50_ratio']}x lower than "
            f"{ratio['peer']} at {format_size(ratio['message_bytes'])}, {ratio['hosts']} host(s)"
        )
    lines.append(f"load average before / after: {load[0]:.2f} / {load[1]:.2f}")
    return "\n".join(lines)


@click.command("channels")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--systems",
    default="cdi,mosquitto,redis",
    show_default=True,
    help="Comma-separated: cdi, mosquitto, redis.",
)
@click.option(
    "--sizes",
    default=SIZES,
    show_default=True,
    help="Message sizes, comma-separated (16 B at least; 100KiB = 102,400 bytes).",
)
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option(
    "--burst",
    default=20000,
    show_default=True,
    type=click.IntRange(1, 10_000_000),
    help="Messages sent back to back for messages_per_s (a twentieth of it at 100 KB).",
)
@click.option(
    "--hosts",
    default=1,
    show_default=True,
    type=click.IntRange(1, 2),
    help="2: the publisher on one host, the subscriber on another (network namespaces).",
)
@click.option("--gap-us", default=1000, show_default=True, type=click.IntRange(0, 1_000_000))
@click.option(
    "--spin-us",
    default=5000,
    show_default=True,
    type=click.IntRange(0, 10_000_000),
    help="CDI's second run: the reader polls this long before it sleeps (0: no such run).",
)
def bench_channels_command(
    as_json: bool, systems: str, sizes: str, samples: int, burst: int, hosts: int, gap_us: int,
    spin_us: int,
) -> None:  # fmt: skip
    """Pub/sub p50 latency and messages a second: CDI channels, Mosquitto, Redis (on one host,
    or from one host to another)."""
    try:
        chosen = [System(s.strip()) for s in systems.split(",") if s.strip()]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--systems") from exc
    try:
        lengths = [parse_bytes(v) for v in sizes.split(",") if v.strip()]
    except CDIError as exc:  # ConfigError: not a size
        raise click.BadParameter(str(exc), param_hint="--sizes") from exc
    if not lengths or any(n < STAMP for n in lengths):
        raise click.BadParameter(
            f"give at least one size, each {STAMP} B or more", param_hint="--sizes"
        )
    before = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        network = None if hosts == 1 else stack.enter_context(HostNetwork.create(2))
        rows = measure_channels(
            chosen, lengths, samples=samples, burst=burst, gap_us=gap_us, spin_us=spin_us,
            network=network,
        )  # fmt: skip
        where = _where(network)
    load = (before, os.getloadavg()[0])
    if as_json:
        document = {
            "rows": [asdict(r) for r in rows],
            "ratios": ratios(rows),
            "hosts": {"count": hosts, "where": where},
            "load_average": {"before": load[0], "after": load[1]},
            "cpus": os.cpu_count(),
        }
        click.echo(json.dumps(document, indent=1))
    else:
        click.echo(render(rows, load, where))


def _where(network: HostNetwork | None) -> str:
    if network is None:
        return "one host: publisher and subscriber processes side by side"
    if network.kind == "netns":
        return (
            "two hosts: network namespaces on one bridge (veth, no emulated delay); publisher "
            "and server on host 1, subscriber on host 2"
        )
    return f"two hosts: loopback addresses, not namespaces ({network.reason})"
