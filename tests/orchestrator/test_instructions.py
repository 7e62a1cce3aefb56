"""What the scheduler tells a worker for a step on the ``cdi`` plane (pure, no services): here,
the last step of an affinity run that reads an image its worker holds in memory."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, cast

from cdi import ObjectKey
from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler import progress
from orchestrator.scheduler.claims import with_input_fetch
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Datum, Mode, Obj
from orchestrator.scheduler.planes.cdi import CdiPlane
from orchestrator.scheduler.runs import RunState, StepSpec
from orchestrator.settings import load_settings
from workflows.graph import build_graph
from workflows.kinds import Kind


def _chain(tmp_path: Path) -> tuple[RunState, ObjectStore]:
    steps: list[dict[str, Any]] = [
        {"ref": "a", "task": "deblur"},
        {"ref": "b", "task": "classify", "depends_on": ["a"]},
    ]
    graph = with_input_fetch(build_graph(steps, lambda name: None))
    specs = {r: StepSpec(r, n.task, f"m:{n.task}", 30.0, 2, 0.1)
             for r, n in graph.nodes.items() if n.task}  # fmt: skip
    run = RunState(uuid.uuid4(), Policy.AFFINITY, DataPlane.CDI, graph, specs, "s3://bkt/in.jpg")
    settings = load_settings(
        data_dir=tmp_path, s3_endpoint_url="http://127.0.0.1:9", s3_bucket="bkt"
    )
    return run, ObjectStore(settings)


def _last(run: RunState, objects: ObjectStore, *, held: str) -> dict[str, object]:
    progress.settle(run)
    obj = run.objects[ObjectKey("k1")] = Obj(ObjectKey("k1"), Kind.IMAGE, 100, "worker-1")
    obj.held = held  # a's image, newer than k1, in worker-1's memory (or written into k1)
    [b] = progress.done(
        run, run.steps["a"], {"image": Datum(key=ObjectKey("k1"), kind=Kind.IMAGE)}, {}
    ).ready
    b.modes = {ObjectKey("k1"): Mode.OWN}
    nothing = cast(Any, None)  # an instruction reads the scheduler's id and the object store
    ctx = SchedulerContext("scheduler-1", nothing, nothing, nothing, objects)
    ins = CdiPlane().instruction(ctx, run, b, 7, 0.0, keep=False)
    return {"key": ins.key, "held": ins.held, "output_key": ins.output_key,
            "output_uri": ins.output_uri}  # fmt: skip


def test_the_last_step_on_a_held_image_names_where_a_failed_attempt_writes_it(
    tmp_path: Path,
) -> None:
    """If storing the result fails (S3 did not answer), the worker writes the image it held
    into ``output_key`` for the retry, instead of losing it and so running ``a`` again."""
    run, objects = _chain(tmp_path)
    ins = _last(run, objects, held="5")
    assert (ins["key"], ins["held"]) == ("k1", "5")
    assert str(ins["output_uri"]).endswith(f"{run.workflow_id}.png")
    assert ins["output_key"] and ins["output_key"] != "k1"


def test_the_last_step_on_an_object_needs_no_output_key(tmp_path: Path) -> None:
    run, objects = _chain(tmp_path)
    ins = _last(run, objects, held="")
    assert (ins["key"], ins["held"], ins["output_key"]) == ("k1", "", "")
