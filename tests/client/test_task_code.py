"""Task code that deploys: a worker loads the deployed folder when it starts and announces
what it loaded; the API refuses tasks no live worker loaded, with the import error a worker
met; tasks go only to the worker that loaded their module. The stack's own two workers started
while the folder was empty (they load the bundled tasks only); a third worker, started here
as ``cdiflow worker --tasks FOLDER`` once the code is there, loads more."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdiflow.client import Client, InvalidRequest
from tests.client.conftest import USER_TASKS, StackApi, unique

TAG = uuid.uuid4().hex[:8]
MODULE, BROKEN = f"usertasks_{TAG}", f"needs_scipy_{TAG}"
WORKER = f"worker-tasks-{TAG}"
TASK_CODE = f"""
from PIL import ImageOps
from workflows.api import TaskResult, task


@task(name="invert_{TAG}", timeout_s=12, retries=1)
def invert(img, ctx):
    return TaskResult(image=ImageOps.invert(img.convert("RGB")), output={{"inverted": True}})
"""


@pytest.fixture(scope="module")
def task_worker(stack_api: StackApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = stack_api.stack.data_dir / USER_TASKS  # deployed: the API's sources name it
    (folder / f"{MODULE}.py").write_text(TASK_CODE)
    (folder / f"{BROKEN}.py").write_text("import scipy_is_not_installed_here\n")
    logs = tmp_path_factory.mktemp("worker")
    log = (logs / "worker.log").open("wb")
    command = [sys.executable, "-m", "orchestrator.worker", "--id", WORKER,
               "--tasks", str(folder)]  # fmt: skip
    proc = subprocess.Popen(command, env=stack_api.stack.environment(), stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        with stack_api.client() as api:
            deadline = time.monotonic() + 60
            while not any(w.id == WORKER and w.alive for w in api.workers()):
                assert proc.poll() is None, (logs / "worker.log").read_text()
                assert time.monotonic() < deadline, "the worker never beat"
                time.sleep(0.2)
        yield WORKER
    finally:
        proc.terminate()  # by PID: the worker we started
        proc.wait(timeout=30)
        log.close()
    text = (logs / "worker.log").read_text()
    assert f"loaded task module {MODULE}: invert" in text
    assert f"could not load task module {BROKEN}: ModuleNotFoundError" in text


def test_a_task_from_the_folder_registers_with_its_own_settings_and_runs_only_there(
    api: Client, task_worker: str, photo: Path
) -> None:
    task = api.register_task(f"invert_{TAG}", f"{MODULE}:invert")
    assert (task.timeout_s, task.retries) == (12, 1)  # from its @task
    flow = unique("invert_flow")
    api.apply_definition({"name": flow, "tasks": [
        {"ref": "before", "task": "deblur"},
        {"ref": "invert", "task": task.name, "depends_on": ["before"]},
        {"ref": "label", "task": "classify", "depends_on": ["invert"]}]})  # fmt: skip
    for policy in ("transfer", "affinity", "auto"):
        done = api.run(flow, photo, policy=policy, timeout=120)
        where = {r.ref: r.worker_id for r in done.task_runs if r.status == "COMPLETED"}
        assert where["invert"] == task_worker, (policy, where)
        assert done.output and done.output["inverted"] is True and done.output["label"]


def test_a_task_no_live_worker_can_import_is_refused_with_the_workers_error(
    api: Client, task_worker: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        api.register_task(unique("needs_scipy"), f"{BROKEN}:fn")
    assert f"{task_worker}: {BROKEN}: ModuleNotFoundError" in refused.value.detail
    assert "scipy_is_not_installed_here" in refused.value.detail
    with pytest.raises(InvalidRequest, match="not in a package tasks may come from"):
        api.register_task(unique("nowhere"), "nowhere:fn")  # not deployed code at all
    with pytest.raises(InvalidRequest, match="@task"):
        api.register_task(unique("helper"), f"{MODULE}:helper")
