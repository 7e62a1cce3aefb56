"""``/api/schedules``: cron schedules that start runs of a definition; the schedulers fire
them (``orchestrator.scheduler.schedules``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from fastapi import APIRouter, Request, Response

from orchestrator.contract import SCHEDULES, wake_scheduler
from orchestrator.controller.api.deps import RedisDep, SessionDep
from orchestrator.controller.api.params import NameFilter, ResourceName
from orchestrator.controller.auth import Operator
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.cron import Cron
from orchestrator.db import repository as repo
from orchestrator.db.models import Schedule
from orchestrator.s3policy import S3Policy
from orchestrator.schemas import ScheduleCreate, SchedulePublic, error_responses

router = APIRouter(prefix="/schedules", tags=["schedules"], route_class=StrictJsonRoute)

NEXT_TIMES: Final = 5  # next fire times shown with each schedule


def _public(row: Schedule) -> SchedulePublic:
    shown = SchedulePublic.model_validate(row)
    cron = Cron.of(row.cron, row.timezone)
    start = row.next_fire_at
    if row.paused_at is not None:  # if resumed now: from the first tick after now
        start = cron.next_after(datetime.now(UTC))
    times = [start, *cron.next_times(start, NEXT_TIMES - 1)]
    return shown.model_copy(update={"next_fire_at": start, "next_fire_times": times})


@router.post("", status_code=201, responses=error_responses(404, 409, 422))
def create_schedule(
    body: ScheduleCreate,
    session: SessionDep,
    client: RedisDep,
    request: Request,
    response: Response,
    principal: Operator,
) -> SchedulePublic:
    """Make a schedule: a run of ``workflow`` at each tick of ``cron`` in ``timezone``, each
    tick once however many schedulers run. 422 for an expression or a zone that is not one
    (or never fires), 404 for an unknown definition, 409 if the name is taken."""
    Cron.of(body.cron, body.timezone)  # InvalidRequest (422) naming the problems
    if body.input.image is not None:
        policy: S3Policy = request.app.state.s3_policy
        policy.check_input(body.input.image)
    values = {
        "name": body.name,
        "definition": body.workflow,
        "cron": body.cron,
        "timezone": body.timezone,
        "catchup": body.catchup,
        "grace_s": body.grace_s,
        "input": body.input.model_dump(exclude_defaults=True),
        "policy": body.policy,
        "data_plane": body.data_plane,
        "version": body.version,
        "priority": body.priority,
        "tags": list(dict.fromkeys(body.tags)),
        "created_by": principal.name,
    }
    row = repo.create_schedule(session, values, paused=body.paused)
    session.commit()
    wake_scheduler(client, None, what=SCHEDULES)
    response.headers["Location"] = f"/api/schedules/{row.name}"
    return _public(row)


@router.get("")
def list_schedules(session: SessionDep, workflow: NameFilter = None) -> list[SchedulePublic]:
    """Every schedule (of ``workflow``), by name, with its next fire times."""
    return [_public(r) for r in repo.list_schedules(session, workflow)]


@router.get("/{name}", responses=error_responses(404))
def get_schedule(name: ResourceName, session: SessionDep) -> SchedulePublic:
    return _public(repo.get_schedule(session, name))


@router.post("/{name}/pause", responses=error_responses(404))
def pause_schedule(name: ResourceName, session: SessionDep, principal: Operator) -> SchedulePublic:
    """Stop firing until ``resume``; the ticks in between are not caught up."""
    row = repo.pause_schedule(session, name, paused=True)
    session.commit()
    return _public(row)


@router.post("/{name}/resume", responses=error_responses(404))
def resume_schedule(
    name: ResourceName, session: SessionDep, client: RedisDep, principal: Operator
) -> SchedulePublic:
    """Fire again, from the first tick after now."""
    row = repo.pause_schedule(session, name, paused=False)
    session.commit()
    wake_scheduler(client, None, what=SCHEDULES)
    return _public(row)


@router.delete("/{name}", status_code=204, responses=error_responses(404))
def delete_schedule(name: ResourceName, session: SessionDep, principal: Operator) -> None:
    """Delete a schedule; the runs it made stay."""
    repo.delete_schedule(session, name)
    session.commit()
