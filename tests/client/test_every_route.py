"""Every route the API's OpenAPI document lists, called through ``Client`` against a real
stack: each answers a success the client reads into its model (the API's own)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from cdiflow.client import (
    ActiveTaskRun,
    CdiDirectory,
    Client,
    Definition,
    DefinitionVersion,
    DeliveryPage,
    Identity,
    Key,
    KeyCreated,
    Liveness,
    Readiness,
    Schedule,
    Stats,
    Task,
    TaskRunInWorkflow,
    Upload,
    Webhook,
    WebhookCreated,
    Worker,
    Workflow,
    WorkflowDetail,
    WorkflowImages,
    WorkflowPage,
)
from orchestrator.contract.vocabulary import WorkflowStatus
from tests.client.api_document import find, operations
from tests.client.conftest import SLEEPER, StackApi, unique


class Recording(httpx.HTTPTransport):
    """A real transport that notes each request's method, path and answer status."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.seen.append((request.method, request.url.path, response.status_code))
        return response


def test_the_client_reads_the_answer_of_every_route(stack_api: StackApi, photo: Path) -> None:
    recording = Recording()
    began = datetime.now(UTC)
    with Client(stack_api.url, api_key=stack_api.key, transport=recording) as api:
        assert isinstance(api.health(), Liveness)
        assert api.readiness().status == "ok", api.readiness()
        assert isinstance(api.readiness(), Readiness)
        assert isinstance(api.whoami(), Identity)
        key = api.create_key(unique("key"), "viewer")
        assert isinstance(key, KeyCreated) and key.key
        listed = api.keys()
        assert all(isinstance(k, Key) for k in listed) and key.id in {k.id for k in listed}
        api.revoke_key(key.id)

        task = unique("route_task")
        created = api.register_task(task, "workflows.image_tasks:deblur", create=True)
        assert isinstance(created, Task)
        assert api.register_task(task, "workflows.image_tasks:deblur", retries=1).retries == 1
        assert isinstance(api.task(task), Task) and task in {t.name for t in api.tasks()}

        flow = unique("route_flow")
        first = api.apply_definition({"name": flow, "tasks": [{"ref": "d", "task": task}]},
                                     create=True)  # fmt: skip
        steps = [{"ref": "d", "task": task}, {"ref": "c", "task": "classify", "depends_on": ["d"]}]
        second = api.apply_definition({"name": flow, "tasks": steps})
        assert isinstance(first, Definition) and (first.version, second.version) == (1, 2)
        assert isinstance(api.definition(flow), Definition)
        assert flow in {d.name for d in api.definitions()}
        versions = api.definition_versions(flow)
        assert [v.version for v in versions] == [2, 1]
        assert isinstance(api.definition_version(flow, 1), DefinitionVersion)

        upload = api.upload(photo)
        assert isinstance(upload, Upload)
        started = api.start(flow, upload.uri)
        assert isinstance(started, Workflow)
        done = api.wait(started.id, timeout=120)
        assert isinstance(done, WorkflowDetail) and done.status == WorkflowStatus.COMPLETED
        assert isinstance(api.get(started.id), WorkflowDetail)
        assert next(api.events(started.id, follow=False)).kind == "workflow.created"
        page = api.list_workflows(workflow=flow)
        assert isinstance(page, WorkflowPage) and page.items[0].id == started.id
        images = api.images(started.id)
        assert isinstance(images, WorkflowImages) and images.result.available
        assert api.thumbnail(started.id, "result")[:2] == b"\xff\xd8"
        assert api.download_result(started.id)[:4] == b"\x89PNG"
        named = api.download_result(started.id, output="c.image")  # the same, by its name
        assert named == api.download_result(started.id)

        sleeping = api.start(SLEEPER)
        deadline = time.monotonic() + 60
        while not (active := api.active_task_runs(workflow=sleeping.id)):
            assert time.monotonic() < deadline, "the sleeper's task run never showed"
            time.sleep(0.2)
        assert isinstance(active[0], ActiveTaskRun)
        assert api.cancel(sleeping.id).status == WorkflowStatus.CANCELLED
        retried = api.retry(sleeping.id)
        assert retried.retry_of == sleeping.id
        api.cancel(retried.id)
        paused = api.start(SLEEPER)
        assert isinstance(api.pause(paused.id), Workflow)
        assert api.resume(paused.id).paused_at is None
        api.cancel(paused.id)

        assert isinstance(api.pause_definition(flow), Definition)
        assert isinstance(api.resume_definition(flow), Definition)
        schedule = api.create_schedule(unique("route_schedule"), flow, "0 3 * * *", paused=True)
        assert isinstance(schedule, Schedule) and schedule.next_fire_times
        assert schedule.name in {s.name for s in api.schedules()}
        assert isinstance(api.schedule(schedule.name), Schedule)
        assert isinstance(api.resume_schedule(schedule.name), Schedule)
        assert isinstance(api.pause_schedule(schedule.name), Schedule)
        api.delete_schedule(schedule.name)
        hook = api.create_webhook(unique("route_hook"), "http://127.0.0.1:9/hook")
        assert isinstance(hook, WebhookCreated) and hook.secret
        assert hook.name in {h.name for h in api.webhooks()}
        assert isinstance(api.webhook(hook.name), Webhook)
        assert isinstance(api.deliveries(hook.name), DeliveryPage)
        api.delete_webhook(hook.name)

        ran = api.task_runs(began - timedelta(seconds=1), datetime.now(UTC) + timedelta(seconds=1))
        assert {r.workflow_id for r in ran if isinstance(r, TaskRunInWorkflow)} >= {started.id}
        assert all(isinstance(w, Worker) for w in api.workers()) and api.workers()
        assert isinstance(api.cdi_objects(), CdiDirectory)
        assert isinstance(api.stats(window_minutes=5), Stats)

        api.delete_definition(flow)
        api.delete_task(task)

        document = httpx.get(f"{stack_api.url}/api/openapi.json", headers=stack_api.headers())
    documented = operations(document.json())
    answered = set()
    for method, path, status in recording.seen:
        op = find(documented, method, path)
        assert op is not None, f"the client asked {method} {path}, which the API does not list"
        if 200 <= status < 300:
            answered.add((op.method, op.template))
    missing = {(op.method, op.template) for op in documented} - answered
    assert not missing, f"routes whose answer the client did not read: {sorted(missing)}"
