"""The state layer under the API, on real Postgres: claims never overlap, stale claims are
taken over, migrations are idempotent and match the models."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.db import Base, make_engine, make_session_factory, migrate
from orchestrator.db import repository as repo
from orchestrator.db.migrate import head_revision
from orchestrator.db.run_statements import CLAIM, claimed_from_row
from orchestrator.db.scheduler_store import SchedulerStore

# Tasks are registered only when a live worker loaded them.
pytestmark = pytest.mark.usefixtures("task_worker")


@pytest.fixture
def claim_database(make_database: Callable[[str], str]) -> Iterator[Engine]:
    """A database of its own (a claim takes every PENDING run it finds), seeded, with an
    engine on it."""
    url = make_database("claims")
    migrate(url)
    engine = make_engine(url)
    with make_session_factory(engine)() as session:
        repo.seed_bundled_definitions(session)
        session.commit()
    yield engine
    engine.dispose()


def _pending_runs(engine: Engine, count: int) -> set[uuid.UUID]:
    with make_session_factory(engine)() as session:
        made = [repo.create_workflow(session, "noop_pipeline", {}) for _ in range(count)]
        session.commit()
        return {w.id for w in made}


def test_concurrent_claims_never_overlap(claim_database: Engine) -> None:
    """Two schedulers claim at the same moment, each holding its row locks a while before
    it commits: ``SKIP LOCKED`` makes each skip the other's rows."""
    pending = _pending_runs(claim_database, 30)
    claims: dict[str, list[uuid.UUID]] = {"s1": [], "s2": []}
    last_batch = {"s1": -1, "s2": -1}
    barrier = threading.Barrier(2)
    dsn = claim_database.url.set(drivername="postgresql").render_as_string(hide_password=False)

    def scheduler(name: str) -> None:
        with psycopg.connect(dsn) as conn:
            while True:
                barrier.wait(timeout=30)  # both claim at the same moment, every round
                with conn.transaction():
                    params = {"me": name, "limit": 4, "reclaim_s": 60.0}
                    batch = [claimed_from_row(r) for r in conn.execute(CLAIM, params)]
                    time.sleep(0.02)  # hold the row locks while the other one claims
                claims[name] += [c.id for c in batch]
                last_batch[name] = len(batch)
                barrier.wait(timeout=30)  # both rounds done: both read the same last_batch
                if not any(last_batch.values()):
                    return

    threads = [threading.Thread(target=scheduler, args=(n,)) for n in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    s1, s2 = claims["s1"], claims["s2"]
    assert s1 and s2 and not set(s1) & set(s2)
    assert sorted(s1 + s2) == sorted(pending)  # every one claimed, exactly once
    with claim_database.connect() as conn:
        query = text("SELECT id, claimed_by FROM workflows WHERE status = 'RUNNING'")
        owners = {wid: owner for wid, owner in conn.execute(query)}
    assert all(owners[w] == "s1" for w in s1) and all(owners[w] == "s2" for w in s2)


def test_stale_claims_are_taken_over(claim_database: Engine) -> None:
    """A PENDING run whose claim is older than the reclaim time is claimed again."""
    [run] = _pending_runs(claim_database, 1)
    with claim_database.begin() as conn:
        conn.execute(
            text("UPDATE workflows SET claimed_by = 'old', claimed_at = now() - interval '1 hour'")
        )
    store = SchedulerStore(claim_database)
    try:
        assert store.claim("new", 1000, reclaim_after_s=2 * 3600) == []
        [taken] = store.claim("new", 1000, reclaim_after_s=60)
        assert (taken.id, taken.definition, taken.policy) == (run, "noop_pipeline", "affinity")
        assert store.status(run) is WorkflowStatus.RUNNING
    finally:
        store.close()


def test_a_pooled_engine_serves_without_jit_or_parallel_workers(api_database_url: str) -> None:
    """The API's and scheduler's pools run bounded statements: no JIT, no parallel workers;
    a one-shot engine (migrations) keeps the server's settings."""
    settings = "SELECT current_setting('jit'), current_setting('max_parallel_workers_per_gather')"
    serving, one_shot = make_engine(api_database_url), make_engine(api_database_url, pooled=False)
    try:
        with serving.connect() as conn:
            assert tuple(conn.execute(text(settings)).one()) == ("off", "0")
        with one_shot.connect() as conn:
            defaults = text(
                "SELECT reset_val FROM pg_settings WHERE name = 'max_parallel_workers_per_gather'"
            )
            ours = conn.execute(text(settings)).one()
            assert ours[1] == conn.execute(defaults).scalar_one() != "0"
    finally:
        serving.dispose()
        one_shot.dispose()


def test_a_urls_own_options_apply_on_top_of_the_engines(api_database_url: str) -> None:
    """``options=`` in DATABASE_URL is kept beside the engine's settings, and wins where both
    set one."""
    url = make_url(api_database_url).update_query_dict(
        {"options": "-c statement_timeout=4321 -c jit=on"}
    )
    given = url.render_as_string(hide_password=False)
    settings = text(
        "SELECT current_setting('statement_timeout'), current_setting('jit'), "
        "current_setting('max_parallel_workers_per_gather'), current_setting('synchronous_commit')"
    )
    serving, one_shot = (
        make_engine(given, synchronous_commit=False),
        make_engine(given, pooled=False),
    )
    try:
        with serving.connect() as conn:
            # the URL's two, and the engine's own where the URL is silent
            assert tuple(conn.execute(settings).one()) == ("4321ms", "on", "0", "off")
        with one_shot.connect() as conn:
            assert tuple(conn.execute(settings).one())[:2] == ("4321ms", "on")
    finally:
        serving.dispose()
        one_shot.dispose()


def test_migrate_is_idempotent_and_matches_the_models(api_database_url: str) -> None:
    head = head_revision()
    assert head is not None
    assert migrate(api_database_url) == head  # the app already migrated: nothing to do
    assert migrate(api_database_url) == head
    engine = make_engine(api_database_url, pooled=False)
    try:
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM alembic_version")) == 1
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        engine.dispose()


def test_concurrent_first_migrations(make_database: Callable[[str], str]) -> None:
    url = make_database("migrate")
    results: list[str | None] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(url))
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and results == [head_revision()] * 3
