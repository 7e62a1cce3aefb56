"""Fixtures for the controller's API tests: the real app on the session's Postgres and Redis.

Each test module gets its own database (created on the session's server, dropped at the end)
and the API tests use their own Redis logical database, so other suites sharing the servers
(a scheduler claiming workflows, a test popping the wake list) neither see nor disturb them.

``api_client`` sends the app's admin key with every request, as a client of the real API must;
``keyed_client`` makes clients of any app with a key of one's choosing (``None``: no key).
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis
from fastapi import FastAPI
from psycopg import sql
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import StarletteDeprecationWarning

from orchestrator.controller import create_app
from orchestrator.db import make_engine, make_session_factory
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.scheduler.loop import Scheduler
from orchestrator.services import RunningServices
from orchestrator.services.postgres import create_database
from orchestrator.settings import Settings
from orchestrator.worker.cli import load_tasks
from orchestrator.worker.heartbeat import Heartbeat
from tests.orchestrator.api_support import admin_key_of, api_test_settings, keyed_client
from tests.orchestrator.scheduler_support import close_scheduler, make_scheduler
from workflows.sources import TaskSources

# Starlette 1.x warns that its test client prefers httpx2 over httpx; both work. Importing it
# here, once, keeps that warning (an error under filterwarnings=error) out of the run.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

CHECKOUT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def deployed_tests_package() -> Iterator[None]:
    """Inside, a stack's processes may load the task modules of this ``tests`` package: it is
    among the task packages, and this checkout is on ``PYTHONPATH``. *Why PYTHONPATH:* the
    stack runs its children with ``python -P``, so the working directory is not on their
    path, and ``tests`` is not installed."""
    saved = {name: os.environ.get(name) for name in ("CDIFLOW_TASK_PACKAGES", "PYTHONPATH")}
    paths = [str(CHECKOUT), *filter(None, (saved["PYTHONPATH"] or "").split(os.pathsep))]
    os.environ["CDIFLOW_TASK_PACKAGES"] = "workflows,tests.orchestrator"
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Redis logical database reserved for the API tests (the stack itself uses 0).
API_REDIS_DB = 9
# The worker whose heartbeat ``task_worker`` keeps.
TASK_WORKER = "api-tests-worker"
TASK_MODULES = ("tests.orchestrator.flaky_tasks",)


def _admin_connect(postgres_url: str) -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(postgres_url)
    return psycopg.connect(
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password,
        dbname=url.database,
        autocommit=True,  # CREATE/DROP DATABASE cannot run in a transaction
    )


@pytest.fixture(scope="session")
def make_database(
    postgres_url: str, service_stack: RunningServices
) -> Iterator[Callable[[str], str]]:
    """A factory of empty databases on the session's server, each owned by the role the
    orchestrator uses (which may not create databases itself); all are dropped at the end."""
    created: list[str] = []
    admin_url = service_stack.admin_database_url
    assert admin_url is not None, "the session's Postgres is embedded"

    def make(label: str) -> str:
        name = f"cdiflow_{label}_{uuid.uuid4().hex[:8]}"
        created.append(name)
        return create_database(postgres_url, name, admin_url=admin_url)

    yield make
    with _admin_connect(admin_url) as conn:
        for name in created:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def api_database_url(make_database: Callable[[str], str]) -> str:
    """A database of this module's own, empty until the app migrates it."""
    return make_database("api")


@pytest.fixture(scope="module")
def api_redis_url(redis_url: str) -> str:
    """The session's Redis, logical database ``API_REDIS_DB``."""
    return urlunsplit(urlsplit(redis_url)._replace(path=f"/{API_REDIS_DB}"))


@pytest.fixture(scope="module")
def api_redis(api_redis_url: str) -> Iterator[redis.Redis]:
    """A client of the API tests' Redis database, emptied before and after the module."""
    client = redis.Redis.from_url(api_redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def api_settings(
    tmp_path_factory: pytest.TempPathFactory,
    api_database_url: str,
    api_redis_url: str,
    service_stack: RunningServices,
) -> Settings:
    """Settings naming the module's database and Redis and the session's S3 endpoint (the
    environment cannot override)."""
    data_dir: Path = tmp_path_factory.mktemp("controller")
    return api_test_settings(
        data_dir,
        api_database_url,
        api_redis_url,
        s3_endpoint_url=service_stack.s3_endpoint_url,
        s3_bucket=service_stack.s3_bucket,
        aws_access_key_id=service_stack.aws_access_key_id,
        aws_secret_access_key=service_stack.aws_secret_access_key,
        aws_region=service_stack.aws_region,
    )


@pytest.fixture(scope="module")
def api_app(api_settings: Settings) -> FastAPI:
    """The real app of this module (started by ``api_client``)."""
    return create_app(api_settings)


@pytest.fixture(scope="module")
def api_client(
    api_app: FastAPI, api_settings: Settings, api_redis: redis.Redis
) -> Iterator[TestClient]:
    """The real app, started (migrated, seeded) once per module; requests carry its admin key."""
    with keyed_client(api_app, admin_key_of(api_settings)) as client:
        yield client


@pytest.fixture
def flow(api_client: TestClient) -> str:
    """A fresh two-step workflow definition, so a test's runs are its own to count."""
    name = f"flow_{uuid.uuid4().hex[:8]}"
    body = {"name": name, "tasks": [{"ref": "a", "task": "noop"},
                                    {"ref": "b", "task": "noop", "depends_on": ["a"]}]}  # fmt: skip
    assert api_client.post("/api/workflow-definitions", json=body).status_code == 201
    return name


@pytest.fixture(scope="module")
def api_sessions(api_database_url: str, api_client: TestClient) -> Iterator[sessionmaker[Session]]:
    """Sessions on the module's database, once the app has migrated it."""
    engine = make_engine(api_database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def scheduler(api_settings: Settings, api_client: TestClient) -> Iterator[Scheduler]:
    """A scheduler on the module's database and Redis, driven by hand (no CDI: dataless)."""
    own = make_scheduler(api_settings)
    try:
        yield own
    finally:
        close_scheduler(own)


@pytest.fixture(scope="module")
def api_store(api_database_url: str, api_client: TestClient) -> Iterator[SchedulerStore]:
    """The scheduler's statements on the module's database, once the app has migrated it."""
    engine = make_engine(api_database_url, synchronous_commit=False)
    store = SchedulerStore(engine)
    yield store
    store.close()
    engine.dispose()


@pytest.fixture(scope="module")
def task_worker(api_redis_url: str, api_redis: redis.Redis) -> Iterator[Heartbeat]:
    """The heartbeat of a live worker that loaded the bundled tasks and ``TASK_MODULES``, as
    ``cdiflow worker --tasks tests.orchestrator.flaky_tasks`` announces them (the worker's own
    ``Heartbeat`` and loader, without its slots: these tests run no worker, and the API
    registers only tasks a live worker loaded)."""
    client = redis.Redis.from_url(api_redis_url)
    sources = TaskSources(packages=("workflows", *TASK_MODULES))
    beat = Heartbeat(client, TASK_WORKER, running=lambda: 0, tasks=load_tasks(sources))
    beat.start()
    yield beat
    beat.stop()
    client.close()
