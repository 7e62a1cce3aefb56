"""The emulated link between hosts, and `cdiflow bench workflows --hosts 2` over it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from cdi.hosts import HostNetwork, namespaces_available
from cdi.link_emulator import Link
from cdi.link_probe import probe
from loadtest.hosts import host_goals
from loadtest.runner import BenchConfig, run_benchmark
from loadtest.stats import PointResult
from orchestrator.services import RunningServices
from tests.cdi.test_bench_and_demo import run_cli
from tests.loadtest.conftest import require

NETNS, WHY_NOT = namespaces_available()
needs_link = pytest.mark.skipif(
    not NETNS or shutil.which("nft") is None,
    reason=f"an emulated link needs network namespaces and `nft`: {WHY_NOT or 'no nft'}",
)

_DIAL = (
    "import socket,sys; c=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10);"
    "print(c.recv(16).decode())"
)


def _namespaces() -> set[str]:
    """This process's namespaces (others' tests may make and remove theirs meanwhile)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = {line.split()[0] for line in listed.splitlines() if line.strip()}
    return {name for name in names if name.startswith(f"cdi{os.getpid()}x")}


@needs_link
def test_the_link_adds_its_round_trip_caps_its_bandwidth_and_goes_away(tmp_path: Path) -> None:
    before = _namespaces()
    with HostNetwork.create(2, fallback=False) as net:
        plain = probe(net, net.hosts[0], net.hosts[1])
        net.emulate_link(Link(mbit=200, rtt_ms=4), str(tmp_path))
        assert net.emulator is not None
        emulator = psutil.Process(net.emulator.pid)
        there = probe(net, net.hosts[0], net.hosts[1])
        back = probe(net, net.hosts[1], net.hosts[0])
        # A request and its answer wait half the round trip each way; tbf caps the rate.
        assert plain.rtt_ms < 4 <= there.rtt_ms and back.rtt_ms >= 4, (plain, there, back)
        assert 0 < there.mbit <= 200 * 1.05 and 0 < back.mbit <= 200 * 1.05, (there, back)
        assert there.connect_ms >= 8  # the handshake's round trip, then the first answer's
        # A service on the root namespace's loopback is reached at the bridge's address.
        with socket.create_server(("127.0.0.1", 0)) as service:
            port = service.getsockname()[1]
            url = net.reachable(f"redis://127.0.0.1:{port}/1")
            assert url == f"redis://{net.gateway}:{port}/1"
            dial = net.hosts[1].wrap([sys.executable, "-c", _DIAL, net.gateway, str(port)])
            client = subprocess.Popen(dial, stdout=subprocess.PIPE, text=True)
            service.settimeout(20)
            conn, _ = service.accept()
            with conn:
                conn.sendall(b"from loopback")
            out, _ = client.communicate(timeout=20)
            assert out.strip() == "from loopback"
    assert not emulator.is_running() or emulator.status() == psutil.STATUS_ZOMBIE
    assert _namespaces() == before


def test_host_goals_compare_the_systems_of_one_size() -> None:
    def row(system: str, wps: float) -> PointResult:
        return PointResult(system, "1", 2_000_000, 3, 10, 10, 0, 1.0, 1.0, 1.0, wps)

    rows = [row("transfer", 13.0), row("object-store", 10.0), row("ray", 14.0),
            row("affinity", 12.0), row("auto", 12.5)]  # fmt: skip
    lines = host_goals(rows).splitlines()
    assert lines == [
        "2 MB: transfer / object-store = 1.30 (goal >= 1.3) met",
        "2 MB: transfer / ray = 0.93 (goal >= 1) NOT met",
        "2 MB: auto / best of affinity, transfer = 0.96 (goal >= 0.95) met",
    ]


def test_bench_workflows_hosts_refuses_what_cannot_spread() -> None:
    done = run_cli("bench", "workflows", "--hosts", "2", "--quick")
    assert done.returncode != 0 and "--hosts goes with --scenario" in done.stderr
    done = run_cli("bench", "workflows", "--hosts", "2", "--scenario", "1", "--systems", "celery")
    assert done.returncode != 0 and "run on one host only" in done.stderr


@needs_link
@pytest.mark.timeout(600)
def test_bench_workflows_runs_transfer_across_two_hosts(service_stack: RunningServices) -> None:
    """Worker 2 runs in host 2's namespace: it reaches Postgres, Redis and S3 only through
    the link, and its tasks' objects cross between the hosts' gateways."""
    require("locust")
    before = _namespaces()
    with tempfile.TemporaryDirectory(prefix="mh-") as folder:  # short: the minion sockets
        config = BenchConfig(
            scenarios=("1",), systems=("transfer",), sizes=(10_000,), parallel=2,
            min_workflows=4, data_dir=Path(folder), time_limit_s=240, link="regional", hosts=2,
            host_link=Link(mbit=1000, rtt_ms=0.5),
        )  # fmt: skip
        report = run_benchmark(config, services=service_stack, redis_db_from=13)
    (row,) = report.as_dict()["results"]
    assert (row["completed"], row["failed"]) == (4, 0) and row["verified"]["ok"], row
    assert row["workers_busy"].get("worker-2", 0) > 0, row["workers_busy"]
    assert "host link emulator" in row["resources"], row["resources"]  # metered, as S3's proxy
    link = report.machine["host_link"]
    assert link["stated"] == "1000 Mbit/s, 0.5 ms round trip"
    assert link["measured"]["rtt_ms"] >= 0.5 and 0 < link["measured"]["mbit"] <= 1050
    assert _namespaces() == before


def test_up_gives_the_hosts_the_link_asked_for() -> None:
    from cdi.link_emulator import SERVICES_ONLY
    from orchestrator.stack.cli import _link

    assert _link(None, None) is SERVICES_ONLY
    assert _link(1000.0, None) == Link(mbit=1000.0, rtt_ms=0.0)
    assert _link(None, 0.5) == Link(mbit=None, rtt_ms=0.5)
    assert SERVICES_ONLY.describe() == "unshaped, 0 ms round trip"
