"""A client older than its API keeps working and shows what it got: fields, step kinds and
statuses it does not know are kept and printed, not refused or dropped.

The newer API is the real stack behind a small proxy that adds to its answers what a later
version might send (``NewerApi``); a status no version has yet is served by a fake transport
(a unit test: the real API cannot be made to answer it)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from cdiflow.cli import main
from cdiflow.client import Client, WorkflowFailed, as_data
from orchestrator.schemas import EventPage, TaskRunPublic, WorkflowDetail
from tests.client.conftest import StackApi, unique

NEW_FIELD = "added_later"
NEW_VALUE = {"by": "a newer API"}
NEW_STEP = {"ref": "later", "loop": {"times": 2}, "depends_on": ["label"]}


def newer(body: Any, answer: bool = True) -> Any:
    """``body`` as a newer API might answer it: a field more on the answer (each item of a
    list answer) and on every object inside with an id or a ref, and a step of a new kind in
    every definition."""
    if isinstance(body, list):
        return [newer(item, answer) for item in body]
    if not isinstance(body, dict):
        return body
    out = {key: newer(value, answer=False) for key, value in body.items()}
    if "tasks" in out and "version" in out:  # a workflow definition
        out["tasks"] = [*out["tasks"], newer(NEW_STEP, answer=False)]
    if answer or "id" in out or "ref" in out:
        out[NEW_FIELD] = NEW_VALUE
    return out


class NewerApi:
    """A proxy in front of the real API, answering as ``newer`` says (a thread in this
    process; stopped on ``close``)."""

    def __init__(self, upstream: str) -> None:
        client = httpx.Client(base_url=upstream, timeout=120)

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length")}  # fmt: skip
                reply = client.request(self.command, self.path, headers=headers,
                                       content=self.rfile.read(length))  # fmt: skip
                content = reply.content
                if reply.headers.get("content-type", "").startswith("application/json"):
                    content = json.dumps(newer(reply.json())).encode()
                self.send_response(reply.status_code)
                for key, value in reply.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._client = client
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()
        self._client.close()


@pytest.fixture
def newer_api(stack_api: StackApi) -> Iterator[NewerApi]:
    proxy = NewerApi(stack_api.url)
    try:
        yield proxy
    finally:
        proxy.close()


def test_unknown_fields_and_step_kinds_are_kept_by_the_client_and_shown_by_the_commands(
    stack_api: StackApi, newer_api: NewerApi, photo: Path
) -> None:
    name = unique("older_client")
    steps = [{"ref": "label", "task": "classify"}]
    with stack_api.client() as api:  # saved on the real API as it is today
        api.apply_definition({"name": name, "tasks": steps})

    with Client(newer_api.url, api_key=stack_api.key) as older:
        found = {d.name: d for d in older.definitions()}[name]
        assert found.model_extra == {NEW_FIELD: NEW_VALUE}
        assert [s.ref for s in found.tasks] == ["label", "later"]
        assert found.tasks[1].model_extra == {"loop": {"times": 2}, NEW_FIELD: NEW_VALUE}
        assert as_data(found)["tasks"][1] == NEW_STEP | {"params": {}, NEW_FIELD: NEW_VALUE}
        assert as_data(found)[NEW_FIELD] == NEW_VALUE

    def cli(*args: str | Path) -> Result:
        point = ["--api-url", newer_api.url, "--api-key", str(stack_api.key)]
        result = CliRunner().invoke(main, [*(str(a) for a in args), *point])
        assert result.exit_code == 0, (result.output, result.exception)
        return result

    listed = cli("definitions", "list").output
    assert re.search(rf"^{name} +1 +2 steps: loop", listed, re.M), listed
    listed_json = {d["name"]: d for d in json.loads(cli("definitions", "list", "--json").output)}
    assert listed_json[name][NEW_FIELD] == NEW_VALUE
    shown = json.loads(cli("definitions", "show", name).stdout)
    assert shown[NEW_FIELD] == NEW_VALUE and shown["tasks"][1]["loop"] == {"times": 2}
    drawn = cli("definitions", "versions", name).output
    assert re.search(
        r"^  later +label +a step of a kind this cdiflow does not know: loop=\{\"times\":2\}",
        drawn,
        re.M,
    ), drawn

    ran = cli("run", name, "--input", photo, "--wait", "--json")
    detail = json.loads(ran.stdout)
    assert detail["status"] == "COMPLETED" and detail[NEW_FIELD] == NEW_VALUE
    assert all(r[NEW_FIELD] == NEW_VALUE for r in detail["task_runs"])
    shown_run = cli("workflows", "show", detail["id"]).output
    assert "COMPLETED" in shown_run and "label=" in shown_run


# -- a status no version has yet (unit: a fake transport) -------------------------------------

RUN = uuid.UUID("0b6c1f4e-9d5a-4c1e-8f3b-2a7d6e5c4b3a")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _detail(status: str, finished: bool) -> dict[str, Any]:
    """A run's detail as the API answers it, with a status and policy of a later version."""
    task_run = TaskRunPublic(
        id=1, ref="nap", task="sleep", attempt=1, status="COMPLETED", worker_id="w",
        queued_at=NOW, started_at=NOW, finished_at=NOW, queue_wait_ms=1, run_ms=1,
        bytes_in=None, bytes_out=None, error=None, output={}, data=None,
    )  # fmt: skip
    detail = WorkflowDetail(
        id=RUN, workflow="nap", workflow_version=1, status="RUNNING", policy="affinity",
        data_plane="none", input={}, output=None, error="took too long", result_uri=None,
        retry_of=None, created_at=NOW, started_at=NOW, finished_at=NOW if finished else None,
        claimed_by="s", claimed_at=NOW, started_by="admin", task_runs=[task_run], handoffs=[],
        events=[],
    )  # fmt: skip
    data: dict[str, Any] = detail.model_dump(mode="json")
    data["task_runs"][0]["status"] = "PAUSED"
    return data | {"status": status, "policy": "cheapest"}


def test_a_status_this_version_does_not_know_is_kept_and_its_end_still_seen() -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path.endswith("/events"):
            page = EventPage(status="RUNNING", events=[]).model_dump(mode="json")
            return httpx.Response(200, json=page | {"status": "ARCHIVED"})
        return httpx.Response(200, json=_detail("ARCHIVED", finished=len(asked) > 1))

    with Client("http://api.test", api_key="k", transport=httpx.MockTransport(answer)) as api:
        first = api.get(RUN)
        assert (first.status, first.policy, first.finished) == ("ARCHIVED", "cheapest", False)
        assert first.task_runs[0].status == "PAUSED"
        with pytest.raises(WorkflowFailed, match="ended ARCHIVED: took too long"):
            api.wait(RUN, timeout=5, check=True)  # ended: it has an end time
        assert list(api.events(RUN, follow=True)) == []  # ended: the run says so
    assert asked[-1] == f"/api/workflows/{RUN}"
