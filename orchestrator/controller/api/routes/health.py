"""``/api/healthz``: is the controller able to reach Postgres and Redis?"""

from __future__ import annotations

import redis
from fastapi import APIRouter, Response
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.controller.api.deps import RedisDep, SessionDep
from orchestrator.controller.schemas import HealthPublic
from orchestrator.controller.strict_json import StrictJsonRoute

router = APIRouter(tags=["health"], route_class=StrictJsonRoute)


@router.get("/healthz", responses={503: {"model": HealthPublic}})
def healthz(session: SessionDep, client: RedisDep, response: Response) -> HealthPublic:
    """200 when the database and Redis both answer; 503 naming the one that does not."""
    try:
        session.execute(text("SELECT 1"))
        database = "ok"
    except SQLAlchemyError as exc:
        database = f"unavailable: {type(exc).__name__}"
    try:
        client.ping()
        cache = "ok"
    except redis.RedisError as exc:
        cache = f"unavailable: {type(exc).__name__}"
    healthy = database == "ok" and cache == "ok"
    if not healthy:
        response.status_code = 503
    return HealthPublic(status="ok" if healthy else "unavailable", database=database, redis=cache)
