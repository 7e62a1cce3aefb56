"""The client and the API agree on every route: for each request the client builds, the API's
OpenAPI document has the operation, documents the answer the client reads (the same schema,
field for field) and takes the body and query parameters the client sends. A route without a
client verb fails too. No stack: the document is the real app's, built from its settings."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

import orchestrator.schemas
from cdiflow.client._calls import Call, Calls
from orchestrator.controller import create_app
from tests.client.api_document import Operation, find, inline, operations
from tests.orchestrator.api_support import api_test_settings

RUN = uuid.UUID("6b0d5f8e-6c1a-4d5e-9a61-3a1f0c2b7d11")
STEPS = [{"ref": "a", "task": "deblur"}, {"ref": "b", "task": "classify", "depends_on": ["a"]}]
WHEN = datetime(2026, 1, 1, tzinfo=UTC)

# Each verb of ``Calls`` with arguments it may be called with; a verb with several requests
# (``create=True``) is listed once for each.
SAMPLES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("register_task", ("sharpen", "mytasks:sharpen"),
     {"timeout_s": 5.0, "retries": 1, "retry_backoff_s": 0.5, "description": "d"}),
    ("register_task", ("sharpen", "mytasks:sharpen"), {"create": True}),
    ("tasks", (), {}),
    ("task", ("sharpen",), {}),
    ("delete_task", ("sharpen",), {}),
    ("apply_definition", ({"name": "flow", "description": "d", "tasks": STEPS},), {}),
    ("apply_definition", ({"name": "flow", "tasks": STEPS},), {"create": True}),
    ("definitions", (), {}),
    ("definition", ("flow",), {}),
    ("definition_versions", ("flow",), {}),
    ("definition_version", ("flow", 2), {}),
    ("delete_definition", ("flow",), {}),
    ("pause_definition", ("flow",), {}),
    ("pause_definition", ("flow",), {"paused": False}),
    ("upload", (b"\x89PNG...", "photo.png"), {}),
    ("start", ("flow", "s3://cdiflow/uploads/photo.png"),
     {"data": {"n": 1}, "policy": "transfer", "data_plane": "cdi", "result_format": "jpeg",
      "version": 2, "priority": 5, "tags": ["nightly"], "idempotency_key": "k-1"}),
    ("start", ("flow", None), {"timeout_s": 60.0, "wait_s": 30.0}),
    ("get", (RUN,), {"wait_s": 5.0, "events": 10}),
    ("list_workflows", (), {"status": "COMPLETED", "workflow": "flow", "policy": "auto",
                            "tags": ["nightly"], "input": {"data": {"n": 1}},
                            "schedule": "nightly", "limit": 5, "offset": 5}),
    ("events_after", (RUN, 3), {}),
    ("cancel", (RUN,), {}),
    ("retry", (RUN,), {}),
    ("pause", (RUN,), {}),
    ("pause", (RUN,), {"paused": False}),
    ("create_schedule", ("nightly", "flow", "0 3 * * *"),
     {"timezone": "Europe/Paris", "catchup": "latest", "grace_s": 30.0, "input": {"data": {"n": 1}},
      "priority": 1, "tags": ["nightly"], "paused": True}),
    ("schedules", (), {"workflow": "flow"}),
    ("schedule", ("nightly",), {}),
    ("pause_schedule", ("nightly",), {}),
    ("pause_schedule", ("nightly",), {"paused": False}),
    ("delete_schedule", ("nightly",), {}),
    ("create_webhook", ("ops", "https://hooks.example/cdiflow"),
     {"events": ["workflow.failed"], "workflow": "flow", "secret": "s" * 32}),
    ("webhooks", (), {}),
    ("webhook", ("ops",), {}),
    ("delete_webhook", ("ops",), {}),
    ("deliveries", ("ops",), {"status": "FAILED", "limit": 5, "offset": 5}),
    ("result", (RUN,), {}),
    ("result", (RUN, "double.values"), {}),
    ("images", (RUN,), {}),
    ("thumbnail", (RUN, "result"), {}),
    ("active_task_runs", (), {"worker": "worker-1", "workflow": RUN, "limit": 10}),
    ("task_runs", (WHEN, WHEN), {"after_id": 3, "limit": 10}),
    ("workers", (), {}),
    ("cdi_objects", (), {}),
    ("stats", (), {"window_minutes": 30}),
    ("whoami", (), {}),
    ("keys", (), {}),
    ("create_key", ("ci-runner", "operator"), {}),
    ("revoke_key", (RUN,), {}),
    ("health", (), {}),
    ("readiness", (), {}),
    ("readiness", (), {"scope": "api"}),
]  # fmt: skip


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The real app's OpenAPI document (the app is built, not started: nothing connects)."""
    folder: Path = tmp_path_factory.mktemp("drift")
    settings = api_test_settings(folder, "postgresql+psycopg://x@127.0.0.1:1/x", "redis://x:1/0")
    yield create_app(settings).openapi()


def _calls() -> list[tuple[str, Call[Any]]]:
    calls = Calls()
    return [(name, getattr(calls, name)(*args, **kwargs)) for name, args, kwargs in SAMPLES]


def _operation(document: dict[str, Any], call: Call[Any]) -> Operation:
    found = find(operations(document), call.method, call.path)
    assert found is not None, f"the API has no route {call.method} {call.path}"
    return found


def test_every_verb_is_sampled() -> None:
    verbs = {name for name, _ in inspect.getmembers(Calls, inspect.isfunction)}
    assert verbs - {"__init__"} == {name for name, _, _ in SAMPLES}


def test_every_route_of_the_api_has_a_client_verb(document: dict[str, Any]) -> None:
    covered = {
        (op.method, op.template) for _, call in _calls() for op in [_operation(document, call)]
    }
    missing = {(op.method, op.template) for op in operations(document)} - covered
    assert not missing, f"routes no verb of cdiflow.client.Calls sends: {sorted(missing)}"


@pytest.mark.parametrize(
    ("verb", "call"), _calls(), ids=[f"{n}-{i}" for i, (n, _) in enumerate(_calls())]
)
def test_the_client_reads_what_the_api_documents(
    document: dict[str, Any], verb: str, call: Call[Any]
) -> None:
    op = _operation(document, call)
    components = document["components"]["schemas"]
    answers = op.answers()
    success = [code for code in answers if 200 <= code < 300]
    assert success, f"{verb}: {op.method} {op.template} documents no success: {sorted(answers)}"
    for code in [*success, *sorted(call.answers_with)]:
        content = answers[code].get("content", {})
        if call.model is None:
            assert not content, f"{verb}: the API answers a body the client ignores: {content}"
        elif call.model is bytes:
            assert content and "application/json" not in content, content
        else:
            documented = inline(content["application/json"]["schema"], components)
            read = TypeAdapter(call.model).json_schema(mode="serialization")
            assert inline(read, read.get("$defs", {})) | {"$defs": None} == documented | {
                "$defs": None
            }, f"{verb}: the client reads {call.model}, the API answers another shape"


@pytest.mark.parametrize(
    ("verb", "call"), _calls(), ids=[f"{n}-{i}" for i, (n, _) in enumerate(_calls())]
)
def test_the_api_takes_what_the_client_sends(
    document: dict[str, Any], verb: str, call: Call[Any]
) -> None:
    op = _operation(document, call)
    declared = {p["name"] for p in op.spec.get("parameters", []) if p["in"] == "query"}
    assert set(call.params or {}) <= declared, f"{verb}: parameters the API does not take"
    body = op.spec.get("requestBody", {}).get("content", {})
    if call.files is not None:
        form = inline(body["multipart/form-data"]["schema"], document["components"]["schemas"])
        assert set(call.files) == set(form["required"])
    elif call.json is not None:
        name = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        getattr(orchestrator.schemas, name).model_validate(call.json)  # the API's own check
    else:
        assert not body.get("application/json", {}).get("required"), f"{verb} sends no body"
