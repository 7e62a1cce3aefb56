"""Embedded S3: moto's server (``python -m moto.server``) as a child process on 127.0.0.1.

moto keeps objects in memory, so they do not survive a restart of the stack, unlike Postgres;
objects larger than a few MB spill to temporary files, which we keep under ``<data_dir>/s3``.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from orchestrator.errors import ServiceError
from orchestrator.services._process import HOST, ManagedService

__all__ = [
    "ACCESS_KEY_ID",
    "REGION",
    "SECRET_ACCESS_KEY",
    "S3Service",
    "check_s3",
]

# moto accepts any credentials; these are the conventional dummy ones.
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"
REGION = "us-east-1"


class S3Service(ManagedService):
    """An S3-compatible endpoint with ``bucket`` created on start; any credentials work."""

    name = "s3"

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        bucket: str = "cdiflow",
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            data_dir, port=port, start_timeout=start_timeout, stop_timeout=stop_timeout
        )
        self.bucket = bucket
        self.workdir = self.data_dir / "s3"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _command(self, port: int) -> list[str]:
        # The running interpreter, so it works without the venv being activated.
        return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]

    def _cwd(self) -> Path:
        return self.workdir

    def _env(self) -> Mapping[str, str]:
        return {**os.environ, "TMPDIR": str(self.workdir)}

    def _probe(self) -> bool:
        # moto binds its socket only once the app is loaded, so accepting means serving.
        try:
            with socket.create_connection((HOST, self._port or 0), timeout=1):
                return True
        except OSError:
            return False

    def _after_ready(self) -> None:
        # Unsigned path-style PUT: moto needs no signature, and this avoids a boto3 client here.
        request = urllib.request.Request(f"{self.url}/{self.bucket}", method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: the bucket exists already
                raise self._error(f"could not create bucket {self.bucket!r}: {exc}") from exc
        except OSError as exc:
            raise self._error(f"could not create bucket {self.bucket!r}: {exc}") from exc


def check_s3(
    endpoint_url: str,
    bucket: str,
    *,
    region: str,
    access_key_id: str | None,
    secret_access_key: str | None,
    timeout: float = 5.0,
) -> None:
    """Raise ``ServiceError`` unless ``bucket`` at ``endpoint_url`` answers HeadBucket."""
    client = boto3.client(
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
