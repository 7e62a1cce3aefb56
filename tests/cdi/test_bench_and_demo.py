"""The benchmark and the demo run end to end (their output is checked, never their timings)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

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


def test_a_stopped_bench_stops_the_minion_and_processes_it_started() -> None:
    """SIGTERM (what a terminal's job control, a CI runner or ``timeout`` sends) ends the
    benchmark through its clean-up: no minion, receiver or temp folder outlives it."""
    bench = psutil.Popen(
        [sys.executable, "-m", "cdiflow", "bench", "cdi", "--sizes", "10KB",
         "--repeat", "100000", "--backends", "cdi-shm"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(started) < 2:
            started = bench.children(recursive=True)  # the minion and the receiver
            time.sleep(0.1)
        assert len(started) >= 2, "the bench never started its minion and receiver"
        folders = {Path(f.path).parent for p in started for f in _open_files(p)}
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, f"left running after the bench stopped: {[p.cmdline() for p in alive]}"
        assert not [f for f in folders if f.name.startswith("cdi-bench-") and f.exists()]
    finally:
        for process in [bench, *started]:
            if process.is_running():
                process.kill()


def _open_files(process: psutil.Process) -> list[Any]:
    try:
        return list(process.open_files())
    except psutil.Error:
        return []
