"""``/api/retention``: how long finished runs are kept, and what pruning has done
(``orchestrator.retention``; a definition's own policy is set under
``/api/workflow-definitions/{name}/retention``)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from orchestrator.controller.api.deps import SessionDep, SettingsDep
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import retention, tallies
from orchestrator.db.models import RetentionState
from orchestrator.schemas import (
    DefinitionRetentionPublic,
    RetentionPassPublic,
    RetentionPublic,
)

router = APIRouter(prefix="/retention", tags=["retention"], route_class=StrictJsonRoute)


@router.get("")
def get_retention(session: SessionDep, settings: SettingsDep) -> RetentionPublic:
    """The default policy, the definitions with their own, the last pass and the totals."""
    own = [
        DefinitionRetentionPublic(
            name=p.name,
            days=p.days,
            results=p.results,
            effective_days=settings.retention_days if p.days is None else p.days,
            effective_results=p.results or settings.retention_results,
        )
        for p in retention.policies(session.connection())
        if p.days is not None or p.results is not None
    ]
    state = session.scalar(select(RetentionState))
    last = None
    if state is not None and state.pass_at is not None:
        last = RetentionPassPublic(
            at=state.pass_at, pruned=state.pass_pruned, seconds=state.pass_seconds,
            error=state.error,
        )  # fmt: skip
    counts = tallies.counts(session, "")
    return RetentionPublic(
        default_days=settings.retention_days,
        default_results=settings.retention_results,
        archive_uri=settings.archive_uri,
        interval_s=settings.retention_interval_s,
        definitions=own,
        last_pass=last,
        pruned_total=counts.get("pruned", 0),
        archived_total=counts.get("archived", 0),
        runs_on_record=sum(n for s, n in counts.items() if s.startswith("workflows:")),
    )
