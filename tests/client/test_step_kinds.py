"""Every kind of step through the real API, from Python and from the command line: a definition
applied, listed, shown (and the shown JSON applied again: no new version), its versions drawn
as the graph they are, and run to completion."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from cdiflow.cli import main
from cdiflow.client import Client, as_data
from orchestrator.contract.vocabulary import TaskRunStatus, WorkflowStatus
from orchestrator.schemas import WorkflowDefinitionSave as Save
from tests.client.conftest import StackApi, unique

# The steps of each kind, and a row `definitions versions` draws for them (STEP, AFTER, DOES).
KINDS: dict[str, tuple[list[dict[str, Any]], str]] = {
    "task": (
        [{"ref": "sharpen", "task": "deblur", "params": {"radius": 2}},
         {"ref": "label", "task": "classify", "depends_on": ["sharpen"]}],
        r"label +sharpen +task classify",
    ),
    "fork_join": (
        [{"ref": "sharpen", "task": "deblur"},
         {"ref": "smooth", "task": "denoise"},
         {"ref": "blend", "task": "blend",
          "inputs": {"sharp": "sharpen.image", "smooth": "smooth.image"}},
         {"ref": "label", "task": "classify", "depends_on": ["blend"]}],
        r"blend +sharpen, smooth +task blend, reads sharp=sharpen.image, smooth=smooth.image",
    ),
    "switch": (
        [{"ref": "label", "task": "classify"},
         {"ref": "route", "switch": "label.label", "cases": {"dark": ["brighten"]},
          "default": ["keep"]},
         {"ref": "brighten", "task": "deblur", "inputs": {"image": "label.image"}},
         {"ref": "keep", "task": "denoise", "inputs": {"image": "label.image"}},
         {"ref": "out", "task": "classify", "inputs": {"image": ["brighten.image", "keep.image"]}}],
        r"route +label +switch on label.label: dark -> brighten; otherwise keep",
    ),
    "for_each": (
        [{"ref": "split", "task": "tiles", "params": {"n": 2}},
         {"ref": "blur", "task": "blur_tile", "inputs": {"tile": "split.tiles"},
          "for_each": "tile"},
         {"ref": "join", "task": "stitch", "inputs": {"tiles": "blur.tile", "grid": "split.grid"}}],
        r"blur +split +task blur_tile, reads tile=split.tiles, once per element of tile",
    ),
    "sub_workflow": (
        [{"ref": "pre", "task": "deblur"},
         {"ref": "enhance", "workflow": "image_pipeline", "depends_on": ["pre"]},
         {"ref": "post", "task": "denoise", "inputs": {"image": "enhance.image"}}],
        r"enhance +pre +sub-workflow image_pipeline",
    ),
    "streaming": (  # two steps at once: the stack's two workers have a slot each
        [{"ref": "count", "task": "stream_count", "channels": {"publish": ["n"]},
          "params": {"to": "n"}},
         {"ref": "total", "task": "stream_total", "channels": {"subscribe": ["n"]},
          "params": {"from": "n"}}],
        r"total +- +task stream_total, streaming: subscribes to n",
    ),
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def fan_out_tasks(stack_api: StackApi) -> None:
    """The bundled fan-out tasks, which the stack's workers load but nothing registers."""
    with stack_api.client() as api:
        for name in ("tiles", "blur_tile", "stitch"):
            api.register_task(name, f"workflows.fanout_tasks:{name}")


def cli(stack_api: StackApi, *args: str | Path, code: int = 0) -> Result:
    result = CliRunner().invoke(main, [*(str(a) for a in args), *stack_api.cli_args()])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def _given_fields_kept(sent: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    """Every field of every step sent comes back as it was sent."""
    assert [s["ref"] for s in got] == [s["ref"] for s in sent]
    for mine, stored in zip(sent, got, strict=True):
        assert {k: stored.get(k) for k in mine} == mine, stored


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_step_kind_round_trips_through_the_client(api: Client, kind: str, photo: Path) -> None:
    steps, _row = KINDS[kind]
    name = unique(f"kind_{kind}")
    saved = api.apply_definition({"name": name, "description": kind, "tasks": steps})
    assert saved.version == 1
    _given_fields_kept(steps, as_data(saved.tasks))
    listed = {d.name: d for d in api.definitions()}
    _given_fields_kept(steps, as_data(listed[name].tasks))
    # What the API answered, saved again: the same definition, no new version.
    assert api.apply_definition(api.definition(name)).version == 1
    assert [v.version for v in api.definition_versions(name)] == [1]
    run = api.run(name, photo, timeout=180)
    assert run.status == WorkflowStatus.COMPLETED, run.error
    # Fan-out copies are "<ref>[i]", a sub-workflow's steps "<ref>/<step>"; "input" loads the
    # image that several first steps read.
    ran = {r.ref.split("[")[0].split("/")[0] for r in run.task_runs} - {"input"}
    assert ran == {s["ref"] for s in steps}, ran
    if kind == "switch":  # one side ran, the other was skipped
        sides = {r.ref: r.status for r in run.task_runs if r.ref in ("brighten", "keep")}
        assert sorted(sides.values()) == [TaskRunStatus.COMPLETED, TaskRunStatus.SKIPPED]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_step_kind_round_trips_through_the_commands(
    stack_api: StackApi, kind: str, photo: Path, tmp_path: Path
) -> None:
    steps, row = KINDS[kind]
    name = unique(f"cli_{kind}")
    written = tmp_path / f"{name}.yaml"
    written.write_text(yaml.safe_dump({"name": name, "description": kind, "tasks": steps}))
    assert f"{name}: created, version 1" in cli(stack_api, "definitions", "apply", written).output

    listed = cli(stack_api, "definitions", "list").output
    assert re.search(rf"^{name} +1 +\S", listed, re.M), listed
    as_json = json.loads(cli(stack_api, "definitions", "list", "--json").output)
    _given_fields_kept(steps, next(d for d in as_json if d["name"] == name)["tasks"])

    shown = cli(stack_api, "definitions", "show", name)
    assert shown.stderr == f"# {name} version 1\n"
    definition = json.loads(shown.stdout)
    # What a user may set, and nothing the API sets itself (version, times).
    assert {"name", "description", "tasks"} <= set(definition) <= set(Save.model_fields)
    assert definition["description"] == kind
    _given_fields_kept(steps, definition["tasks"])
    again = tmp_path / "shown.json"
    again.write_text(shown.stdout)
    assert f"{name}: unchanged, version 1" in cli(stack_api, "definitions", "apply", again).output

    versions = cli(stack_api, "definitions", "versions", name).output
    assert versions.startswith("version 1, saved "), versions
    assert re.search(rf"^  {row}", versions, re.M), versions
    drawn = [line.split()[0] for line in versions.splitlines()[2:]]
    assert sorted(drawn) == sorted(s["ref"] for s in steps), versions

    ran = cli(stack_api, "run", name, "--input", photo, "--wait")
    assert re.search(rf"COMPLETED in [\d.]+ s: {name} v1", ran.output), ran.output
