"""The orchestrator's state in Postgres: models, engine, migrations and the repository.

engine = make_engine(database_url)
migrate(database_url)                      # at start-up, from any number of processes
Session = make_session_factory(engine)
with Session() as session:
    claimed = repository.claim_pending_workflows(session, "scheduler-1", 10)
    session.commit()
"""

from orchestrator.db import repository
from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.db.migrate import migrate
from orchestrator.db.models import (
    Base,
    DataPlane,
    Event,
    Handoff,
    Policy,
    TaskDefinition,
    TaskRun,
    TaskRunStatus,
    Workflow,
    WorkflowDefinition,
    WorkflowDefinitionVersion,
    WorkflowStatus,
)

__all__ = [
    "Base",
    "DataPlane",
    "Event",
    "Handoff",
    "Policy",
    "TaskDefinition",
    "TaskRun",
    "TaskRunStatus",
    "Workflow",
    "WorkflowDefinition",
    "WorkflowDefinitionVersion",
    "WorkflowStatus",
    "make_engine",
    "make_session_factory",
    "migrate",
    "repository",
]
