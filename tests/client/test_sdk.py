"""Every verb of the Python client, sync and async, against a real stack."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from PIL import Image

from cdiflow.client import (
    AsyncClient,
    Client,
    ConfigError,
    Conflict,
    InvalidRequest,
    NotFound,
    TransportError,
    WaitTimeout,
    WorkflowFailed,
)
from tests.client.conftest import SLEEPER, StackApi, unique
from tests.dashboard.support import free_port

STEPS = [
    {"ref": "deblur", "task": "deblur"},
    {"ref": "classify", "task": "classify", "depends_on": ["deblur"]},
]


def test_tasks_and_definitions(api: Client) -> None:
    name = unique("sdk_deblur")
    task = api.register_task(name, "workflows.image_tasks:deblur", timeout_s=7)
    assert (task.name, task.module, task.timeout_s) == (name, "workflows.image_tasks:deblur", 7)
    assert api.register_task(name, "workflows.image_tasks:deblur", timeout_s=8).timeout_s == 8
    assert api.task(name).timeout_s == 8 and name in {t.name for t in api.tasks()}

    flow = unique("sdk_flow")
    first = api.apply_definition({"name": flow, "tasks": [{"ref": "d", "task": name}]})
    assert first.version == 1
    assert api.apply_definition({"name": flow, "tasks": [{"ref": "d", "task": name}]}).version == 1
    with pytest.raises(Conflict, match=f"used by workflow definition.*{flow}"):
        api.delete_task(name)
    second = api.apply_definition({"name": flow, "description": "two", "tasks": STEPS})
    assert second.version == 2 and [s.ref for s in second.tasks] == ["deblur", "classify"]
    assert api.definition(flow).version == 2 and flow in {d.name for d in api.definitions()}
    assert [v.version for v in api.definition_versions(flow)] == [2, 1]
    assert [s.task for s in api.definition_version(flow, 1).tasks] == [name]

    api.delete_definition(flow)
    with pytest.raises(NotFound) as missing:
        api.definition(flow)
    assert "image_pipeline" in missing.value.known
    api.delete_task(name)
    with pytest.raises(NotFound):
        api.task(name)


def test_upload_start_wait_events_and_download(api: Client, photo: Path) -> None:
    upload = api.upload(photo)
    assert upload.uri.startswith("s3://") and upload.format == "JPEG"
    started = api.start("image_pipeline", upload.uri, result_format="jpeg", policy="transfer")
    assert started.status == "PENDING" and started.workflow_version == 1
    done = api.wait(started.id, timeout=120)
    assert done.status == "COMPLETED", done.error
    assert [r.ref for r in done.task_runs] == ["deblur", "denoise", "classify"]

    kinds = [e.kind for e in api.events(started.id, follow=False)]
    # The last report and the run's end are written by one statement, in either order.
    assert kinds[0] == "workflow.created" and "workflow.completed" in kinds[-2:]
    assert kinds.count("task.completed") == 3

    out = photo.with_name("result.jpg")
    data = api.download_result(started.id, out)
    assert out.read_bytes() == data
    with Image.open(io.BytesIO(data)) as result, Image.open(photo) as original:
        assert (result.format, result.size) == ("JPEG", original.size)


def test_run_uploads_a_local_file_and_returns_the_completed_run(api: Client, photo: Path) -> None:
    done = api.run("image_pipeline", photo, timeout=120, data={"note": "from the sdk"})
    assert done.status == "COMPLETED" and done.output and done.output["label"] == "warm"
    assert done.input["image"].startswith("s3://") and done.input["data"] == {
        "note": "from the sdk"
    }
    assert api.get(done.id).result_uri == done.result_uri
    assert any(w.alive for w in api.workers())


def test_list_cancel_and_retry(api: Client) -> None:
    running = api.start(SLEEPER)
    cancelled = api.cancel(running.id)
    assert cancelled.status == "CANCELLED"
    with pytest.raises(Conflict, match="already finished"):
        api.cancel(running.id)
    again = api.retry(running.id)
    assert again.retry_of == running.id and again.status == "PENDING"
    with pytest.raises(WaitTimeout):
        api.wait(again.id, timeout=0.5)
    api.cancel(again.id)
    page = api.list_workflows(status="CANCELLED", workflow=SLEEPER, limit=5)
    assert {running.id, again.id} <= {w.id for w in page.items} and page.total >= 2


def test_errors_come_from_one_tree(api: Client, stack_api: StackApi) -> None:
    with pytest.raises(NotFound) as unknown:
        api.start("no_such_workflow")
    assert "image_pipeline" in unknown.value.known and unknown.value.status == 404
    with pytest.raises(InvalidRequest) as invalid:
        api.apply_definition({"name": unique("bad"), "tasks": [{"ref": "a", "task": "nope"}]})
    assert any("nope" in p for p in invalid.value.problems)
    with pytest.raises(
        InvalidRequest, match=r"notes\.txt is text/html, which this cdiflow"
    ) as html:
        api.upload(b"<html><script>alert(1)</script></html>", "notes.txt")
    assert html.value.status == 415 and "CDIFLOW_UPLOAD_TYPES" in html.value.problems[0]
    with pytest.raises(WorkflowFailed) as failed:
        api.run("image_pipeline", "s3://cdiflow/no/such/photo.jpg", timeout=120)
    assert failed.value.workflow.status == "FAILED"
    assert "does not exist" in (failed.value.workflow.error or "")
    with pytest.raises(Conflict, match="has no result"):
        api.download_result(failed.value.workflow.id)
    with pytest.raises(ConfigError, match="not a workflow run id"):
        api.get("not-a-uuid")
    with Client(f"http://127.0.0.1:{free_port()}") as nowhere, pytest.raises(TransportError):
        nowhere.workers()


def test_the_async_client_speaks_the_same_verbs(stack_api: StackApi, photo: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(stack_api.url, api_key=stack_api.key) as api:
            flow = unique("async_flow")
            assert (await api.apply_definition({"name": flow, "tasks": STEPS})).version == 1
            assert [v.version for v in await api.definition_versions(flow)] == [1]
            upload = await api.upload(photo)
            started = await api.start(flow, upload.uri)
            done = await api.wait(started.id, timeout=120, check=True)
            assert done.output and done.output["label"] == "warm"
            kinds = [event.kind async for event in api.events(started.id)]
            assert "workflow.completed" in kinds[-2:]
            data = await api.download_result(started.id)
            assert data.startswith(b"\x89PNG")
            ran = await api.run(flow, photo, timeout=120)
            assert ran.status == "COMPLETED"
            sleeper = await api.start(SLEEPER)
            assert (await api.cancel(sleeper.id)).status == "CANCELLED"
            retried = await api.retry(sleeper.id)
            await api.cancel(retried.id)
            page = await api.list_workflows(workflow=flow)
            assert {started.id, ran.id} <= {w.id for w in page.items}
            with pytest.raises(NotFound):
                await api.get("00000000-0000-0000-0000-000000000000")

    asyncio.run(scenario())


def test_the_documented_example_runs(stack_api: StackApi, photo: Path) -> None:
    """``docs/examples/client_example.py`` as a user runs it, against the stack."""
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "client_example.py"
    env = {**os.environ, "CDIFLOW_API_URL": stack_api.url}
    if stack_api.key:
        env["CDIFLOW_API_KEY"] = stack_api.key
    done = subprocess.run([sys.executable, str(example), str(photo)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.search(r"run \S+: COMPLETED, labelled 'warm'", done.stdout), done.stdout
    assert "event workflow.completed" in done.stdout and "async run" in done.stdout
    with Image.open(photo.with_name("sunset-result.png")) as result:
        assert result.format == "PNG"


def test_a_failed_tasks_traceback_reaches_the_api_and_the_error(
    api: Client, stack_api: StackApi
) -> None:
    """The task's traceback is kept with its task run: the API shows it, and the client's
    WorkflowFailed carries it and ends its message with it."""
    flow = unique("bad_nap")
    api.apply_definition({"name": flow, "tasks": [{"ref": "nap", "task": "sleep",
                                                     "params": {"ms": -1}}]})  # fmt: skip
    with pytest.raises(WorkflowFailed) as failed:
        api.run(flow, timeout=120)
    lines = failed.value.traceback.splitlines()
    assert "image_tasks.py" in lines[1] and "in sleep" in lines[1], lines
    assert lines[-1].startswith("ValueError: param 'ms' must be a finite number >= 0")
    assert str(failed.value).endswith(failed.value.traceback.rstrip())
    assert "step 'nap' (task sleep, attempt 1 on worker-" in str(failed.value)
    run_id = failed.value.workflow.id
    detail = httpx.get(f"{stack_api.url}/api/workflows/{run_id}", headers=stack_api.headers())
    [task_run] = detail.json()["task_runs"]
    assert task_run["traceback"] == failed.value.traceback
