"""``cdiflow bench cdi --hosts 2`` runs across two hosts (its output is checked, not timings)."""

from __future__ import annotations

import json

from tests.cdi.test_bench_and_demo import run_cli


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
