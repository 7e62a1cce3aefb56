"""The AR application across two hosts: extractor and combinator on one, the detectors on the
other, frames crossing the link between them over every backend (CDI-RPC through the minions'
gateways). The output is checked frame by frame against the single-process run."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import cdi
from apps.ar.config import RunConfig
from apps.ar.launch import PipelineResult, run_floor, run_pipeline
from apps.ar.links.cdi_link import combinator_id
from apps.ar.runtime import prepare
from cdi.hosts import HostNetwork
from tests.apps.ar_checks import assert_like_reference, config_for, kill_a_detector_mid_run
from tests.cdi.test_bench_and_demo import run_cli
from workflows.ar.sample import SampleVideo, make_sample_video

FRAMES = 10


@pytest.fixture(scope="module")
def network() -> Iterator[HostNetwork]:
    with HostNetwork.create(2) as made:
        yield made


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    video = make_sample_video(tmp_path_factory.mktemp("ar") / "in.mp4", SampleVideo(frames=FRAMES))
    return config_for(video, timeout_s=30)


@pytest.fixture(scope="module")
def reference(base: RunConfig, tmp_path_factory: pytest.TempPathFactory) -> PipelineResult:
    out = tmp_path_factory.mktemp("floor") / "floor.mp4"
    return run_floor(replace(base, output=str(out), detectors=1))


def _namespace(host_namespace: str | None) -> int:
    path = f"/run/netns/{host_namespace}" if host_namespace else "/proc/self/ns/net"
    return os.stat(path).st_ino


def _objects(sockets: list[str]) -> list[dict[str, object]]:
    found = []
    for socket_path in sockets:
        with cdi.Client(socket_path) as probe_client:
            found += probe_client.list_objects()
    return found


def _objects_left(sockets: list[str], within_s: float = 10) -> list[object]:
    """The objects still on the minions of ``sockets`` after at most ``within_s``."""
    deadline = time.monotonic() + within_s
    while _objects(sockets) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [o["key"] for o in _objects(sockets)]


@pytest.mark.parametrize("backend", ["tcp", "rest", "grpc", "cdi-rpc"])
def test_frames_cross_hosts_and_the_output_is_the_reference_frame_by_frame(
    backend: str,
    network: HostNetwork,
    base: RunConfig,
    reference: PipelineResult,
    tmp_path: Path,
) -> None:
    out = tmp_path / f"{backend}.mp4"
    config = replace(base, backend=backend, output=str(out), run_id=f"ar-hosts-{backend}")
    with prepare(config, network, ("--busy-poll-us", "0")) as ready:
        assert ready.config.hosts == 2
        result = run_pipeline(ready.config, ready.runtime_pids)
        if backend == "cdi-rpc":
            sockets = sorted({ready.config.minion_for(role) for role in ("extractor", "detector")})
            assert len(sockets) == 2  # a minion on each host
            assert _objects_left(sockets) == []  # the ring came home and was freed

    assert_like_reference(result, reference, out, FRAMES)
    # Each role ran on its host: the detectors on the second, the others on the first.
    first, second = (_namespace(h.namespace) for h in network.hosts[:2])
    if network.kind == "netns":
        assert first != second
    for role in result.roles:
        assert role.network_namespace == (second if role.role == "detector" else first), role.role
    if backend == "cdi-rpc":
        # The runtime of both hosts (minions, gateways, the controller) counts as a role.
        assert result.minion_cpu_s is not None and result.minion_cpu_s > 0
        assert "minion" in result.peak_rss_mb()


def test_a_detector_killed_on_the_other_host_fails_the_run_and_frees_the_ring(
    network: HostNetwork, base: RunConfig, tmp_path: Path
) -> None:
    video = make_sample_video(tmp_path / "long.mp4", SampleVideo(frames=60))
    config = replace(
        base, backend="cdi-rpc", video=str(video), run_id="ar-hosts-kill", timeout_s=5, depth=1
    )
    with prepare(config, network, ("--busy-poll-us", "0")) as ready:
        sockets = sorted({ready.config.minion_for(role) for role in ("extractor", "detector")})
        combinator = combinator_id(ready.config)

        def under_way() -> bool:  # frames have crossed back to the combinator
            return any(o["owner"] == combinator for o in _objects(sockets))

        failed = kill_a_detector_mid_run(ready.config, ready.runtime_pids, under_way)
        assert failed.role == "detector 1" and "exit status -9" in str(failed)
        # The dead detector's objects went back across the link by the recovery rule, and
        # every object of the ring is gone from both hosts: the first host's gateway, their
        # recovery container there, finds the extractor gone and reclaims them, waiting a
        # registration lag (5 s) per object for the container to appear elsewhere first.
        assert _objects_left(sockets, within_s=30) == []


def test_bench_ar_across_hosts_prints_cdi_rpc_rows(tmp_path: Path) -> None:
    done = run_cli(
        "bench", "ar", "--hosts", "2", "--frames", "4", "--detectors", "1",
        "--backends", "tcp,cdi-rpc", "--data-dir", str(tmp_path), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["hosts"]["count"] == 2 and doc["hosts"]["kind"] in ("netns", "loopback")
    assert doc["hosts"]["placement"] == {
        "extractor": "host1", "combinator": "host1", "detector": "host2",
    }  # fmt: skip
    rows = {r["backend"]: r for r in doc["results"]}
    assert set(rows) == {"floor", "pool", "tcp", "cdi-rpc"}
    assert set(rows["cdi-rpc"]["cpu_ms_per_frame"]) == {
        "extractor", "detector", "combinator", "minion",
    }  # fmt: skip
    assert rows["cdi-rpc"]["fps"] > 0 and rows["cdi-rpc"]["cpu_ms_per_frame_moving"] is not None
    for name in ("tcp", "cdi-rpc"):  # measured where spent, none below zero, adding up
        parts = [rows[name][f"cpu_ms_per_frame_{p}"] for p in ("compute", "moving", "other")]
        assert min(parts) >= 0, rows[name]
        assert sum(parts) == pytest.approx(sum(rows[name]["cpu_ms_per_frame"].values()))
    # Where CDI-RPC's moving part is spent: each host's minion (its gateway inside) and the
    # launcher beside it that relays its directory events, the controller.
    (parts,) = [r["cpu_ms_per_frame"] for r in doc["moving_by_part"] if r["backend"] == "cdi-rpc"]
    hosts = {f"minion host {i}{relay}" for i in (0, 1) for relay in ("", " relay")}
    assert {*hosts, "controller", "detector link"} <= set(parts)
    assert sum(parts.values()) == pytest.approx(rows["cdi-rpc"]["cpu_ms_per_frame_moving"])
    assert [(g["backend"], g["detectors"]) for g in doc["goals"]] == [("cdi-rpc", 1)]
    assert "moving_vs_tcp" in doc["goals"][0]
