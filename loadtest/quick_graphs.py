"""Workflow graphs in ``cdiflow bench workflows --quick``: what an extra branch and an extra
fan-out element cost the orchestrator, and a tiled fan-out beside a process pool.

* *Per-branch overhead*: dataless no-op fork/joins (``src``, then ``width`` no-op branches
  reading its output, then a join of all of theirs; ``workflows.fanout_tasks``: small JSON
  values in the messages, no object) of ``FORK_WIDTHS``, run one at a time; the figure is the
  slope of a least-squares line through their p50 latencies (ms per extra branch).
* *Per-element overhead*: dataless no-op fan-outs (``spread`` a list of n numbers, a
  ``pass_item`` step per element, ``gather`` them in order) of ``FAN_SIZES``; at each size
  above 1 the figure is ``(p50(n) - p50(1)) / (n - 1)``.
* *Tiled fan-out*: a ``TILE_BYTES`` JPEG cut into ``TILE_GRID`` x ``TILE_GRID`` tiles, each
  blurred by its own step run (``workflows.fanout_tasks``), stitched back. Its fan-out span
  (the cut's end to the last tile's end, from the task runs' timestamps) is set beside the
  floor: the same ``blur_tile`` over the same tiles in a process pool of as many processes as
  the stack has workers (``pool.map``, tiles pickled there and back, pool started and warm).
  ``share_of_floor`` = floor / span: 1.0 means the fan-out costs nothing over the pool.

Only the CDI planes run graphs (the object-store plane carries one chain).
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from PIL import Image

from cdiflow.client import Client
from cdiflow.client.models import WorkflowDetail
from loadtest import cdiflow_api
from loadtest.cdiflow_api import latency_ms, unix
from workflows import fanout_tasks, imagebuf
from workflows.api import TaskContext
from workflows.memory import tune_for_images

__all__ = [
    "FAN_SIZES",
    "FORK_WIDTHS",
    "GRAPH_SYSTEMS",
    "GraphRow",
    "TileRow",
    "measure_graphs",
    "measure_tiles",
]

GRAPH_SYSTEMS: Final = ("affinity", "transfer", "auto")  # the systems that run graphs
FORK_WIDTHS: Final = (1, 2, 4, 8)
FAN_SIZES: Final = (1, 16, 256)
TILE_GRID: Final = 4  # 16 tiles
TILE_BYTES: Final = 2_000_000
_TASKS: Final = ("spread", "pass_item", "gather", "merge", "tiles", "blur_tile", "stitch")


@dataclass
class GraphRow:
    system: str
    n: int
    fork_join_p50_ms: dict[int, float] = field(default_factory=dict)  # width -> p50
    per_branch_ms: float = 0.0
    fan_out_p50_ms: dict[int, float] = field(default_factory=dict)  # elements -> p50
    per_element_ms: dict[int, float] = field(default_factory=dict)  # elements -> ms

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TileRow:
    system: str
    image_bytes: int
    pixels: int
    tiles: int
    workers: int
    n: int
    fan_out_p50_ms: float  # the cut's end -> the last tile's end
    tile_run_p50_ms: float  # summed run_ms of the tile steps
    latency_p50_ms: float  # the whole workflow (input, cut, tiles, stitch, result)
    floor_p50_ms: float  # pool.map of the same tiles
    share_of_floor: float  # floor / fan-out span

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fork_join(api: Client, width: int) -> str:
    name = f"noop_fork_join_{width}"
    branches = [f"b{i}" for i in range(width)]
    steps: list[dict[str, Any]] = [{"ref": "src", "task": "spread", "params": {"n": 1}}]
    steps += [{"ref": b, "task": "pass_item", "inputs": {"item": "src.items"}} for b in branches]
    steps.append({"ref": "join", "task": "merge", "inputs": {b: f"{b}.item" for b in branches}})
    return cdiflow_api.ensure_definition(api, {"name": name, "tasks": steps})


def _fan_out(api: Client, elements: int) -> str:
    name = f"noop_fan_out_{elements}"
    return cdiflow_api.ensure_definition(api, {"name": name, "tasks": [
        {"ref": "spread", "task": "spread", "params": {"n": elements}},
        {"ref": "pass", "task": "pass_item", "inputs": {"item": "spread.items"},
         "for_each": "item"},
        {"ref": "gather", "task": "gather", "inputs": {"items": "pass.item"}},
    ]})  # fmt: skip


def _tiled(api: Client) -> str:
    name = f"tiled_blur_{TILE_GRID * TILE_GRID}"
    return cdiflow_api.ensure_definition(api, {"name": name, "tasks": [
        {"ref": "split", "task": "tiles", "params": {"n": TILE_GRID}},
        {"ref": "blur", "task": "blur_tile", "inputs": {"tile": "split.tiles"},
         "for_each": "tile"},
        {"ref": "join", "task": "stitch", "inputs": {"tiles": "blur.tile", "grid": "split.grid"}},
    ]})  # fmt: skip


def _runs(
    api: Client, name: str, image: str | None, system: str, repeat: int
) -> list[WorkflowDetail]:
    cdiflow_api.run(api, name, image, system)  # warm-up
    details = [cdiflow_api.run(api, name, image, system) for _ in range(repeat)]
    failed = [d for d in details if d.status != "COMPLETED"]
    if failed:
        raise RuntimeError(f"{system} {name}: {len(failed)} failed, e.g. {failed[0].error}")
    return details


def _p50(
    api: Client, name: str, system: str, repeat: int, expect: dict[str, Any] | None = None
) -> float:
    """p50 latency (ms) of ``repeat`` dataless runs, each checked to output ``expect``."""
    details = _runs(api, name, None, system, repeat)
    for d in details:
        output = d.output or {}
        if expect and {k: output.get(k) for k in expect} != expect:
            raise RuntimeError(f"{system} {name}: output {output}, expected {expect}")
    return round(statistics.median(latency_ms(d) for d in details), 2)


def register_tasks(api: Client) -> None:
    """Register the bundled fan-out tasks the graph rows run."""
    for name in _TASKS:
        cdiflow_api.ensure_task(api, name, f"workflows.fanout_tasks:{name}")


def measure_graphs(
    api: Client,
    systems: Sequence[str],
    repeat: int,
    progress: Callable[[str], None] = lambda _: None,
) -> list[GraphRow]:
    """A fork/join and fan-out row per system (see the module's doc)."""
    register_tasks(api)
    forks = {w: _fork_join(api, w) for w in FORK_WIDTHS}
    fans = {n: _fan_out(api, n) for n in FAN_SIZES}
    rows = []
    for system in systems:
        began = time.monotonic()
        row = GraphRow(system=system, n=repeat)
        row.fork_join_p50_ms = {
            w: _p50(api, name, system, repeat, {"count": w}) for w, name in forks.items()
        }
        widths = list(row.fork_join_p50_ms)
        fit = statistics.linear_regression(widths, [row.fork_join_p50_ms[w] for w in widths])
        row.per_branch_ms = round(fit.slope, 2)
        row.fan_out_p50_ms = {
            n: _p50(api, name, system, repeat, {"count": n, "in_order": True})
            for n, name in fans.items()
        }
        one = row.fan_out_p50_ms[FAN_SIZES[0]]
        row.per_element_ms = {
            n: round((p50 - one) / (n - FAN_SIZES[0]), 3)
            for n, p50 in row.fan_out_p50_ms.items()
            if n > FAN_SIZES[0]
        }
        rows.append(row)
        progress(f"  {system:<13} {'fork/join, fan-out':<15} {time.monotonic() - began:5.1f} s")
    return rows


def _blur(tile: Image.Image) -> Image.Image:
    """``blur_tile`` in a pool process."""
    blurred: Image.Image = fanout_tasks.blur_tile(tile, TaskContext("blur_tile"))["tile"]
    return blurred


def _init_pool() -> None:
    tune_for_images()  # as the stack's workers do


def _floor_ms(image_bytes: bytes, workers: int, repeat: int) -> tuple[float, int]:
    """p50 ms of ``blur_tile`` over the image's tiles in a warm pool; and the pixel count."""
    image = imagebuf.decode_bytes(image_bytes)
    cut = fanout_tasks.tiles(image, TaskContext("tiles", params={"n": TILE_GRID}))["tiles"]
    # Spawned, not forked: the benchmark's process has native threads a fork copies half-way.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_pool) as pool:
        list(pool.map(_blur, cut))  # warm-up: processes started, modules imported
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            list(pool.map(_blur, cut))
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), image.width * image.height


def _fan_out_span_ms(detail: WorkflowDetail) -> float:
    runs = detail.task_runs
    [cut] = [r for r in runs if r.ref == "split" and r.status == "COMPLETED"]
    tiles = [r for r in runs if r.ref.startswith("blur[") and r.status == "COMPLETED"]
    if len(tiles) != TILE_GRID * TILE_GRID:
        raise RuntimeError(f"{detail.id}: {len(tiles)} tile runs completed, not 16")
    return (max(unix(r.finished_at) for r in tiles) - unix(cut.finished_at)) * 1000


def measure_tiles(
    api: Client,
    systems: Sequence[str],
    image: str,
    image_bytes: bytes,
    workers: int,
    repeat: int,
    progress: Callable[[str], None] = lambda _: None,
) -> list[TileRow]:
    """A tiled fan-out row per system, each beside one floor measured first."""
    register_tasks(api)
    name = _tiled(api)
    floor, pixels = _floor_ms(image_bytes, workers, repeat)
    rows = []
    for system in systems:
        began = time.monotonic()
        details = _runs(api, name, image, system, repeat)
        span = statistics.median(_fan_out_span_ms(d) for d in details)
        tile_run = [
            sum(r.run_ms or 0.0 for r in d.task_runs if r.ref.startswith("blur[")) for d in details
        ]
        rows.append(
            TileRow(
                system=system,
                image_bytes=len(image_bytes),
                pixels=pixels,
                tiles=TILE_GRID * TILE_GRID,
                workers=workers,
                n=repeat,
                fan_out_p50_ms=round(span, 1),
                tile_run_p50_ms=round(statistics.median(tile_run), 1),
                latency_p50_ms=round(statistics.median(latency_ms(d) for d in details), 1),
                floor_p50_ms=round(floor, 1),
                share_of_floor=round(floor / span, 3) if span > 0 else 0.0,
            )
        )
        progress(f"  {system:<13} {'tiled fan-out':<15} {time.monotonic() - began:5.1f} s")
    return rows
