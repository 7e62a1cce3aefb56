"""S3 access for the scheduler and the workers, with errors a person can act on.

No ``botocore`` error leaves this module: a missing object is ``InputMissing``, an object over the
limit ``InputTooLarge``, anything else ``StorageError`` naming the URI.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from orchestrator.errors import InputMissing, InputTooLarge, InvalidRequest, StorageError

if TYPE_CHECKING:
    from orchestrator.settings import Settings

__all__ = ["ObjectStore", "parse_s3_uri"]

_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.+)$")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key); ``InvalidRequest`` for anything else."""
    match = _URI.match(uri) if isinstance(uri, str) else None
    if match is None:
        raise InvalidRequest(f"{uri!r} is not an S3 URI; write it as s3://bucket/key")
    return match.group(1), match.group(2)


class ObjectStore:
    """A thin boto3 client with the project's errors and size limits."""

    def __init__(self, settings: Settings) -> None:
        secret = settings.aws_secret_access_key
        local = settings.s3_endpoint_url is not None and "127.0.0.1" in settings.s3_endpoint_url
        self.bucket = settings.s3_bucket
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.aws_region,
            aws_access_key_id=settings.aws_access_key_id or ("testing" if local else None),
            aws_secret_access_key=(secret.get_secret_value() if secret else None)
            or ("testing" if local else None),
            config=Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=32),
        )

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def get(self, uri: str, limit: int) -> bytes:
        bucket, key = parse_s3_uri(uri)
        try:
            reply = self._client.get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NoSuchBucket"):
                raise InputMissing(f"{uri} does not exist") from exc
            raise StorageError(f"cannot read {uri}: {code or exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"cannot read {uri}: {exc}") from exc
        size = int(reply.get("ContentLength", 0))
        if size > limit:
            reply["Body"].close()
            raise InputTooLarge(f"{uri} is {size} bytes; the limit is {limit} (MAX_INPUT_BYTES)")
        data: bytes = reply["Body"].read()
        return data

    def put(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        bucket, key = parse_s3_uri(uri)
        try:
            self._client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot write {uri}: {exc}") from exc

    def delete(self, uri: str) -> None:
        bucket, key = parse_s3_uri(uri)
        try:
            self._client.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot delete {uri}: {exc}") from exc
