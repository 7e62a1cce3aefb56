"""Embedded S3: Versity's S3 gateway (``versitygw``) over a folder, as a child process.

Objects are files under ``<data_dir>/s3/<bucket>/`` (their metadata in extended attributes),
so they outlive ``cdiflow down`` / ``up`` like the Postgres data. The gateway checks every
request's signature against the access key and secret in ``<data_dir>/credentials.json``,
which it gets through its environment (readable by its own user only), not its command line.
*Why versitygw:* see ``docs/decisions/2026-12-05-s3-client-and-embedded-endpoint.md`` (figures from
``cdiflow bench s3 --server ...``). ``make`` builds the binary with Go into ``.venv/bin``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from orchestrator.errors import ServiceError
from orchestrator.private import PRIVATE_DIR, private_dir
from orchestrator.services.credentials import ServiceCredentials
from orchestrator.services.managed import HOST, ManagedService

__all__ = [
    "REGION",
    "VERSITYGW_MODULE",
    "S3Service",
    "check_s3",
    "find_versitygw",
]

REGION = "us-east-1"
# What `make` builds (pinned: the on-disk layout is the gateway's).
VERSITYGW_MODULE = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"


def find_versitygw() -> Path:
    """The ``versitygw`` binary: ``$CDIFLOW_VERSITYGW``, beside Python (the venv), or on PATH."""
    explicit = os.environ.get("CDIFLOW_VERSITYGW")
    candidates = [Path(explicit)] if explicit else []
    candidates.append(Path(sys.executable).parent / "versitygw")
    if on_path := shutil.which("versitygw"):
        candidates.append(Path(on_path))
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    raise ServiceError(
        "no versitygw binary for the embedded S3 endpoint: run `make` (it builds one with Go: "
        f"GOBIN=$PWD/.venv/bin go install {VERSITYGW_MODULE}), put versitygw on PATH or name "
        "it in CDIFLOW_VERSITYGW, or set S3_ENDPOINT_URL to an existing S3 endpoint",
        service="s3",
    )


class S3Service(ManagedService):
    """An S3-compatible endpoint with ``bucket`` created on start; it checks credentials."""

    name = "s3"

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        bucket: str = "cdiflow",
        credentials: ServiceCredentials | None = None,
        executable: Path | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            data_dir, port=port, start_timeout=start_timeout, stop_timeout=stop_timeout
        )
        creds = credentials or ServiceCredentials.load_or_create(self.data_dir)
        self.access_key_id = creds.s3_access_key_id
        self._secret = creds.s3_secret_access_key
        self.bucket = bucket
        self.workdir = self.data_dir / "s3"
        self._executable = executable

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def secret_access_key(self) -> str:
        return self._secret

    def _prepare(self) -> None:
        if self._executable is None:
            self._executable = find_versitygw()
        private_dir(self.workdir)
        self.workdir.chmod(PRIVATE_DIR)

    def _command(self, port: int) -> list[str]:
        assert self._executable is not None
        return [
            str(self._executable),
            "--port", f"{HOST}:{port}",
            "--region", REGION,
            "--keep-alive",  # its default closes every connection after one request
            "--quiet",  # no line per request in the log
            "posix",
            "--file-perms", "0600",
            "--dir-perms", "0700",
            str(self.workdir),
        ]  # fmt: skip

    def _env(self) -> Mapping[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOT_", "VGW_"))}
        env["ROOT_ACCESS_KEY_ID"] = self.access_key_id
        env["ROOT_SECRET_ACCESS_KEY"] = self._secret
        return env

    def _probe(self) -> bool:
        client = self._client(timeout=1)
        try:
            client.list_buckets()
        except (BotoCoreError, ClientError):
            return False
        finally:
            client.close()
        return True

    def _after_ready(self) -> None:
        client = self._client(timeout=10)
        try:
            client.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise self._error(f"could not create bucket {self.bucket!r}: {exc}") from exc
        except BotoCoreError as exc:
            raise self._error(f"could not create bucket {self.bucket!r}: {exc}") from exc
        finally:
            client.close()

    def _client(self, timeout: float) -> Any:
        return _s3_client(
            f"http://{HOST}:{self._port}", REGION, self.access_key_id, self._secret, timeout
        )


def _s3_client(
    endpoint_url: str | None,
    region: str,
    access_key_id: str | None,
    secret_access_key: str | None,
    timeout: float,
) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=Config(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": 1, "mode": "standard"},
        ),
    )


def check_s3(
    endpoint_url: str | None,
    bucket: str,
    *,
    region: str,
    access_key_id: str | None,
    secret_access_key: str | None,
    timeout: float = 5.0,
) -> None:
    """Raise ``ServiceError`` unless ``bucket`` at ``endpoint_url`` answers HeadBucket."""
    client = _s3_client(endpoint_url, region, access_key_id, secret_access_key, timeout)
    where = f"S3_ENDPOINT_URL={endpoint_url}"
    try:
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError as exc:
        raise ServiceError(
            f"no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or give the process an AWS profile or IAM role",
            service="s3",
        ) from exc
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in {"404", "NoSuchBucket", "NotFound"}:
            hint = f"bucket {bucket!r} does not exist; create it or set S3_BUCKET"
        elif code in {"403", "AccessDenied", "Forbidden"}:
            hint = (
                f"access to bucket {bucket!r} is denied; check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY (or the IAM role)"
            )
        else:
            hint = f"HeadBucket {bucket!r} failed: {exc}"
        raise ServiceError(f"{where}: {hint}", service="s3") from exc
    except BotoCoreError as exc:
        raise ServiceError(
            f"{where} is not reachable: {exc}. Check the endpoint is running and the URL is "
            "right, or unset S3_ENDPOINT_URL to start an embedded S3 endpoint.",
            service="s3",
        ) from exc
    finally:
        client.close()
