"""The benchmark and the demo run end to end (their output is checked, never their timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cdi.conftest import ROOT


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdiflow", *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )


def test_bench_cdi_prints_the_documented_json() -> None:
    done = run_cli("bench", "cdi", "--sizes", "10KB,1MB", "--repeat", "5", "--json")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    assert {(r["backend"], r["size"]) for r in results} == {
        (b, s) for b in ("tcp", "grpc", "cdi-shm") for s in (10_000, 1_000_000)
    }
    for r in results:
        assert set(r) == {"backend", "size", "n", "mean_us", "p50_us", "p99_us"}
        assert r["n"] == 5 and 0 < r["p50_us"] <= r["p99_us"]


def test_bench_cdi_measures_the_relay_floor_when_asked() -> None:
    done = run_cli(
        "bench", "cdi", "--sizes", "10KB", "--repeat", "5", "--backends", "relay,cdi-shm",
        "--gap-us", "50",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert {row[0] for row in rows if row} >= {"relay", "cdi-shm"}


def test_bench_cdi_refuses_bad_options() -> None:
    done = run_cli("bench", "cdi", "--backends", "carrier-pigeon")
    assert done.returncode != 0 and "unknown backend" in done.stderr
    done = run_cli("bench", "cdi", "--sizes", "ten")
    assert done.returncode != 0 and "cannot read 'ten' as a size" in done.stderr
    done = run_cli("bench", "cdi", "--gap-us", "-1")
    assert done.returncode != 0 and "--gap-us" in done.stderr
    done = run_cli("bench", "cdi", "--minion", "java")
    assert done.returncode != 0 and "--minion" in done.stderr


def test_demo_passes_an_image_through_a_cdi_object(tmp_path: Path) -> None:
    done = run_cli("cdi", "demo", "--json", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["correct"] is True
    assert Path(report["result"]).exists()
    assert report["object_bytes"] > 300_000
