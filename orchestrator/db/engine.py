"""Engine and session factory from a ``postgresql+psycopg://`` URL."""

from __future__ import annotations

import psycopg
from sqlalchemy import Engine, NullPool, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.errors import ConfigError, ServiceError

__all__ = ["disk_full", "make_engine", "make_session_factory", "postgres_failed"]

# Several processes (controller, scheduler, a few workers) share one server whose
# max_connections is typically 100: keep each process's pool small.
POOL_SIZE = 5
MAX_OVERFLOW = 5
SERVING_OPTIONS = ["-c jit=off", "-c max_parallel_workers_per_gather=0"]


def make_engine(
    database_url: str,
    *,
    pool_size: int = POOL_SIZE,
    pooled: bool = True,
    echo: bool = False,
    synchronous_commit: bool = True,
) -> Engine:
    """An engine for ``database_url`` (``postgres://`` is read as psycopg 3).

    Connections are checked before use (``pool_pre_ping``) so a restarted server costs one
    failed ping, not one failed request; waiting for a free connection gives up after 10 s.
    ``pooled=False`` opens a connection per use, for one-shot jobs such as migrations.
    ``synchronous_commit=False`` lets a commit return before its WAL reaches disk (Postgres
    stays consistent; a crash can lose the last fraction of a second of commits), for a
    caller whose writes can be redone. Settings in the URL's ``options=`` (``-c name=value``)
    apply on top of these.
    """
    try:
        url = make_url(database_url)
    except ArgumentError:
        raise ConfigError("DATABASE_URL is not a URL; expected postgresql+psycopg://...") from None
    if url.drivername in {"postgres", "postgresql"}:
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername != "postgresql+psycopg":
        raise ConfigError(
            f"database scheme {url.drivername!r} is not supported; use postgresql+psycopg://"
        )
    options = [] if synchronous_commit else ["-c synchronous_commit=off"]
    # The URL's own ``options=`` go last (of a setting given twice, the server keeps the last):
    # passed as a keyword argument, ours would otherwise replace them.
    query_options = url.query.get("options", ())
    given = [query_options] if isinstance(query_options, str) else list(query_options)
    url = url.difference_update_query(["options"])
    if not pooled:
        options += given
        connect_args: dict[str, object] = {"options": " ".join(options)} if options else {}
        return create_engine(url, poolclass=NullPool, echo=echo, connect_args=connect_args)
    # A pool serves requests and scheduler turns, each statement bounded by a page or a window:
    # no JIT (a statement the planner over-costs, as a range overlap on a large history, was
    # compiled for far longer than it ran) and no parallel workers (their start-up outlasts
    # such a statement, and they take the cores concurrent requests need). One-shot jobs
    # (migrations, unpooled) keep the server's settings.
    options += SERVING_OPTIONS + given
    connect_args = {"options": " ".join(options)}
    # Prepare a statement on the server the second time a connection runs it (psycopg's default
    # is the sixth): a pool's connections each see a hot query only every few requests, and an
    # unprepared one is parsed and planned again each time.
    connect_args["prepare_threshold"] = 1
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=MAX_OVERFLOW,
        pool_timeout=10,
        pool_pre_ping=True,
        pool_recycle=1800,
        echo=echo,
        connect_args=connect_args,
    )


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit, so routes can serialise them."""
    return sessionmaker(engine, expire_on_commit=False)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (psycopg's, or SQLAlchemy's around it) is Postgres out of disk space."""
    return isinstance(getattr(exc, "orig", exc), psycopg.errors.DiskFull)


def postgres_failed(exc: BaseException, what: str) -> ServiceError:
    """``exc`` from Postgres as a ``ServiceError`` a person can act on: ``what`` failed, or,
    for a full disk, that (Postgres answers, but cannot write until space is freed)."""
    if disk_full(exc):
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return ServiceError(
            f"Postgres cannot write: the disk of its data folder is full ({reason}); free "
            "space there and it goes on by itself",
            service="postgres",
        )
    return ServiceError(f"{what}: {type(exc).__name__}: {exc}", service="postgres")
