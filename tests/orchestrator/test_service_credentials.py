"""The embedded services, tried as a local attacker would: a client without the generated
credentials is refused everywhere, and the cdiflow role can do nothing a superuser could."""

from __future__ import annotations

import stat
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import psycopg
import pytest
import redis
from botocore.exceptions import ClientError
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

from orchestrator.services import RunningServices
from orchestrator.services.credentials import ServiceCredentials, credentials_path


def _pg(url: str, **changes: str | None) -> psycopg.Connection[tuple[object, ...]]:
    parts = make_url(url)
    given: dict[str, str | int | None] = {
        "host": parts.host,
        "port": parts.port,
        "user": parts.username,
        "password": parts.password,
        "dbname": parts.database,
        "connect_timeout": 5,
    }
    given.update(changes)
    return psycopg.connect(make_conninfo("", **{k: v for k, v in given.items() if v is not None}))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_credentials_file_is_private_and_stable(service_stack: RunningServices) -> None:
    path = credentials_path(service_stack.data_dir)
    assert _mode(path) == 0o600
    again = ServiceCredentials.load_or_create(service_stack.data_dir)
    assert again.s3_access_key_id == service_stack.aws_access_key_id
    assert _mode(service_stack.data_dir / "redis" / "redis.conf") == 0o600


def test_a_loosened_credentials_file_is_made_private_again(tmp_path: Path) -> None:
    first = ServiceCredentials.load_or_create(tmp_path)
    credentials_path(tmp_path).chmod(0o644)
    assert ServiceCredentials.load_or_create(tmp_path) == first
    assert _mode(credentials_path(tmp_path)) == 0o600


@pytest.mark.parametrize("user", ["cdiflow", "postgres"])
def test_postgres_refuses_a_client_without_the_password(
    service_stack: RunningServices, user: str
) -> None:
    with pytest.raises(psycopg.OperationalError, match="password"):
        _pg(service_stack.database_url, user=user, password=None).close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _pg(service_stack.database_url, user=user, password="guessed").close()


def test_the_cdiflow_role_is_no_superuser_and_cannot_run_programs(
    service_stack: RunningServices,
) -> None:
    with _pg(service_stack.database_url) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, False, False)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'id'")
    with pytest.raises(psycopg.OperationalError, match="permission denied"):
        _pg(service_stack.database_url, dbname="postgres").close()  # only its own database


def test_redis_refuses_a_client_without_the_password(service_stack: RunningServices) -> None:
    url = make_url(service_stack.redis_url.replace("redis://", "postgresql://", 1))
    for password in (None, "guessed"):
        client = redis.Redis(host=url.host or "", port=url.port or 0, password=password)
        with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
            client.set("cdiflow:attacker", "x")
        client.close()


def test_s3_refuses_a_wrong_key_and_an_unsigned_request(service_stack: RunningServices) -> None:
    bucket = service_stack.s3_bucket
    wrong = boto3.client(
        "s3",
        endpoint_url=service_stack.s3_endpoint_url,
        region_name=service_stack.aws_region,
        aws_access_key_id=service_stack.aws_access_key_id,
        aws_secret_access_key="guessed",
    )
    with pytest.raises(ClientError) as caught:
        wrong.list_objects_v2(Bucket=bucket)
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    wrong.close()
    for method in ("GET", "PUT"):
        request = urllib.request.Request(
            f"{service_stack.s3_endpoint_url}/{bucket}/attacker", data=b"x", method=method
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        refused.value.close()
        assert refused.value.code == 403
