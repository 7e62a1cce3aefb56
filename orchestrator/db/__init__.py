"""The orchestrator's state in Postgres, and every statement any part runs on it.

* ``models``: the tables (their enums are ``orchestrator.contract.vocabulary``'s);
  ``migrations``: their Alembic history, applied at start-up by ``migrate``;
* ``repository``: the API's work, as functions on a SQLAlchemy ``Session``;
* ``async_run_store``: a workflow's start and reads on the API's event loop;
* ``run_statements`` and ``scheduler_store``: the scheduler's work, one statement an event.

    engine = make_engine(database_url)
    migrate(database_url)                  # at start-up, from any number of processes
    Session = make_session_factory(engine)
    with Session() as session:
        run = repository.create_workflow(session, "image_pipeline", {"image": uri})
        session.commit()
"""

from orchestrator.db import repository
from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.db.migrate import migrate
from orchestrator.db.models import (
    Base,
    Event,
    Handoff,
    TaskDefinition,
    TaskRun,
    Workflow,
    WorkflowDefinition,
    WorkflowDefinitionVersion,
)

__all__ = [
    "Base",
    "Event",
    "Handoff",
    "TaskDefinition",
    "TaskRun",
    "Workflow",
    "WorkflowDefinition",
    "WorkflowDefinitionVersion",
    "make_engine",
    "make_session_factory",
    "migrate",
    "repository",
]
