"""The orchestrator's Postgres tables as typed SQLAlchemy models.

Postgres is the source of truth: definitions, workflows, task runs (one row per attempt), CDI
ownership hand-offs and an event log. Change a model only together with a new Alembic revision
in ``orchestrator/db/migrations/versions`` (the tests compare the two). The status, policy and
data plane columns are Postgres enums of ``orchestrator.contract.vocabulary``.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from orchestrator.apikeys import Role
from orchestrator.contract.vocabulary import (
    CatchUp,
    DataPlane,
    DeliveryStatus,
    Policy,
    ResultRetention,
    TaskRunStatus,
    WorkflowStatus,
)

__all__ = [
    "ApiKey",
    "Base",
    "Event",
    "Handoff",
    "RetentionState",
    "Schedule",
    "TaskDefinition",
    "TaskRun",
    "Webhook",
    "WebhookDelivery",
    "Workflow",
    "WorkflowDefinition",
    "WorkflowDefinitionVersion",
    "WorkflowTag",
    "tallies",
    "tally_deltas",
    "tally_hours",
    "tally_minutes",
]

# Deterministic constraint names, so migrations can refer to them.
_NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _enum(cls: type[enum.StrEnum], name: str) -> Enum:
    # Store the values ("object-store"), not the member names, as the Postgres enum labels.
    return Enum(cls, name=name, values_callable=lambda members: [m.value for m in members])


def _now() -> Any:
    return func.now()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=_NAMING)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSONB,
        list[dict[str, Any]]: JSONB,
        list[str]: ARRAY(String(64)),
    }


class TaskDefinition(Base):
    """A task the workers can run: ``module`` is ``"package.module:function"``."""

    __tablename__ = "task_definitions"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    module: Mapped[str] = mapped_column(String(255))
    timeout_s: Mapped[float] = mapped_column(Double)
    retries: Mapped[int] = mapped_column(Integer)
    retry_backoff_s: Mapped[float] = mapped_column(Double)
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    # At most this many task runs of this task out at once over every scheduler (None: no
    # limit); held as leases in Redis (``scheduler/limits.py``).
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(server_default=_now())
    updated_at: Mapped[datetime] = mapped_column(server_default=_now(), onupdate=_now())


class WorkflowDefinition(Base):
    """A named DAG of steps: ``tasks`` is ``[{"ref", "task", "depends_on": [...]}, ...]``.

    The row holds the current version (``version``, with its ``description`` and ``tasks``);
    every version, the current one included, is kept in ``WorkflowDefinitionVersion``. A
    deleted definition keeps its row and versions (``deleted_at`` is set), so the runs on
    record still say what they ran; it takes no new runs until it is created again.
    """

    __tablename__ = "workflow_definitions"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    tasks: Mapped[list[dict[str, Any]]]
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # The current version's run settings (see ``WorkflowDefinitionVersion``).
    timeout_s: Mapped[float | None] = mapped_column(Double)
    worker_wait_s: Mapped[float | None] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(server_default=_now())
    updated_at: Mapped[datetime] = mapped_column(server_default=_now(), onupdate=_now())
    deleted_at: Mapped[datetime | None]
    # Settings of the definition as a queue, not of a version: the priority of its runs when
    # a start names none, how many of its runs may be RUNNING at once (None: any number),
    # and since when its new runs wait PENDING (None: not paused).
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_concurrent_runs: Mapped[int | None] = mapped_column(Integer)
    paused_at: Mapped[datetime | None]
    # How long its finished runs are kept, and what pruning does to their results; null:
    # the settings' default (``orchestrator.retention``). Not versioned: a policy, not steps.
    retention_days: Mapped[int | None] = mapped_column(Integer)
    retention_results: Mapped[ResultRetention | None] = mapped_column(
        _enum(ResultRetention, "result_retention")
    )


class WorkflowDefinitionVersion(Base):
    """One version of a workflow definition, never changed once written.

    A run records the version it was started with (``Workflow.definition_version``) and the
    scheduler runs that version's steps, so saving a new version leaves running workflows as
    they are.
    """

    __tablename__ = "workflow_definition_versions"

    name: Mapped[str] = mapped_column(
        String(64),
        ForeignKey("workflow_definitions.name", ondelete="CASCADE"),
        primary_key=True,
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    tasks: Mapped[list[dict[str, Any]]]
    # How long a run may take (a start may set its own), and how long a step may wait for a
    # live worker able to run it; null: no limit (see ``workflows.definitions``).
    timeout_s: Mapped[float | None] = mapped_column(Double)
    worker_wait_s: Mapped[float | None] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(server_default=_now())


class Workflow(Base):
    """One run of a workflow definition.

    ``claimed_by``/``claimed_at`` record which scheduler took it (see
    ``claim_pending_workflows``); ``retry_of`` links a retry to the run it repeats.
    """

    __tablename__ = "workflows"
    # Every list is newest first by (created_at, id), paged by that key: each filter by
    # equality has an index that leads with it and ends with that key, so a page reads its own
    # rows only; input is matched by its GIN index, a tag by ``WorkflowTag``'s key.
    # ``definition, finished_at``: what retention prunes, per definition. ``retry_of``: a
    # pruned run's retries lose the link (ON DELETE SET NULL) without a scan.
    __table_args__ = (
        Index("ix_workflows_created_at_id", "created_at", "id"),
        # (tags: a list by status and tag tests them in the index, not in the table)
        Index(
            "ix_workflows_status_created_at_id_tags",
            "status",
            "created_at",
            "id",
            postgresql_include=["tags"],
        ),
        Index("ix_workflows_definition_created_at_id", "definition", "created_at", "id"),
        Index("ix_workflows_policy_created_at_id", "policy", "created_at", "id"),
        Index(
            "ix_workflows_schedule_id_created_at_id",
            "schedule_id",
            "created_at",
            "id",
            postgresql_where=text("schedule_id IS NOT NULL"),
        ),
        Index(
            "ix_workflows_definition_finished_at",
            "definition",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL"),
        ),
        Index("ix_workflows_retry_of", "retry_of", postgresql_where=text("retry_of IS NOT NULL")),
        # What a claim walks: the PENDING runs, highest priority first, oldest first.
        Index(
            "ix_workflows_pending_priority",
            text("priority DESC"),
            "created_at",
            "id",
            postgresql_where=text("status = 'PENDING'"),
        ),
        # What a claim counts for a definition with a limit: its RUNNING runs.
        Index(
            "ix_workflows_running_definition",
            "definition",
            postgresql_where=text("status = 'RUNNING'"),
        ),
        # One run per (caller, Idempotency-Key), and one per tick of a schedule.
        Index(
            "uq_workflows_idempotency",
            "started_by",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        UniqueConstraint("schedule_id", "scheduled_for"),
        Index(
            "ix_workflows_input",
            "input",
            postgresql_using="gin",
            postgresql_ops={"input": "jsonb_path_ops"},
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    # RESTRICT: a definition with runs on record cannot disappear from under them.
    definition: Mapped[str] = mapped_column(
        String(64), ForeignKey("workflow_definitions.name", ondelete="RESTRICT")
    )
    # The version of the definition this run runs. No foreign key to the versions table:
    # versions are never deleted, and a start (the API's hottest write) would pay for the check.
    definition_version: Mapped[int] = mapped_column(Integer)
    status: Mapped[WorkflowStatus] = mapped_column(
        _enum(WorkflowStatus, "workflow_status"), default=WorkflowStatus.PENDING
    )
    policy: Mapped[Policy] = mapped_column(_enum(Policy, "workflow_policy"))
    data_plane: Mapped[DataPlane] = mapped_column(_enum(DataPlane, "data_plane"))
    input: Mapped[dict[str, Any]]
    output: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    result_uri: Mapped[str | None] = mapped_column(Text)
    retry_of: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("workflows.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(server_default=_now())
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None]
    # The name of the API key that started the run (or retried it into being).
    started_by: Mapped[str | None] = mapped_column(String(64))
    # Served highest first among waiting runs (claims and placement); from the start, else
    # the definition's.
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    tags: Mapped[list[str]] = mapped_column(default=list, server_default="{}")
    # The start's ``Idempotency-Key`` and the SHA-256 of its body: a retry with the same key
    # and body gets this run; another body with the same key is refused.
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_digest: Mapped[str | None] = mapped_column(String(64))
    # The schedule that made it, and the tick it was made for.
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("schedules.id", ondelete="SET NULL")
    )
    scheduled_for: Mapped[datetime | None]
    # Since when its next steps wait (None: not paused).
    paused_at: Mapped[datetime | None]
    # The longest the run may take from its start, in seconds (the start's, else its
    # definition version's); past it the run ends TIMED_OUT. Null: no limit.
    timeout_s: Mapped[float | None] = mapped_column(Double)
    # What the run waits for while it cannot go on by itself (no live worker can take its
    # next step), for a person to read; null otherwise.
    status_detail: Mapped[str | None] = mapped_column(Text)


class WorkflowTag(Base):
    """A run's tag, with the run's ``created_at``: the runs with a tag, newest first, in its
    key (migration 0013). Written by triggers on ``workflows`` as runs are inserted (or their
    tags change); deleted with the run."""

    __tablename__ = "workflow_tags"
    __table_args__ = (Index("ix_workflow_tags_workflow_id", "workflow_id"),)

    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(primary_key=True)
    workflow_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("workflows.id", ondelete="CASCADE"), primary_key=True
    )


class TaskRun(Base):
    """One attempt of one step of a workflow; timings in milliseconds, sizes in bytes."""

    __tablename__ = "task_runs"
    # ``ix_task_runs_ran``: the span each finished run ran, for "what ran within a window"
    # (a GiST index answers the overlap, however old or empty the window); the planner's
    # estimate of a window comes from the statistics ``st_task_runs_ran`` (migration 0014).
    __table_args__ = (
        UniqueConstraint("workflow_id", "ref", "attempt"),
        Index("ix_task_runs_status", "status"),
        Index(
            "ix_task_runs_ran",
            text("tstzrange(LEAST(started_at, finished_at), finished_at, '[]')"),
            postgresql_using="gist",
            postgresql_where=text("started_at IS NOT NULL AND finished_at IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    workflow_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("workflows.id", ondelete="CASCADE"))
    # A step's ref; a sub-workflow's step is "<ref>/<its ref>", a fan-out's element "<ref>[i]".
    ref: Mapped[str] = mapped_column(String(255))
    task: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[TaskRunStatus] = mapped_column(
        _enum(TaskRunStatus, "task_run_status"), default=TaskRunStatus.QUEUED
    )
    worker_id: Mapped[str | None] = mapped_column(String(128))
    queued_at: Mapped[datetime] = mapped_column(server_default=_now())
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    queue_wait_ms: Mapped[float | None] = mapped_column(Double)
    run_ms: Mapped[float | None] = mapped_column(Double)
    # CPU time of the task function alone (its thread): what the task cost, apart from the
    # worker's own work and from waiting for a core.
    cpu_ms: Mapped[float | None] = mapped_column(Double)
    bytes_in: Mapped[int | None] = mapped_column(BigInteger)
    bytes_out: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    # Where the task was when it failed or was stopped: its traceback, cut to
    # ``contract.messages.MAX_TRACEBACK`` characters (null when the failure was not the task's).
    traceback: Mapped[str | None] = mapped_column(Text)
    output: Mapped[dict[str, Any] | None]
    # The named data it read and made: {"reads": {name: datum}, "made": {name: datum}}, each
    # datum {"key", "kind"} (an object), {"value"} or {"items": [...]}; results their "uri".
    data: Mapped[dict[str, Any] | None]


class Handoff(Base):
    """A CDI ownership transfer between two containers on behalf of a workflow."""

    __tablename__ = "handoffs"
    # ``task_run_id``: a pruned task run's hand-offs lose the link (SET NULL) without a scan.
    __table_args__ = (
        Index("ix_handoffs_workflow_id", "workflow_id"),
        Index(
            "ix_handoffs_task_run_id",
            "task_run_id",
            postgresql_where=text("task_run_id IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    workflow_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("workflows.id", ondelete="CASCADE"))
    task_run_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("task_runs.id", ondelete="SET NULL")
    )
    from_container: Mapped[str] = mapped_column(String(128))
    to_container: Mapped[str] = mapped_column(String(128))
    bytes: Mapped[int] = mapped_column(BigInteger)
    duration_us: Mapped[float] = mapped_column(Double)
    # The CDI hosts of the two containers (null where unknown): different ones mean the
    # object's bytes crossed between hosts.
    from_host: Mapped[str | None] = mapped_column(String(128))
    to_host: Mapped[str | None] = mapped_column(String(128))
    # Which datum ("<step>.<output>") moved, and how: "transfer" (ownership), "share" (a
    # read-only share: the owner keeps it) or "copy" (a reader on another host gets its own).
    datum: Mapped[str | None] = mapped_column(String(255))
    mode: Mapped[str | None] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(server_default=_now())


class Event(Base):
    """Something that happened, for the dashboard and post-mortems; ``kind`` like
    ``"workflow.created"``. ``workflow_id`` is null for cluster-wide events."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_workflow_id_id", "workflow_id", "id"),
        Index("ix_events_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    workflow_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("workflows.id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    at: Mapped[datetime] = mapped_column(server_default=_now())


class ApiKey(Base):
    """A key the REST API accepts: only its SHA-256 digest is stored (``orchestrator.apikeys``).

    ``configured`` marks the admin key that comes from the API's settings
    (``CDIFLOW_ADMIN_KEY``): every API start writes its digest again, so it cannot be revoked
    through the API, only by changing that setting.
    """

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[Role] = mapped_column(_enum(Role, "api_key_role"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    configured: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(server_default=_now())


def _tally_columns(*, key: bool, moment: str = "minute") -> list[Column[Any]]:
    return [
        Column(moment, DateTime(timezone=True), primary_key=key, nullable=False),
        Column("series", String(100), primary_key=key, nullable=False),
        Column("bucket", SmallInteger, primary_key=key, nullable=False),
        Column("n", BigInteger, nullable=False, server_default="0"),
        Column("total", Double, nullable=False, server_default="0"),
        Column("peak", Double),
    ]


# Figures kept as runs change, not counted from them (``orchestrator.db.tallies``): a row per
# minute (``-infinity``: all time), series and histogram bucket (-1: none). The triggers of
# workflows, task runs and hand-offs append to ``tally_deltas`` (no lock, no index: each
# statement adds its own rows); housekeeping folds them into ``tallies``; readers add both.
tallies = Table(
    "tallies", Base.metadata, *_tally_columns(key=True), postgresql_with={"fillfactor": "70"}
)
tally_deltas = Table("tally_deltas", Base.metadata, *_tally_columns(key=False))
# The per-minute rows of ``tallies`` summed by hour (UTC), kept so by a trigger on ``tallies``.
tally_hours = Table(
    "tally_hours",
    Base.metadata,
    *_tally_columns(key=True, moment="hour"),
    postgresql_with={"fillfactor": "70"},
)
# Each kept minute's overview figures (runs completed, failed and started; the p50 and p95 of
# its completions), summed by a trigger on ``tallies`` as its rows change (migration 0012).
tally_minutes = Table(
    "tally_minutes",
    Base.metadata,
    Column("minute", DateTime(timezone=True), primary_key=True),
    Column("completed", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column("created", BigInteger, nullable=False),
    Column("p50_ms", Double),
    Column("p95_ms", Double),
    postgresql_with={"fillfactor": "70"},
)


class RetentionState(Base):
    """The last retention pass (one row): when it ran, what it pruned, its last failure."""

    __tablename__ = "retention_state"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    pass_at: Mapped[datetime | None]
    pass_pruned: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    pass_seconds: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    error_at: Mapped[datetime | None]


class Schedule(Base):
    """Runs of a definition at the ticks of a cron expression (``orchestrator.cron``), made by
    whichever scheduler finds a tick due first: a row lock and the unique ``(schedule_id,
    scheduled_for)`` of ``workflows`` make each tick one run."""

    __tablename__ = "schedules"
    __table_args__ = (
        Index(
            "ix_schedules_next_fire_at", "next_fire_at", postgresql_where=text("paused_at IS NULL")
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    definition: Mapped[str] = mapped_column(
        String(64), ForeignKey("workflow_definitions.name", ondelete="CASCADE")
    )
    cron: Mapped[str] = mapped_column(String(255))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC", server_default="UTC")
    catchup: Mapped[CatchUp] = mapped_column(_enum(CatchUp, "schedule_catchup"))
    # A tick later than this is missed (what ``catchup`` decides about).
    grace_s: Mapped[float] = mapped_column(Double)
    # What each run starts with: as in a start's body.
    input: Mapped[dict[str, Any]]
    policy: Mapped[Policy] = mapped_column(_enum(Policy, "workflow_policy"))
    data_plane: Mapped[DataPlane] = mapped_column(_enum(DataPlane, "data_plane"))
    version: Mapped[int | None] = mapped_column(Integer)  # None: the current one at each tick
    priority: Mapped[int | None] = mapped_column(Integer)  # None: the definition's
    tags: Mapped[list[str]] = mapped_column(default=list, server_default="{}")
    next_fire_at: Mapped[datetime]
    paused_at: Mapped[datetime | None]
    last_fired_at: Mapped[datetime | None]  # the tick of its latest run
    last_run_id: Mapped[uuid.UUID | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(server_default=_now())


class Webhook(Base):
    """Where to tell of runs' (and steps') ends: a URL an admin registered, and the secret
    its deliveries are signed with (shown once, when it is made; never logged)."""

    __tablename__ = "webhooks"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]]
    definition: Mapped[str | None] = mapped_column(String(64))  # None: every definition's runs
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(server_default=_now())


class WebhookDelivery(Base):
    """One event for one webhook, written in the statement that ended the run (or recorded
    the step), then sent, retried with backoff, and logged here."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),
        # A webhook's log by status, newest first; a pruned run's deliveries go with it.
        Index("ix_webhook_deliveries_webhook_id_status_id", "webhook_id", "status", "id"),
        Index(
            "ix_webhook_deliveries_workflow_id",
            "workflow_id",
            postgresql_where=text("workflow_id IS NOT NULL"),
        ),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("status = 'PENDING'"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    webhook_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(64))
    workflow_id: Mapped[uuid.UUID | None]
    payload: Mapped[dict[str, Any]]
    status: Mapped[DeliveryStatus] = mapped_column(
        _enum(DeliveryStatus, "delivery_status"), default=DeliveryStatus.PENDING
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(server_default=_now())
    last_status: Mapped[int | None] = mapped_column(Integer)  # the receiver's HTTP status
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=_now())
    delivered_at: Mapped[datetime | None]
