"""What the routes use: a database session per request, the Redis clients, the run store on
the event loop, the settings and the S3 client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import redis
import redis.asyncio
from fastapi import Depends, Request
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.db.async_run_store import AsyncRunStore
from orchestrator.objectstore import ObjectStore
from orchestrator.settings import Settings, load_settings

__all__ = [
    "RedisDep",
    "Resources",
    "SessionDep",
    "SettingsDep",
    "StoreDep",
    "get_db",
    "get_redis",
    "get_settings",
    "get_store",
    "run_store",
    "utc",
]


@dataclass(frozen=True)
class Resources:
    """What the app opens at start-up and closes at shutdown (``app.state.resources``)."""

    engine: Engine
    sessions: sessionmaker[Session]
    redis: redis.Redis

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A pooled connection whose every statement is its own transaction: no ``BEGIN`` or
        ``ROLLBACK`` round trips around a single write or a read-only request."""
        with self.engine.connect() as connection:
            yield connection.execution_options(isolation_level="AUTOCOMMIT")

    def close(self) -> None:
        """Release the connection pools."""
        self.redis.close()
        self.engine.dispose()


def _resources(request: Request) -> Resources:
    resources: Resources = request.app.state.resources
    return resources


def get_db(request: Request) -> Iterator[Session]:
    """A session for one request; rolled back (if not committed) and closed afterwards."""
    with _resources(request).sessions() as session:
        yield session


def get_redis(request: Request) -> redis.Redis:
    """The app's Redis client (thread-safe, pooled)."""
    return _resources(request).redis


def get_settings(request: Request) -> Settings:
    """The settings the app was made with (from the environment for an app made without)."""
    settings: Settings | None = getattr(request.app.state, "settings", None)
    return settings or load_settings()


def get_store(request: Request) -> ObjectStore:
    """The app's S3 client, made on first use (it is costly to build) and then shared; it
    reads and writes only where the S3 policy lets cdiflow (``orchestrator.s3policy``)."""
    state = request.app.state
    store: ObjectStore | None = getattr(state, "object_store", None)
    if store is None:
        store = state.object_store = ObjectStore(get_settings(request), enforce=True)
    return store


SessionDep = Annotated[Session, Depends(get_db)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ObjectStore, Depends(get_store)]


def run_store(request: Request) -> AsyncRunStore:
    """The app's store for a workflow's start and reads on the event loop."""
    store: AsyncRunStore = request.app.state.run_store
    return store


def utc(moment: datetime) -> datetime:
    """A moment from a query: one without a zone is read as UTC, not as the database
    session's zone."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
