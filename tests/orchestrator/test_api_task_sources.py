"""Registering tasks as an attacker with an admin's key would: any callable that is not an
``@task`` function of a deployed package is refused with a 422 saying why."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from orchestrator.controller import create_app
from orchestrator.worker.cli import load_tasks
from orchestrator.worker.heartbeat import Heartbeat
from tests.orchestrator.api_support import admin_key_of, api_test_settings, keyed_client
from workflows.sources import TaskSources

# A task is registered only when a live worker loaded it too (``controller.task_check``).
pytestmark = pytest.mark.usefixtures("task_worker")


def _task(module: str) -> dict[str, str]:
    return {"name": f"t-{uuid.uuid4().hex[:8]}", "module": module}


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("builtins:print", "module 'builtins' is not in a package tasks may come from"),
        ("builtins:exec", "module 'builtins' is not in a package"),
        ("os:system", "module 'os' is not in a package"),
        ("subprocess:run", "module 'subprocess' is not in a package"),
        ("nosuchpkg.mod:fn", "module 'nosuchpkg.mod' is not in a package"),
        ("workflows.api:load_task", "without @task"),
        ("workflows.api:importlib.import_module", "without @task"),
        ("workflows.image_tasks:deblur.__globals__", "special attribute"),
        ("workflows.image_tasks:no_such_task", "has no attribute"),
        ("tests.orchestrator.flaky_tasks:shell", "without @task"),
    ],
)
def test_only_task_functions_of_deployed_packages_are_registered(
    api_client: TestClient, module: str, says: str
) -> None:
    body = _task(module)
    reply = api_client.post("/api/tasks", json=body)
    assert reply.status_code == 422, reply.text
    assert reply.json()["code"] == "invalid_definition"
    assert any(says in p for p in reply.json()["problems"]), reply.json()
    assert api_client.get(f"/api/tasks/{body['name']}").status_code == 404


def test_deployed_task_functions_are_registered(api_client: TestClient) -> None:
    for module in ("workflows.image_tasks:deblur", "tests.orchestrator.flaky_tasks:echo_input"):
        body = _task(module)
        assert api_client.post("/api/tasks", json=body).status_code == 201, module
        assert api_client.delete(f"/api/tasks/{body['name']}").status_code == 204


def test_a_task_folder_deploys_what_the_api_cannot_import_yet(
    tmp_path: Path, api_database_url: str, api_redis_url: str, api_redis: redis.Redis
) -> None:
    """CDIFLOW_TASK_PATHS: its modules may be registered; what the API can import it checks,
    a module only workers will have (none here yet) is left to them."""
    (tmp_path / "tasks").mkdir()
    folder = tmp_path / "tasks"
    (folder / "shop.py").write_text(
        "from workflows.api import task\n\n@task(name='shop-task')\ndef fn(img, ctx):\n"
        "    return None\n\ndef helper(img, ctx):\n    return None\n"
    )
    settings = api_test_settings(
        tmp_path, api_database_url, api_redis_url, task_packages="workflows", task_paths=folder
    )
    sys.path.insert(0, str(folder))
    shop_worker = Heartbeat(  # a worker given the folder: it loads shop.py
        redis.Redis.from_url(api_redis_url), "shop-worker", running=lambda: 0,
        tasks=load_tasks(TaskSources(packages=("workflows",), paths=(folder,))),
    )  # fmt: skip
    shop_worker.start()
    try:
        with keyed_client(create_app(settings), admin_key_of(settings)) as client:
            assert client.post("/api/tasks", json=_task("shop:fn")).status_code == 201
            helper = client.post("/api/tasks", json=_task("shop:helper"))
            assert helper.status_code == 422 and "without @task" in helper.text
            outside = client.post("/api/tasks", json=_task("tests.orchestrator.flaky_tasks:fn"))
            assert outside.status_code == 422 and str(folder) in outside.text
    finally:
        shop_worker.stop()
        shop_worker.client.close()
        sys.path[:] = [p for p in sys.path if p != str(folder)]
        sys.modules.pop("shop", None)
