"""The API registers a task only when a live worker loaded it, and says why not otherwise;
settings left out come from the function's ``@task``. The worker here is a real heartbeat
carrying what the real loader loaded from a folder (these tests run no worker process)."""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from orchestrator.settings import Settings
from orchestrator.worker.cli import load_tasks
from orchestrator.worker.heartbeat import Heartbeat
from tests.orchestrator.api_support import api_test_settings
from workflows.sources import TaskSources

# Names no other module uses; fixed, because they are in test ids (parallel runs collect the
# same tests in each process).
TAG = "c99e16f3"
GOOD, BROKEN = f"checked_{TAG}", f"broken_{TAG}"


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder of deployed task code: a module of tasks, and one whose import fails."""
    folder = tmp_path_factory.mktemp("tasks")
    (folder / f"{GOOD}.py").write_text(
        "from workflows.api import task\n\n"
        f"@task(name='{GOOD}', timeout_s=12, retries=3, retry_backoff_s=0.25)\n"
        "def invert(img, ctx):\n    return None\n\n"
        "def plain(img, ctx):\n    return None\n"
    )
    (folder / f"{BROKEN}.py").write_text("import no_such_dependency_xyz\n")
    yield folder
    for name in (GOOD, BROKEN):
        sys.modules.pop(name, None)
    sys.path[:] = [p for p in sys.path if p != str(folder)]


@pytest.fixture(scope="module")
def api_settings(
    tmp_path_factory: pytest.TempPathFactory,
    api_database_url: str,
    api_redis_url: str,
    task_folder: Path,
) -> Settings:
    """The folder is deployed task code for this module's app, as for its worker."""
    data_dir: Path = tmp_path_factory.mktemp("checked")
    return api_test_settings(data_dir, api_database_url, api_redis_url, task_paths=[task_folder])


@pytest.fixture(scope="module")
def folder_worker(
    task_folder: Path, api_redis_url: str, api_redis: redis.Redis
) -> Iterator[Heartbeat]:
    client = redis.Redis.from_url(api_redis_url)
    sources = TaskSources(paths=(task_folder,))
    beat = Heartbeat(client, "folder-worker", running=lambda: 0, tasks=load_tasks(sources))
    beat.start()
    yield beat
    beat.stop()
    client.close()


def _register(api: TestClient, module: str, **settings: float) -> tuple[int, dict[str, object]]:
    name = f"t_{uuid.uuid4().hex[:8]}"
    reply = api.put(f"/api/tasks/{name}", json={"name": name, "module": module, **settings})
    return reply.status_code, reply.json()


def test_no_live_worker_means_no_registration(api_client: TestClient) -> None:
    status, body = _register(api_client, "workflows.image_tasks:deblur")
    assert status == 422 and "no worker is alive" in str(body["detail"])
    assert "--tasks PATH" in str(body["detail"])


@pytest.mark.usefixtures("folder_worker")
def test_a_loaded_task_registers_with_its_own_settings(api_client: TestClient) -> None:
    status, body = _register(api_client, f"{GOOD}:invert")
    assert status == 201, body
    assert (body["timeout_s"], body["retries"], body["retry_backoff_s"]) == (12, 3, 0.25)
    status, body = _register(api_client, f"{GOOD}:invert", timeout_s=5)
    assert status == 201 and (body["timeout_s"], body["retries"]) == (5, 3)  # given wins


@pytest.mark.usefixtures("folder_worker")
@pytest.mark.parametrize(
    ("module", "says"),
    [
        (f"{BROKEN}:fn", re.escape(f"no live worker could import '{BROKEN}': folder-worker: "
                                   f"{BROKEN}: ModuleNotFoundError: No module named "
                                   "'no_such_dependency_xyz'")),
        # The API says so itself where it can import the module, else the worker's catalog.
        (f"{GOOD}:plain", r"without @task|has no @task function 'plain'; its @task functions"),
        # Allowed (the tests' package), but no live worker loaded it.
        ("tests.orchestrator.flaky_tasks:echo_input",
         re.escape("no live worker loaded module 'tests.orchestrator.flaky_tasks' (they loaded: ")),
    ],
)  # fmt: skip
def test_a_task_no_live_worker_can_run_is_refused_saying_why(
    api_client: TestClient, module: str, says: str
) -> None:
    status, body = _register(api_client, module)
    assert status == 422 and re.search(says, str(body["detail"])), body
    problems = body["problems"]
    assert isinstance(problems, list) and any(re.search(says, str(p)) for p in problems), body
    created = api_client.post("/api/tasks", json={"name": f"p_{TAG}", "module": module})
    assert created.status_code == 422
    outside = _register(api_client, "os:system")  # not deployed code: refused before any look
    assert outside[0] == 422 and "not in a package tasks may come from" in str(outside[1])
