"""The AR application end to end: real role processes over every backend, a real minion for
CDI, a generated video; the output checked frame by frame against the single-process run."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import cdi
from apps.ar.config import RunConfig
from apps.ar.errors import RoleFailed
from apps.ar.launch import PipelineResult, run_floor, run_pipeline
from cdi.minion.process import MinionChild
from tests.apps.ar_checks import assert_like_reference, config_for, kill_a_detector_mid_run
from workflows.ar.sample import SampleVideo, make_sample_video

FRAMES = 12


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample_video(tmp_path_factory.mktemp("ar") / "in.mp4", SampleVideo(frames=FRAMES))


@pytest.fixture(scope="module")
def minion() -> Iterator[MinionChild]:
    with (
        tempfile.TemporaryDirectory(prefix="ar-test-") as folder,
        MinionChild(str(Path(folder) / "minion.sock"), "--busy-poll-us", "0") as child,
    ):
        yield child


@pytest.fixture(scope="module")
def base(video: Path, minion: MinionChild) -> RunConfig:
    return config_for(video, minion=minion.socket_path)


@pytest.fixture(scope="module")
def reference(base: RunConfig, tmp_path_factory: pytest.TempPathFactory) -> PipelineResult:
    out = tmp_path_factory.mktemp("floor") / "floor.mp4"
    return run_floor(replace(base, output=str(out), detectors=1))


def _objects(minion: MinionChild) -> int:
    with cdi.Client(minion.socket_path) as probe_client:
        return int(probe_client.stat()["objects"])


def _flowing(minion: MinionChild, owner: str) -> bool:
    with cdi.Client(minion.socket_path) as probe_client:
        return any(o["owner"] == owner for o in probe_client.list_objects())


@pytest.mark.parametrize("backend", ["tcp", "rest", "grpc", "cdi-shm"])
def test_every_backend_gives_the_reference_video_frame_by_frame(
    backend: str,
    base: RunConfig,
    reference: PipelineResult,
    minion: MinionChild,
    tmp_path: Path,
) -> None:
    out = tmp_path / f"{backend}.mp4"
    config = replace(base, backend=backend, output=str(out), run_id=f"ar-{backend}")
    result = run_pipeline(config, [minion.pid] if backend == "cdi-shm" else ())

    assert_like_reference(result, reference, out, FRAMES)
    assert set(result.cpu_ms_per_frame()) >= {"extractor", "detector", "combinator"}
    assert result.fps > 0 and result.latency_ms_p50 > 0
    # The CPU splits into parts measured where each is spent, none below zero, adding up.
    compute, moving, other = result.cpu_ms_per_frame_split()
    assert moving is not None and moving >= 0 and other >= 0 and compute > 0
    assert compute + moving + other == pytest.approx(sum(result.cpu_ms_per_frame().values()))
    assert all(r.link_s > 0 and r.threads_s >= 0 for r in result.roles)
    if backend in ("rest", "grpc"):  # their servers' threads receive the frames
        assert sum(r.threads_s for r in result.of("detector")) > 0
    if backend == "cdi-shm":
        assert result.minion_cpu_s is not None
        assert _objects(minion) == 0  # the ring came back and was freed


def test_a_detector_killed_mid_run_fails_the_run_and_frees_the_ring(
    video: Path, base: RunConfig, minion: MinionChild
) -> None:
    long_video = video.with_name("long.mp4")
    make_sample_video(long_video, SampleVideo(frames=60))
    config = replace(base, backend="cdi-shm", video=str(long_video), run_id="ar-kill", timeout_s=5)
    # Until frames reach the combinator: the run is under way.
    failed = kill_a_detector_mid_run(config, (), lambda: _flowing(minion, "ar-kill-combinator"))
    assert failed.role == "detector 1" and "exit status -9" in str(failed)
    deadline = time.monotonic() + 5
    while _objects(minion) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _objects(minion) == 0


def test_a_bad_video_fails_the_run_with_the_reason(base: RunConfig, tmp_path: Path) -> None:
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\0" * 4096)
    with pytest.raises(RoleFailed, match="not a video"):
        run_pipeline(replace(base, backend="tcp", video=str(junk)))
