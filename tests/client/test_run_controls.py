"""The client's and the commands' verbs for schedules, webhooks, idempotent starts, tags and
pausing, against a real stack."""

from __future__ import annotations

import uuid

import pytest

from cdiflow.client import Client, InvalidRequest, NotFound
from cdiflow.client.models import WorkflowDetail
from tests.client.conftest import SLEEPER, unique
from tests.client.test_cli import CliRunnerCommand, cdiflow

__all__ = ["cdiflow"]  # the fixture of tests.client.test_cli


def test_an_idempotent_start_with_tags_is_found_again(api: Client) -> None:
    key = str(uuid.uuid4())
    tag = unique("t")
    first = api.start(SLEEPER, data={"n": 1}, tags=[tag], idempotency_key=key)
    again = api.start(SLEEPER, data={"n": 1}, tags=[tag], idempotency_key=key)
    assert again.id == first.id and first.tags == [tag]
    with pytest.raises(InvalidRequest, match="different request body"):
        api.start(SLEEPER, data={"n": 2}, idempotency_key=key)
    found = api.list_workflows(tags=[tag], input={"data": {"n": 1}})
    assert [r.id for r in found.items] == [first.id]
    api.cancel(first.id)


def test_a_start_that_waits_answers_with_the_ended_runs_detail(api: Client) -> None:
    started = api.start("noop_pipeline", data={"n": 1}, wait_s=30)
    assert isinstance(started, WorkflowDetail), started
    assert started.status == "COMPLETED" and len(started.task_runs) == 3
    at_once = api.start("noop_pipeline", data={"n": 1})
    assert not isinstance(at_once, WorkflowDetail) and at_once.status == "PENDING"
    api.wait(at_once.id, timeout=60)


def test_a_run_is_paused_and_resumed(api: Client) -> None:
    run = api.start(SLEEPER, priority=5)
    assert run.priority == 5
    assert api.pause(run.id).paused_at is not None
    assert api.resume(run.id).paused_at is None
    assert api.wait(run.id, timeout=60).status == "COMPLETED"


def test_schedules_and_webhooks_through_the_client(api: Client) -> None:
    name = unique("sched").replace("_", "-")
    made = api.create_schedule(name, SLEEPER, "@daily", timezone="Asia/Tokyo", paused=True)
    assert made.paused_at is not None and len(made.next_fire_times) == 5
    assert made.next_fire_times[0].astimezone().utcoffset() is not None
    assert name in [s.name for s in api.schedules(SLEEPER)]
    assert api.resume_schedule(name).paused_at is None
    api.delete_schedule(name)
    with pytest.raises(NotFound):
        api.schedule(name)
    hook = api.create_webhook(unique("hook"), "https://example.test/in", events=["workflow.failed"])
    assert hook.secret.startswith("whsec_") and hook.events == ["workflow.failed"]
    assert api.deliveries(hook.name).total == 0
    assert [w.name for w in api.webhooks() if w.name == hook.name] == [hook.name]
    api.delete_webhook(hook.name)


def test_schedules_and_webhooks_on_the_command_line(cdiflow: CliRunnerCommand) -> None:
    name = unique("cli").replace("_", "-")
    made = cdiflow("schedules", "create", name, SLEEPER, "*/15 * * * *", "--paused")
    assert f"schedule {name}: {SLEEPER} at '*/15 * * * *'" in made.output
    assert "paused since" in made.output and "next:" in made.output
    listed = cdiflow("schedules", "list").output
    assert name in listed and "paused" in listed
    assert "active" in cdiflow("schedules", "resume", name).output
    bad = cdiflow("schedules", "create", unique("x").replace("_", "-"), SLEEPER, "* *", code=1)
    assert "not a cron expression" in bad.output
    cdiflow("schedules", "delete", name)
    hook = unique("hook")
    created = cdiflow("webhooks", "create", hook, "https://example.test/cli", "--event",
                      "workflow.completed").output  # fmt: skip
    assert "secret (shown once): whsec_" in created
    assert hook in cdiflow("webhooks", "list").output
    assert "0 of 0" in cdiflow("webhooks", "deliveries", hook).output
    cdiflow("webhooks", "delete", hook)
    run = cdiflow("run", SLEEPER, "--tag", "cli-tag", "--idempotency-key", name).output
    again = cdiflow("run", SLEEPER, "--tag", "cli-tag", "--idempotency-key", name).output
    run_id = run.split("run ")[1].split()[0]
    assert again.split("run ")[1].split()[0] == run_id
    assert "is paused" in cdiflow("workflows", "pause", run_id).output
    assert run_id in cdiflow("workflows", "list", "--tag", "cli-tag").output
    assert run_id not in cdiflow("workflows", "list", "--tag", "no-such-tag").output
    cdiflow("workflows", "cancel", run_id)
