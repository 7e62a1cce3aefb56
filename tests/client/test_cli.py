"""Every API command of ``cdiflow`` (``run``, ``workflows``, ``tasks``, ``definitions``)
against a real stack, as a person types them."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from PIL import Image

from cdiflow.cli import main
from tests.client.conftest import SLEEPER, StackApi, unique

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture
def cdiflow(stack_api: StackApi) -> CliRunnerCommand:
    return CliRunnerCommand(stack_api)


class CliRunnerCommand:
    """``cdiflow ...`` pointed at the test stack."""

    def __init__(self, stack_api: StackApi) -> None:
        self.stack_api = stack_api

    def __call__(self, *args: str | Path, code: int = 0) -> Result:
        command, *rest = (str(a) for a in args)
        groups = {"workflows", "tasks", "definitions", "schedules", "webhooks"}
        head = [command, rest.pop(0)] if command in groups and rest else [command]
        result = CliRunner().invoke(main, [*head, *rest, *self.stack_api.cli_args()])
        assert result.exit_code == code, (result.output, result.exception)
        return result


def test_run_waits_showing_each_step_and_saves_the_result(
    cdiflow: CliRunnerCommand, photo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "result.png"
    result = cdiflow("run", "image_pipeline", "--input", photo, "--policy", "transfer",
                     "--out", out)  # fmt: skip
    text = result.output
    assert f"uploading {photo}" in text and re.search(f"run {UUID}", text)
    for step in ("deblur", "denoise", "classify"):
        assert re.search(rf"\d+\.\d\ds  {step} +done +on worker-\d", text), text
    assert "COMPLETED in" in text and "label=warm" in text and f"saved the result to {out}" in text
    with Image.open(out) as image, Image.open(photo) as original:
        assert (image.format, image.size) == ("PNG", original.size)


def test_run_without_waiting_then_show_events_result_and_list(
    cdiflow: CliRunnerCommand, photo: Path, tmp_path: Path
) -> None:
    started = cdiflow("run", "image_pipeline", "-i", photo, "--format", "jpeg")
    run_id = re.search(f"run ({UUID})", started.output)
    assert run_id, started.output
    shown = cdiflow("workflows", "show", run_id[1], "--wait")
    assert "COMPLETED" in shown.output and re.search(r"classify +1 +COMPLETED", shown.output)
    events = [json.loads(line) for line in cdiflow("workflows", "events", run_id[1]).output
              .splitlines()]  # fmt: skip
    assert events[0]["kind"] == "workflow.created"
    out = tmp_path / "r.jpg"
    saved = cdiflow("workflows", "result", run_id[1], "-o", out)
    assert f"to {out}" in saved.output and out.read_bytes()[:2] == b"\xff\xd8"
    listed = cdiflow("workflows", "list", "--workflow", "image_pipeline", "--json")
    assert run_id[1] in {w["id"] for w in json.loads(listed.output)["items"]}
    table = cdiflow("workflows", "list", "--status", "completed", "--limit", "3")
    assert table.output.startswith("ID ") and "image_pipeline v1" in table.output


def test_cancel_and_retry(cdiflow: CliRunnerCommand) -> None:
    started = json.loads(cdiflow("run", SLEEPER, "--json").output)
    cancelled = cdiflow("workflows", "cancel", started["id"])
    assert f"run {started['id']} is CANCELLED" in cancelled.output
    again = cdiflow("workflows", "cancel", started["id"], code=1)
    assert "already finished" in again.output
    retried = cdiflow("workflows", "retry", started["id"])
    new_id = re.search(f"as run ({UUID})", retried.output)
    assert new_id, retried.output
    cdiflow("workflows", "cancel", new_id[1])


def test_tasks_and_definitions(cdiflow: CliRunnerCommand, tmp_path: Path) -> None:
    task = unique("cli_deblur")
    registered = cdiflow("tasks", "register", "workflows.image_tasks:deblur", "--name", task,
                         "--timeout-s", "7")  # fmt: skip
    assert f"registered task {task}" in registered.output and "timeout 7 s" in registered.output
    assert task in cdiflow("tasks", "list").output

    flow = unique("cli_flow")
    path = tmp_path / "flow.yaml"
    path.write_text(f"name: {flow}\ntasks:\n  - ref: d\n    task: {task}\n")
    assert f"{flow}: created, version 1" in cdiflow("definitions", "apply", path).output
    assert f"{flow}: unchanged, version 1" in cdiflow("definitions", "apply", path).output
    as_json = tmp_path / "flow.json"
    as_json.write_text(
        json.dumps(
            {
                "name": flow,
                "tasks": [
                    {"ref": "d", "task": task},
                    {"ref": "c", "task": "classify", "depends_on": ["d"]},
                ],
            }
        )
    )
    assert f"{flow}: saved, version 2" in cdiflow("definitions", "apply", as_json).output
    versions = cdiflow("definitions", "versions", flow).output
    assert re.search(r"^version 2, saved .*: d -> c$", versions, re.M), versions
    assert re.search(r"^version 1, saved .*: d$", versions, re.M), versions
    first = cdiflow("definitions", "show", flow, "--version", "1")
    assert first.stderr == f"# {flow} version 1\n"
    assert json.loads(first.stdout) == {"name": flow, "description": "", "tasks": [
        {"ref": "d", "task": task, "depends_on": [], "params": {}}]}  # fmt: skip
    assert flow in cdiflow("definitions", "list").output

    refused = cdiflow("tasks", "delete", task, code=1)
    assert "used by workflow definition" in refused.output
    assert "deleted workflow definition" in cdiflow("definitions", "delete", flow).output
    assert f"deleted task {task}" in cdiflow("tasks", "delete", task).output


def test_mistakes_get_a_message_and_a_failing_status(
    cdiflow: CliRunnerCommand, photo: Path, tmp_path: Path
) -> None:
    unknown = cdiflow("run", "no_such_flow", "-i", photo, code=1)
    assert "workflow 'no_such_flow' not found; known:" in unknown.output
    assert "uploading" not in unknown.output  # refused before the upload
    failed = cdiflow("run", "image_pipeline", "-i", "s3://cdiflow/none.jpg", "--wait", code=1)
    assert "FAILED" in failed.output and "does not exist" in failed.output
    missing = cdiflow("run", "image_pipeline", "-i", tmp_path / "nope.jpg", code=2)
    assert "is not a file" in missing.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert "is not valid yaml" in cdiflow("definitions", "apply", broken, code=2).output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": unique("bad"), "tasks": [{"ref": "a", "task": "nope"}]}))
    assert "nope" in cdiflow("definitions", "apply", bad, code=1).output
    assert "not a workflow run id" in cdiflow("workflows", "show", "abc", code=1).output
    nobody = str(uuid.uuid4())
    assert "not found" in cdiflow("workflows", "show", nobody, code=1).output


def _nap_flow(stack_api: StackApi, prefix: str, ms: int) -> str:
    """A new definition of one step that naps ``ms`` milliseconds (the bundled ``sleep``)."""
    flow = unique(prefix)
    with stack_api.client() as api:
        api.apply_definition({"name": flow, "tasks": [{"ref": "nap", "task": "sleep",
                                                         "params": {"ms": ms}}]})  # fmt: skip
    return flow


def test_run_wait_gives_up_after_its_timeout_while_no_event_comes(
    cdiflow: CliRunnerCommand, stack_api: StackApi
) -> None:
    """`--timeout` ends the wait when it passes, not at the next event: the command gives
    up while the run's one step still naps, and says the run goes on."""
    flow = _nap_flow(stack_api, "long_nap", 30_000)
    with stack_api.client() as api:
        gave_up = cdiflow("run", flow, "--wait", "--timeout", "2", code=1)
        assert "had not finished after 2 s" in gave_up.output, gave_up.output
        run_id = re.search(f"run ({UUID})", gave_up.output)
        assert run_id, gave_up.output
        assert api.get(run_id[1]).status == "RUNNING"  # the wait ended before the nap did
        api.cancel(run_id[1])


def test_show_prints_the_traceback_of_the_step_that_failed(
    cdiflow: CliRunnerCommand, stack_api: StackApi
) -> None:
    flow = _nap_flow(stack_api, "bad_nap", -1)  # the task refuses that: it raises
    ran = cdiflow("run", flow, "--wait", code=1)
    run_id = re.search(f"run ({UUID})", ran.output)
    assert run_id, ran.output
    for shown in (ran.output, cdiflow("workflows", "show", run_id[1]).output):
        assert "step 'nap' (task sleep, attempt 1 on worker-" in shown, shown
        assert "  Traceback (most recent call last):" in shown
        assert re.search(r'  File ".*image_tasks\.py", line \d+, in sleep', shown), shown
        assert "  ValueError: param 'ms' must be a finite number >= 0" in shown


def test_run_with_a_time_limit_ends_timed_out_naming_the_step(
    cdiflow: CliRunnerCommand, stack_api: StackApi
) -> None:
    flow = _nap_flow(stack_api, "limited_nap", 30_000)
    ran = cdiflow("run", flow, "--time-limit", "1", "--wait", code=1)
    assert re.search(r"TIMED_OUT in \d+\.\d\d s", ran.output), ran.output
    assert "error: the run passed its time limit of 1 s in step 'nap' (attempt 1, on worker-" in (
        ran.output
    )
    assert re.search(r"nap +TIMED OUT on worker-\d", ran.output), ran.output
