"""``cdiflow schedules ...`` and ``cdiflow webhooks ...``: runs on a clock, and who is told of
their ends."""

from __future__ import annotations

import click

from cdiflow.client import Schedule
from cdiflow.commands.common import Target, api_options, echo_json, table, when
from cdiflow.commands.workflows import data_option

__all__ = ["schedules_group", "webhooks_group"]


@click.group("schedules")
def schedules_group() -> None:
    """Cron schedules: runs of a definition at each tick, once per tick."""


@schedules_group.command("create")
@click.argument("name")
@click.argument("workflow")
@click.argument("cron")
@click.option("--timezone", default=None, help="An IANA zone, e.g. Europe/Paris [default: UTC].")
@click.option(
    "--catchup",
    type=click.Choice(["skip", "latest", "all"]),
    default=None,
    help="Ticks missed by more than --grace-s: run none, one for the latest, or each "
    "[default: skip].",
)
@click.option("--grace-s", type=click.FloatRange(min=1), default=None, help="[default: 60]")
@click.option("--input", "image", default=None, metavar="s3://URI", help="The input image.")
@click.option("--data", default=None, metavar="JSON", help="JSON every task gets as ctx.input.")
@click.option("--priority", type=click.IntRange(-100, 100), default=None)
@click.option("--tag", "tags", multiple=True, help="Given to every run it makes (repeatable).")
@click.option("--paused", is_flag=True, help="Make it paused (it fires once resumed).")
@click.option("--json", "as_json", is_flag=True)
@api_options
def create_schedule(
    name: str,
    workflow: str,
    cron: str,
    timezone: str | None,
    catchup: str | None,
    grace_s: float | None,
    image: str | None,
    data: str | None,
    priority: int | None,
    tags: tuple[str, ...],
    paused: bool,
    as_json: bool,
    target: Target,
) -> None:
    """Run WORKFLOW at each tick of CRON, e.g. `cdiflow schedules create nightly
    image_pipeline '0 2 * * *' --input s3://cdiflow/in/a.jpg`. CRON has five fields, six with
    the seconds first, or is @hourly, @daily, @weekly, @monthly or @yearly."""
    given = {"image": image, "data": data_option(data)}
    with target.client() as api:
        made = api.create_schedule(
            name,
            workflow,
            cron,
            timezone=timezone,
            catchup=catchup,
            grace_s=grace_s,
            input={k: v for k, v in given.items() if v is not None},
            priority=priority,
            tags=tags,
            paused=paused or None,
        )
    _show(made, as_json)


@schedules_group.command("list")
@click.option("--workflow", default=None, help="Only schedules of this definition.")
@click.option("--json", "as_json", is_flag=True)
@api_options
def list_schedules(workflow: str | None, as_json: bool, target: Target) -> None:
    """Every schedule with its next tick."""
    with target.client() as api:
        found = api.schedules(workflow)
    if as_json:
        echo_json(found)
        return
    rows = [
        (s.name, s.workflow, s.cron, s.timezone, "paused" if s.paused_at else "active",
         when(s.next_fire_at), when(s.last_fired_at), s.last_error or "")
        for s in found
    ]  # fmt: skip
    header = ("NAME", "WORKFLOW", "CRON", "ZONE", "STATE", "NEXT", "LAST", "ERROR")
    click.echo(table(header, rows))


@schedules_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@api_options
def show_schedule(name: str, as_json: bool, target: Target) -> None:
    """A schedule and its next fire times."""
    with target.client() as api:
        _show(api.schedule(name), as_json)


@schedules_group.command("pause")
@click.argument("name")
@api_options
def pause_schedule(name: str, target: Target) -> None:
    """Stop firing until resumed."""
    with target.client() as api:
        _show(api.pause_schedule(name), False)


@schedules_group.command("resume")
@click.argument("name")
@api_options
def resume_schedule(name: str, target: Target) -> None:
    """Fire again from the next tick (the paused ones are not caught up)."""
    with target.client() as api:
        _show(api.resume_schedule(name), False)


@schedules_group.command("delete")
@click.argument("name")
@api_options
def delete_schedule(name: str, target: Target) -> None:
    """Delete a schedule (the runs it made stay)."""
    with target.client() as api:
        api.delete_schedule(name)
    click.echo(f"deleted schedule {name}")


def _show(schedule: Schedule, as_json: bool) -> None:
    if as_json:
        echo_json(schedule)
        return
    state = f"paused since {when(schedule.paused_at)}" if schedule.paused_at else "active"
    click.echo(
        f"schedule {schedule.name}: {schedule.workflow} at '{schedule.cron}' "
        f"({schedule.timezone}, catch-up {schedule.catchup}), {state}"
    )
    click.echo("next: " + ", ".join(when(t) for t in schedule.next_fire_times))
    if schedule.last_error:
        click.echo(f"last tick: {schedule.last_error}")


@click.group("webhooks")
def webhooks_group() -> None:
    """Webhooks: runs' ends POSTed, signed, to a URL (admin keys)."""


@webhooks_group.command("create")
@click.argument("name")
@click.argument("url")
@click.option(
    "--event",
    "events",
    multiple=True,
    type=click.Choice(["workflow.completed", "workflow.failed", "workflow.cancelled",
                       "task.completed", "task.failed", "task.timed_out"]),
    help="What to send (repeatable) [default: every end of a run].",
)  # fmt: skip
@click.option("--workflow", default=None, help="Only runs of this definition.")
@click.option("--json", "as_json", is_flag=True)
@api_options
def create_webhook(
    name: str,
    url: str,
    events: tuple[str, ...],
    workflow: str | None,
    as_json: bool,
    target: Target,
) -> None:
    """Send events to URL. Prints the signing secret once: keep it where the receiver
    checks signatures (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature)."""
    with target.client() as api:
        made = api.create_webhook(name, url, events=events or None, workflow=workflow)
    if as_json:
        echo_json(made)
        return
    click.echo(f"webhook {made.name}: {', '.join(made.events)} -> {made.url}")
    click.echo(f"secret (shown once): {made.secret}")


@webhooks_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@api_options
def list_webhooks(as_json: bool, target: Target) -> None:
    with target.client() as api:
        found = api.webhooks()
    if as_json:
        echo_json(found)
        return
    rows = [(w.name, w.url, ",".join(w.events), w.workflow or "*") for w in found]
    click.echo(table(("NAME", "URL", "EVENTS", "WORKFLOW"), rows))


@webhooks_group.command("deliveries")
@click.argument("name")
@click.option("--status", type=click.Choice(["PENDING", "DELIVERED", "FAILED"]), default=None)
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@api_options
def list_deliveries(
    name: str, status: str | None, limit: int, as_json: bool, target: Target
) -> None:
    """A webhook's deliveries, newest first."""
    with target.client() as api:
        page = api.deliveries(name, status=status, limit=limit)
    if as_json:
        echo_json(page)
        return
    rows = [
        (d.id, d.event, str(d.workflow_id or "-"), d.status, d.attempts,
         d.last_status or "-", d.last_error or "")
        for d in page.items
    ]  # fmt: skip
    click.echo(table(("ID", "EVENT", "RUN", "STATUS", "ATTEMPTS", "HTTP", "ERROR"), rows))
    click.echo(f"{len(page.items)} of {page.total}")


@webhooks_group.command("delete")
@click.argument("name")
@api_options
def delete_webhook(name: str, target: Target) -> None:
    with target.client() as api:
        api.delete_webhook(name)
    click.echo(f"deleted webhook {name}")
