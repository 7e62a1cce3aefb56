"""``cdiflow bench cdi --hosts 2`` and ``cdiflow bench channels --hosts 2`` run across two
hosts (their output is checked, not timings)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from loadtest.channels import bench_channels_command
from tests.cdi.test_bench_and_demo import run_cli
from tests.loadtest.conftest import require


def test_bench_cdi_between_two_hosts_prints_the_documented_json() -> None:
    done = run_cli(
        "bench", "cdi", "--hosts", "2", "--sizes", "10KB,1MB", "--repeat", "5", "--json",
        "--backends", "tcp,grpc,grpc-stream,cdi-rpc",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["hosts"]["count"] == 2 and report["hosts"]["kind"] in ("netns", "loopback")
    results = report["results"]
    assert {(r["backend"], r["size"]) for r in results} == {
        (b, s) for b in ("tcp", "grpc", "grpc-stream", "cdi-rpc") for s in (10_000, 1_000_000)
    }
    for r in results:
        assert r["n"] == 5 and 0 < r["p50_us"] <= r["p99_us"]


def test_bench_cdi_between_hosts_refuses_a_one_host_backend() -> None:
    done = run_cli("bench", "cdi", "--hosts", "2", "--backends", "cdi-shm")
    assert done.returncode != 0 and "between two hosts" in done.stderr


def test_bench_channels_between_two_hosts_gives_rows_of_two_hosts() -> None:
    """``cdiflow bench channels --hosts 2``: every system's rows say two hosts, and every CDI
    message crossed whole (one of them in two chunks)."""
    require("paho", "redis")
    result = CliRunner().invoke(
        bench_channels_command,
        ["--json", "--hosts", "2", "--sizes", "16,70000", "--samples", "5", "--burst", "20",
         "--gap-us", "0", "--spin-us", "0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["hosts"]["count"] == 2
    rows = document["rows"]
    assert {(r["system"], r["message_bytes"]) for r in rows} == {
        (s, n) for s in ("cdi", "mosquitto", "redis") for n in (16, 70_000)
    }
    for row in rows:
        assert row["hosts"] == 2
        if row["system"] == "cdi":
            assert row["intact"] == row["received"] == 5 + row["sent"], row
        if row["not_run"] is None:
            assert row["p50_us"] > 0 and row["messages_per_s"] > 0
