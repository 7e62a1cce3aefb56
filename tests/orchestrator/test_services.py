"""The embedded services really work, configured URLs win, Postgres and S3 data persist, and
each refuses a client without its generated credentials."""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import psutil
import pytest
import redis
from pydantic import SecretStr
from sqlalchemy import create_engine, text

from orchestrator.child_process import free_port
from orchestrator.errors import ServiceError
from orchestrator.services import (
    ManagedService,
    RedisService,
    RunningServices,
    resolve_services,
    start_services,
)
from orchestrator.services.s3 import REGION
from orchestrator.settings import Settings, load_settings

_URL_ENV = ("DATABASE_URL", "REDIS_URL", "S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY")  # fmt: skip


def _settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings independent of the caller's environment."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": None,
        "redis_url": None,
        "s3_endpoint_url": None,
        "aws_access_key_id": None,
        "aws_secret_access_key": None,
        "aws_region": REGION,
    }
    return load_settings(**(values | overrides))


def _configured(stack: RunningServices, data_dir: Path, **overrides: Any) -> Settings:
    """Settings pointing at the session's services, as production points at managed ones."""
    assert stack.aws_secret_access_key is not None
    urls = {
        "database_url": stack.database_url,
        "redis_url": stack.redis_url,
        "s3_endpoint_url": stack.s3_endpoint_url,
        "aws_access_key_id": stack.aws_access_key_id,
        "aws_secret_access_key": SecretStr(stack.aws_secret_access_key),
    }
    return _settings(data_dir, **(urls | overrides))


def test_postgres_sql_round_trip(postgres_url: str) -> None:
    table = f"round_trip_{uuid.uuid4().hex[:8]}"
    engine = create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE {table} (id serial PRIMARY KEY, body text)"))
            row_id = conn.execute(
                text(f"INSERT INTO {table} (body) VALUES (:body) RETURNING id"), {"body": "héllo"}
            ).scalar_one()
        with engine.connect() as conn:
            body = conn.execute(text(f"SELECT body FROM {table} WHERE id = :id"), {"id": row_id})
            assert body.scalar_one() == "héllo"
            assert conn.execute(text("SELECT current_database()")).scalar_one() == "cdiflow"
            assert conn.execute(text("SHOW max_connections")).scalar_one() == "200"
            assert conn.execute(text("SHOW fsync")).scalar_one() == "on"
            assert conn.execute(text("SHOW listen_addresses")).scalar_one() == "127.0.0.1"
    finally:
        engine.dispose()


def test_redis_lpush_brpop(redis_url: str) -> None:
    key = f"queue:{uuid.uuid4().hex}"
    with redis.Redis.from_url(redis_url) as client:
        assert client.lpush(key, b"first", b"second") == 2
        assert client.brpop([key], timeout=1) == (key.encode(), b"first")
        assert client.config_get("save") == {"save": ""}  # no persistence
        assert client.config_get("appendonly") == {"appendonly": "no"}


def _s3(services: RunningServices, secret: str | None = None) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.aws_region,
        aws_access_key_id=services.aws_access_key_id,
        aws_secret_access_key=secret or services.aws_secret_access_key,
    )


def test_s3_put_get(service_stack: RunningServices) -> None:
    client = _s3(service_stack)
    key = f"objects/{uuid.uuid4().hex}"
    client.put_object(Bucket=service_stack.s3_bucket, Key=key, Body=b"\x00payload\xff")
    got = client.get_object(Bucket=service_stack.s3_bucket, Key=key)
    assert got["Body"].read() == b"\x00payload\xff"
    client.close()


def test_configured_urls_are_used_instead_of_starting(
    service_stack: RunningServices, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    with resolve_services(_configured(service_stack, data_dir)) as services:
        assert services.embedded == ()
        assert services.database_url == service_stack.database_url
        assert services.redis_url == service_stack.redis_url
        assert services.s3_endpoint_url == service_stack.s3_endpoint_url
    assert not data_dir.exists()  # nothing was started, so nothing was written


@pytest.mark.parametrize(
    ("field", "env_name", "url"),
    [
        ("database_url", "DATABASE_URL", "postgresql+psycopg://app:s3cret@127.0.0.1:{port}/app"),
        ("redis_url", "REDIS_URL", "redis://:s3cret@127.0.0.1:{port}/0"),
        ("s3_endpoint_url", "S3_ENDPOINT_URL", "http://127.0.0.1:{port}"),
    ],
)
def test_unreachable_configured_url_gives_actionable_error(
    service_stack: RunningServices, tmp_path: Path, field: str, env_name: str, url: str
) -> None:
    dead = url.format(port=free_port())  # nothing listens there
    settings = _configured(service_stack, tmp_path / "data", **{field: dead})
    with pytest.raises(ServiceError) as caught:
        resolve_services(settings, check_timeout=2)
    message = str(caught.value)
    assert f"{env_name}=" in message
    assert "not reachable" in message
    assert f"unset {env_name}" in message  # the way out
    assert "s3cret" not in message
    assert not (tmp_path / "data").exists()


def test_configured_s3_without_the_bucket_says_so(
    service_stack: RunningServices, tmp_path: Path
) -> None:
    settings = _configured(service_stack, tmp_path, s3_bucket="no-such-bucket")
    with pytest.raises(ServiceError, match="bucket 'no-such-bucket' does not exist"):
        resolve_services(settings)


@pytest.fixture
def fresh_data_dir() -> Iterator[Path]:
    """A data folder outside pytest's basetemp, which pytest keeps at mode 0700 for root.

    (As root, Postgres runs as another user that must be able to reach the folder.)
    """
    path = Path(tempfile.mkdtemp(prefix="cdiflow-test-"))
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


def test_restarted_stack_keeps_postgres_data(
    fresh_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _URL_ENV:
        monkeypatch.delenv(name, raising=False)
    data_dir = fresh_data_dir

    with start_services(data_dir) as first:
        assert {s.name for s in first.embedded} == {"postgres", "redis", "s3"}
        engine = create_engine(first.database_url)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE kept (note text)"))
            conn.execute(text("INSERT INTO kept VALUES ('still here')"))
        engine.dispose()
        client = _s3(first)
        client.put_object(Bucket=first.s3_bucket, Key="kept/object", Body=b"\x00kept\xff")
        client.close()
        pids = [s.pid for s in first.embedded]
    assert not _processes_using(data_dir, pids)

    with start_services(data_dir) as second:
        engine = create_engine(second.database_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT note FROM kept")).scalar_one() == "still here"
        engine.dispose()
        client = _s3(second)
        got = client.get_object(Bucket=second.s3_bucket, Key="kept/object")
        assert got["Body"].read() == b"\x00kept\xff"
        client.close()
        assert second.aws_access_key_id == first.aws_access_key_id  # the same generated keys
    assert not _processes_using(data_dir, [s.pid for s in second.embedded])
    for name in ("postgres.log", "redis.log", "s3.log"):
        assert (data_dir / "logs" / name).stat().st_size > 0


def _processes_using(data_dir: Path, pids: list[int | None]) -> list[psutil.Process]:
    """Live processes among ``pids`` or naming ``data_dir`` on their command line."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] in pids or str(data_dir) in cmdline:
            found.append(proc)
    return found


class _Never(ManagedService):
    """A child that runs but never answers, or exits at once when ``exit_code`` is given."""

    name = "never"

    def __init__(self, data_dir: Path, exit_code: int | None = None) -> None:
        super().__init__(data_dir, start_timeout=0.5, stop_timeout=1)
        self.exit_code = exit_code

    @property
    def url(self) -> str:
        return f"never://{self.port}"

    def _command(self, port: int) -> list[str]:
        if self.exit_code is None:
            return [sys.executable, "-c", "import time; time.sleep(60)"]
        return [sys.executable, "-c", f"print('boom'); raise SystemExit({self.exit_code})"]

    def _probe(self) -> bool:
        return False


def test_start_timeout_names_the_log_and_stops_the_child(tmp_path: Path) -> None:
    service = _Never(tmp_path)
    with pytest.raises(ServiceError, match="did not become ready within") as caught:
        service.start()
    assert str(service.log_file) in str(caught.value)
    assert caught.value.log_file == service.log_file
    assert not service.running
    leftovers = [p for p in psutil.Process().children() if "time.sleep(60)" in p.cmdline()]
    assert not leftovers


def test_child_exiting_at_start_shows_its_output(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match=r"exited with status 3(.|\n)*boom"):
        _Never(tmp_path, exit_code=3).start()


def test_fixed_port_in_use_is_reported(service_stack: RunningServices, tmp_path: Path) -> None:
    busy = int(service_stack.redis_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(ServiceError, match=f"port {busy} on 127.0.0.1 is already in use"):
        RedisService(tmp_path, port=busy).start()


class _Stubborn(_Never):
    """Ready at once, but ignores SIGTERM."""

    def _command(self, port: int) -> list[str]:
        code = (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(6 * 7, flush=True); time.sleep(60)"
        )
        return [sys.executable, "-c", code]

    def _probe(self) -> bool:
        return "42" in self._log_tail().splitlines()  # printed once SIGTERM is ignored


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    service = _Stubborn(tmp_path).start()
    pid = service.pid
    assert pid is not None
    began = time.monotonic()
    service.stop()  # SIGTERM, then SIGKILL after stop_timeout (1s)
    assert time.monotonic() - began >= 1
    assert not service.running
    assert not psutil.pid_exists(pid)


def test_a_free_port_is_drawn_below_the_ports_outgoing_connections_take() -> None:
    """A port a child is to listen on comes from below the kernel's ephemeral range, which
    outgoing connections take their local ports from, and is bindable when given."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low < 21000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it to draw from")
    ports = {free_port() for _ in range(20)}
    assert all(port < low for port in ports), (sorted(ports), low)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
