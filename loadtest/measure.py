"""One system at one point: run it, meter it, check its results; and the warm-up before.

``Measurement.point`` runs a point (closed or open loop), meters every component's CPU and
memory over it, summarises its workflow records and checks the results the system stored
(``loadtest.verify``) before the system clears them. ``Measurement.warm_up`` brings a freshly
started system to its working state first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from PIL import Image

from loadtest.plan import Point
from loadtest.resources import ResourceMeter
from loadtest.stats import PointResult, summarize_point, window
from loadtest.systems.base import Inputs, System
from loadtest.systems.services import BenchServices
from loadtest.verify import ReferenceBook, verify_point

__all__ = ["STEADY_WITHIN", "Measurement", "in_flight_bytes"]

# Warming until steady: batches of small workflows until two in a row run within this share
# of each other's throughput, at most ``_STEADY_BATCHES`` of ``_STEADY_ROUNDS`` each per user.
STEADY_WITHIN: Final = 0.10
_STEADY_BATCHES: Final = 8
_STEADY_ROUNDS: Final = 3


def in_flight_bytes(points: Sequence[Point], paths: dict[int, Path]) -> int:
    """The most decoded-image bytes any point holds at once: a workflow in flight holds one
    image between tasks (a point of mixed sizes: their mean). Read from the JPEG headers."""
    pixels = {}
    for size, path in paths.items():
        with Image.open(path) as img:
            pixels[size] = img.width * img.height * len(img.getbands())
    most = 0
    for p in points:
        mean = sum(pixels[s] for s in p.sizes) / len(p.sizes)
        most = max(most, int(p.concurrency * mean))
    return most


class Measurement:
    """What every point of a run shares: its services, inputs, references and S3 link."""

    def __init__(
        self,
        services: BenchServices,
        inputs: Inputs,
        references: ReferenceBook,
        link: str,
        echo: Callable[[str], None],
    ) -> None:
        self.services = services
        self.inputs = inputs
        self.references = references
        self.link = link
        self.echo = echo
        self.meter = ResourceMeter()

    def warm_up(self, system: System, largest: int, smallest: int, parallel: int) -> None:
        """As the points will run: the largest images, as many in flight. *Why:* the first
        workflows import modules, fill pools and grow every process's memory to its working
        size. A system with a JIT compiler (``warm_until_steady``) then runs batches of the
        smallest images, whose pace is all orchestration, until its throughput holds."""
        system.run_point(Point("warm-up", (largest,), 3, parallel, 1), self.inputs)
        system.after_point()
        system.point_stats()  # the warm-up's own, not the first point's
        if not system.warm_until_steady:
            return
        batch = Point("warm-up", (smallest,), 3, parallel, _STEADY_ROUNDS)
        previous = 0.0
        for n in range(1, _STEADY_BATCHES + 1):
            records = system.run_point(batch, self.inputs)
            system.after_point()
            system.point_stats()
            pace = summarize_point(
                records, system=system.name, scenario="warm-up", size=smallest, tasks=3,
                concurrency=parallel, link=self.link,
            ).throughput_wps  # fmt: skip
            self.echo(f"   warm-up batch {n}: {pace:.2f} wf/s")
            if previous and abs(pace / previous - 1) <= STEADY_WITHIN:
                return
            previous = pace
        self.echo(f"   not steady after {_STEADY_BATCHES} batches; measuring all the same")

    def point(self, system: System, point: Point, round_no: int) -> PointResult:
        self.meter.start()
        records = system.run_point(point, self.inputs)
        used = self.meter.stop(len(records), system.client_usage())
        result = summarize_point(
            records,
            system=system.name,
            scenario=point.scenario,
            size=point.size,
            tasks=point.tasks,
            concurrency=point.concurrency,
            link="none" if system.name == "floor" else self.link,
        )
        span = window(records)
        busy = system.workers_busy(*span) if span else {}
        ops = system.ops_cpu_ms(records, *span) if span else None
        verified: dict[str, Any] = {"ok": True, "note": "stores no results"}
        if system.results_prefix:
            lossy = system.intermediates_via_s3
            references = self.references.for_point(
                point.sizes, point.tasks, system.ctx.intermediate if lossy else "raw"
            )
            verified = verify_point(
                self.services.running, system.results_prefix, records, references
            )
        result = dataclasses.replace(
            result,
            resources=used,
            round=round_no,
            workers_busy=busy,
            ops_cpu_ms_per_workflow=(
                round(ops / result.completed, 2) if ops is not None and result.completed else None
            ),
            arrival_rate_wps=point.arrival_rate or None,
            load=point.load,
            verified=verified,
            peer_stats=system.point_stats(),
        )
        system.after_point()
        self.echo(
            f"   {point.label():<24} {result.completed}/{point.workflows} done, "
            f"p50 {result.p50_latency_s:.3f} s, {result.throughput_wps:.2f} wf/s"
            + (f", notice p50 {result.notice_p50_ms:.1f} ms" if result.notice_p50_ms else "")
            + (f", workers busy {_shares(busy)}" if busy else "")
            + _spilled(result.peer_stats)
            + ("" if verified["ok"] else f", RESULTS WRONG: {verified['problems'][0]}")
            + (f", errors: {result.errors[0]}" if result.errors else "")
        )
        return result


def _shares(busy: dict[str, float]) -> str:
    return ", ".join(f"{worker} {share:.0%}" for worker, share in busy.items())


def _spilled(stats: dict[str, Any]) -> str:
    spilled = stats.get("spilled_bytes")
    return "" if spilled is None else f", object store spilled {spilled / 2**20:.0f} MiB"
