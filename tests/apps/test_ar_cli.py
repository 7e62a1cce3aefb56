"""``cdiflow bench ar`` and ``cdiflow ar``: the documented JSON, a readable table, clear
refusals (their output is checked, never their timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from apps.ar.config import RunConfig, Site
from apps.ar.errors import PartsMissing
from cdi.hosts import Host
from cdiflow.cli import main
from tests.cdi.test_bench_and_demo import run_cli

ROW_KEYS = {
    "backend",
    "detectors",
    "fps",
    "latency_ms_p50",
    "cpu_ms_per_frame",
    "cpu_ms_per_frame_compute",
    "cpu_ms_per_frame_moving",
    "cpu_ms_per_frame_other",
    "peak_rss_mb",
}


def test_bench_ar_prints_the_documented_json_and_plots(tmp_path: Path) -> None:
    done = run_cli(
        "bench", "ar", "--frames", "6", "--detectors", "1", "--backends", "tcp,cdi-shm",
        "--data-dir", str(tmp_path), "--plots", str(tmp_path / "plots"), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rows = {(r["backend"], r["detectors"]): r for r in doc["results"]}
    assert set(rows) == {("floor", 1), ("pool", 1), ("tcp", 1), ("cdi-shm", 1)}
    for row in rows.values():
        assert set(row) == ROW_KEYS
        assert row["fps"] > 0 and row["latency_ms_p50"] > 0
        assert all(v > 0 for v in row["peak_rss_mb"].values())
    assert rows[("floor", 1)]["cpu_ms_per_frame_moving"] is None
    assert rows[("pool", 1)]["cpu_ms_per_frame_moving"] is None
    for row in rows.values():  # parts measured where they are spent, adding up to the whole
        parts = [row[f"cpu_ms_per_frame_{p}"] for p in ("compute", "moving", "other")]
        assert all(p is None or p >= 0 for p in parts), row
        assert sum(p or 0.0 for p in parts) == pytest.approx(sum(row["cpu_ms_per_frame"].values()))
    assert set(rows[("tcp", 1)]["cpu_ms_per_frame"]) == {"extractor", "detector", "combinator"}
    assert set(rows[("cdi-shm", 1)]["peak_rss_mb"]) == {
        "extractor", "detector", "combinator", "minion",
    }  # fmt: skip
    for name in ("tcp", "cdi-shm"):
        assert rows[(name, 1)]["cpu_ms_per_frame_moving"] > 0
    # CDI's runtime moves frames: the minion's CPU is part of CDI's moving cost.
    cdi = rows[("cdi-shm", 1)]
    assert cdi["cpu_ms_per_frame_moving"] >= cdi["cpu_ms_per_frame"]["minion"]
    # ... and where the moving part is spent adds up to it, the minion one of the parts.
    by_part = {(r["backend"], r["detectors"]): r["cpu_ms_per_frame"] for r in doc["moving_by_part"]}
    assert set(by_part) == {("tcp", 1), ("cdi-shm", 1)}
    for key, parts in by_part.items():
        assert sum(parts.values()) == pytest.approx(rows[key]["cpu_ms_per_frame_moving"]), parts
    # One host, no controller: the native minion alone, no launcher relaying a directory.
    shm = by_part[("cdi-shm", 1)]
    assert shm["minion"] == pytest.approx(cdi["cpu_ms_per_frame"]["minion"])
    assert "minion relay" not in shm
    assert "extractor link" in by_part[("tcp", 1)] and "minion" not in by_part[("tcp", 1)]
    assert doc["video"]["frames"] == 6 and doc["video"]["width"] == 1280
    assert doc["hosts"] == {"count": 1}
    assert [(g["backend"], g["detectors"]) for g in doc["goals"]] == [("cdi-shm", 1)]
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "ar-cpu.png", "ar-memory.png", "ar-fps.png", "ar-moving.png",
    }  # fmt: skip


def cli(*args: str) -> Result:
    """The command in this process: refusals come before any role process starts."""
    return CliRunner().invoke(main, list(args))


def test_bench_ar_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    done = cli("bench", "ar", "--backends", "carrier-pigeon")
    assert done.exit_code == 2 and "unknown backend" in done.output
    done = cli("bench", "ar", "--backends", "cdi-rpc", "--video", str(tmp_path / "none.mp4"))
    assert done.exit_code == 2 and "does not exist" in done.output
    done = cli("bench", "ar", "--backends", "cdi-rpc", "--data-dir", str(tmp_path))
    assert done.exit_code == 1 and "cdi-rpc moves frames between hosts: run it with --hosts 2" in (
        done.output
    )
    assert done.exc_info is not None and done.exc_info[0] is SystemExit  # no traceback
    done = cli("bench", "ar", "--hosts", "2", "--backends", "tcp,cdi-shm")
    assert done.exit_code == 1 and "cdi-shm moves frames on one host only" in done.output
    assert "between hosts use tcp, rest, grpc, cdi-rpc" in done.output
    done = cli("bench", "ar", "--hosts", "3")
    assert done.exit_code == 2 and "--hosts" in done.output
    done = cli("bench", "ar", "--detectors", "0")
    assert done.exit_code == 2 and "detector counts must be 1 to 16" in done.output
    done = cli("bench", "ar", "--option", "cache")
    assert done.exit_code == 2 and "key=value" in done.output


def test_ar_run_writes_the_labelled_video_and_its_boxes(tmp_path: Path) -> None:
    video = tmp_path / "in.mp4"
    done = run_cli("ar", "sample", str(video), "--frames", "4", "--size", "640x360")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out.mp4"
    done = run_cli(
        "ar", "run", str(video), "--out", str(out), "--detectors", "2", "--json"
    )  # cdi-shm with a minion of its own
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["frames"] == 4 and report["backend"] == "cdi-shm"
    assert out.stat().st_size > 0
    boxes = json.loads(Path(report["boxes"]).read_text())["frames"]
    assert len(boxes) == 4


def test_ar_run_refuses_a_video_that_is_too_small(tmp_path: Path) -> None:
    video = tmp_path / "tiny.mp4"
    assert cli("ar", "sample", str(video), "--frames", "2", "--size", "64x64").exit_code == 0
    done = cli("ar", "run", str(video), "--out", str(tmp_path / "o.mp4"), "--backend", "tcp")
    assert done.exit_code == 1 and "too small for the people detector" in done.output
    done = cli("ar", "sample", str(video), "--size", "big")
    assert done.exit_code == 2 and "write e.g. 1280x720" in done.output


def test_without_pyav_or_opencv_the_commands_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apps.ar import parts

    monkeypatch.setattr(parts, "find_spec", lambda name: None if name == "av" else object())
    with pytest.raises(PartsMissing, match=r"needs PyAV: pip install 'cdiflow\[ar\]'"):
        parts.require_parts()


def test_ar_run_refuses_a_backend_on_the_wrong_number_of_hosts(tmp_path: Path) -> None:
    video, out = str(tmp_path / "in.mp4"), str(tmp_path / "out.mp4")
    assert cli("ar", "sample", video, "--frames", "2", "--size", "640x360").exit_code == 0
    done = cli("ar", "run", video, "--out", out, "--backend", "cdi-rpc")
    assert done.exit_code == 1 and "run it with --hosts 2" in done.output
    done = cli("ar", "run", video, "--out", out, "--hosts", "2")  # cdi-shm, the default
    assert done.exit_code == 1 and "cdi-shm moves frames on one host only" in done.output
    done = cli("ar", "run", video, "--out", out, "--backend", "cdi-rpc", "--hosts", "2",
               "--minion", "/run/x.sock")  # fmt: skip
    assert done.exit_code == 2 and "each host gets a minion of its own" in done.output


def test_roles_can_be_placed_on_hosts_and_minions_of_their_own() -> None:
    there = Host("host2", "10.0.0.3", "ns2")
    config = RunConfig(
        backend="cdi-rpc",
        video="in.mp4",
        width=1280,
        height=720,
        detectors=4,
        minion="/run/a.sock",
        placement={
            "detector": Site(there, "/run/b.sock"),
            "detector-3": Site(minion="/run/c.sock"),
        },
    )
    assert config.minion_for("extractor") == "/run/a.sock"
    assert config.minion_for("detector", 0) == "/run/b.sock"
    assert config.minion_for("detector", 3) == "/run/c.sock"
    assert config.minion_for("combinator") == "/run/a.sock"
    assert config.address_for("detector", 1) == "10.0.0.3"
    assert config.address_for("detector", 3) == config.address_for("extractor") == "127.0.0.1"
    assert config.hosts == 2
    assert RunConfig(backend="tcp", video="in.mp4", width=1280, height=720).hosts == 1


def test_rounds_keep_each_rows_cpu_parts_from_one_round() -> None:
    """Medians over rounds: a row's CPU figures come from its median round, so they still
    add up (medians taken field by field would not)."""
    from apps.ar.bench import _median_rows

    def row(compute: float, moving: float, other: float, fps: float) -> dict[str, object]:
        total = compute + moving + other
        return {
            "backend": "tcp", "detectors": 1, "fps": fps, "latency_ms_p50": 10.0,
            "cpu_ms_per_frame": {"extractor": total / 2, "detector": total / 2},
            "cpu_ms_per_frame_compute": compute, "cpu_ms_per_frame_moving": moving,
            "cpu_ms_per_frame_other": other, "peak_rss_mb": {"detector": 80.0},
            "_outside": moving + other, "_detector_growth_mb": 9.0,
            "_moving_by_part": {"extractor link": moving},
        }  # fmt: skip

    rounds = [[row(50.0, 1.0, 0.5, 18.0)], [row(40.0, 3.0, 0.1, 20.0)], [row(45.0, 9.0, 0.2, 19.0)]]
    (merged,) = _median_rows(rounds)
    assert merged["fps"] == 19.0  # figures outside the CPU split: medians
    # The median round by total CPU (51.5, 43.1, 54.2) is the first.
    assert (merged["cpu_ms_per_frame_compute"], merged["cpu_ms_per_frame_moving"]) == (50.0, 1.0)
    assert merged["_moving_by_part"] == {"extractor link": 1.0}
    parts = sum(merged[f"cpu_ms_per_frame_{p}"] for p in ("compute", "moving", "other"))
    assert parts == pytest.approx(sum(merged["cpu_ms_per_frame"].values()))
