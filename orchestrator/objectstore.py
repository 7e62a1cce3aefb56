"""S3 access for the workers and the API, with errors a person can act on (the scheduler only
names where images go, ``ObjectStore.uri``, and connects to nothing).

boto3 resolves the credentials and region (the whole AWS chain: environment, profiles, SSO,
instance roles) unless the settings name a key; obstore (Rust's ``object_store``) carries the
bytes. *Why not boto3 for the requests too:* botocore's request pipeline (event hooks,
serialisation, signing and parsing in Python, holding the GIL) is most of a call's client CPU
(``cdiflow bench s3``); at 10 KB images two calls a workflow through it were the biggest share
of the CPU of the process making them.

No library error leaves this module: a missing object or bucket is ``InputMissing``, an object
over the limit ``InputTooLarge``, an endpoint that did not answer (no connection, a timeout, a
5xx after the few quick tries) ``StorageUnavailable``, anything else (a refusal: permissions,
credentials, a bad request) ``StorageError``, each naming the URI. *Why the difference:* an
outage is worth trying again later (the scheduler does so for as long as it lasts, within a
bound), a refusal is not. A URI whose
key no store can hold (``..``, control characters) is ``S3NotAllowed`` before any request;
with ``enforce`` so is one outside the ``S3Policy`` (the workers' and the API's stores).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final

import boto3
import obstore
from obstore.auth.boto3 import Boto3CredentialProvider
from obstore.exceptions import BaseError, GenericError, NotFoundError
from obstore.store import S3Store

from orchestrator.errors import InputMissing, InputTooLarge, StorageError, StorageUnavailable
from orchestrator.s3policy import S3Policy, check_s3_uri

if TYPE_CHECKING:
    from obstore import ObjectMeta
    from obstore.store import ClientConfig, RetryConfig, S3Config

    from orchestrator.settings import Settings

__all__ = ["ObjectStore", "Stored", "Streamed", "parse_s3_uri"]

# Like boto3's "standard" mode: a few attempts, not object_store's ten over three minutes, so
# an endpoint that is down fails the task in seconds with a reason.
_RETRY: Final[RetryConfig] = {
    "max_retries": 2,
    "retry_timeout": timedelta(seconds=20),
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2)},
}


# obstore raises its own tree and, for some failures, Python's (a 404 is FileNotFoundError).
_MISSING: Final = (NotFoundError, FileNotFoundError)
_FAILED: Final = (BaseError, OSError)
_STATUS: Final = re.compile(r"status code: (\d{3})")


@dataclass(frozen=True)
class Streamed:
    """An object being read: its size, the content type it was stored with (if any) and its
    bytes as they arrive."""

    size: int
    content_type: str | None
    chunks: Iterator[bytes]


@dataclass(frozen=True)
class Stored:
    """What S3 says of an object without its bytes (a HEAD): its size and the tags that
    change whenever it does (``etag``; ``version`` on a versioned bucket)."""

    size: int
    etag: str | None
    version: str | None


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key); ``S3NotAllowed`` (an ``InvalidRequest``) for
    anything else, a ``..`` segment or a control character included."""
    return check_s3_uri(uri)


class ObjectStore:
    """Gets, puts and deletes whole objects, with the project's errors and size limits.
    Thread-safe: one connection pool per bucket, shared by every thread.

    ``policy`` (from the settings) names where results and in-between images go; with
    ``enforce`` every read and write outside it is refused (``S3NotAllowed``).
    """

    def __init__(self, settings: Settings, *, enforce: bool = False) -> None:
        self.policy = S3Policy.from_settings(settings)
        self.enforce = enforce
        endpoint = settings.s3_endpoint_url
        local = endpoint is not None and "127.0.0.1" in endpoint
        secret = settings.aws_secret_access_key
        key_id = settings.aws_access_key_id or ("testing" if local else None)
        secret_key = (secret.get_secret_value() if secret else None) or (
            "testing" if local else None
        )
        self.bucket = settings.s3_bucket
        self._config: S3Config = {"region": settings.aws_region}
        if endpoint is not None:
            # A custom endpoint (MinIO, moto, a proxy) is addressed path-style, as boto3 does.
            self._config["endpoint"] = endpoint
        else:
            self._config["virtual_hosted_style_request"] = True
        self._client_options: ClientConfig = {
            "allow_http": endpoint is not None and endpoint.startswith("http://"),
            "connect_timeout": timedelta(seconds=5),
            "timeout": timedelta(seconds=60),
        }
        self._chain = True  # no key given: boto3's chain finds one
        if key_id and secret_key:
            self._chain = False
            self._config["access_key_id"] = key_id
            self._config["secret_access_key"] = secret_key
        self._credentials: Boto3CredentialProvider | None = None
        self._stores: dict[str, S3Store] = {}
        self._lock = threading.Lock()

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _store(self, bucket: str) -> S3Store:
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                if self._chain and self._credentials is None:
                    self._credentials = _chain_credentials(self._config["region"])
                store = S3Store(
                    bucket,
                    config=self._config,
                    client_options=self._client_options,
                    retry_config=_RETRY,
                    credential_provider=self._credentials,
                )
                self._stores[bucket] = store
            return store

    @property
    def identity(self) -> str:
        """Who this store reads as: the endpoint, region and access key (``chain`` plus the
        profile when boto3's chain picks the key). Never the secret."""
        endpoint = self._config.get("endpoint", "aws")
        key_id = self._config.get("access_key_id") or f"chain:{os.environ.get('AWS_PROFILE', '')}"
        return f"{endpoint}|{self._config['region']}|{key_id}"

    def get(self, uri: str, limit: int) -> bytes:
        return self.get_stored(uri, limit)[0]

    def get_stored(self, uri: str, limit: int) -> tuple[bytes, Stored]:
        """The bytes at ``uri`` and what S3 said of them (their ETag and version)."""
        bucket, key = parse_s3_uri(uri)
        if self.enforce:
            self.policy.check_read(uri)
        try:
            reply = obstore.get(self._store(bucket), key)
            stored = _stored(reply.meta)
            if stored.size > limit:
                raise InputTooLarge(
                    f"{uri} is {stored.size} bytes; the limit is {limit} (MAX_INPUT_BYTES)"
                )
            return bytes(reply.bytes()), stored
        except _MISSING as exc:
            raise InputMissing(f"{uri} does not exist") from exc
        except _FAILED as exc:
            raise _failed(f"cannot read {uri}", exc) from exc

    def head(self, uri: str) -> Stored:
        """What S3 says of the object at ``uri`` (one HEAD, no bytes): a caller that may not
        read it is refused as a GET would be. Errors as ``get``."""
        bucket, key = parse_s3_uri(uri)
        if self.enforce:
            self.policy.check_read(uri)
        try:
            return _stored(obstore.head(self._store(bucket), key))
        except _MISSING as exc:
            raise InputMissing(f"{uri} does not exist") from exc
        except _FAILED as exc:
            raise _failed(f"cannot read {uri}", exc) from exc

    def stream(self, uri: str, chunk: int = 1 << 20) -> Streamed:
        """The object at ``uri``, read as its chunks are taken, for a response that must not
        hold the whole object. Errors as ``get``; one in the middle of the stream is a
        ``StorageError``."""
        bucket, key = parse_s3_uri(uri)
        if self.enforce:
            self.policy.check_read(uri)
        try:
            reply = obstore.get(self._store(bucket), key)
            size = int(reply.meta["size"])
            content_type = reply.attributes.get("Content-Type")
        except _MISSING as exc:
            raise InputMissing(f"{uri} does not exist") from exc
        except _FAILED as exc:
            raise _failed(f"cannot read {uri}", exc) from exc

        def chunks() -> Iterator[bytes]:
            try:
                for part in reply.stream(min_chunk_size=chunk):
                    yield bytes(part)
            except _FAILED as exc:
                raise _failed(f"reading {uri} failed midway", exc) from exc

        return Streamed(size, str(content_type) if content_type else None, chunks())

    def put(
        self,
        uri: str,
        data: bytes,
        content_type: str = "application/octet-stream",
        *,
        input_upload: bool = False,
    ) -> None:
        """Write ``data`` at ``uri``: with ``enforce``, under results or in-between images, or,
        for an ``input_upload`` (an input a client sent through the API), under the inputs."""
        bucket, key = parse_s3_uri(uri)
        if self.enforce:
            if input_upload:
                self.policy.check_input(uri)
            else:
                self.policy.check_write(uri)
        try:
            obstore.put(
                self._store(bucket),
                key,
                data,
                attributes={"Content-Type": content_type},
                use_multipart=False,
            )
        except _FAILED as exc:
            raise _failed(f"cannot write {uri}", exc) from exc

    def delete(self, uri: str) -> None:
        bucket, key = parse_s3_uri(uri)
        if self.enforce:
            self.policy.check_write(uri)
        try:
            obstore.delete(self._store(bucket), key)
        except _FAILED as exc:
            raise _failed(f"cannot delete {uri}", exc) from exc

    def delete_many(self, uris: Iterable[str]) -> None:
        """Delete every object of ``uris`` (one request per bucket and thousand keys); a
        missing one is no error."""
        by_bucket: dict[str, list[str]] = {}
        for uri in uris:
            bucket, key = parse_s3_uri(uri)
            if self.enforce:
                self.policy.check_write(uri)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for start in range(0, len(keys), 1000):
                try:
                    obstore.delete(self._store(bucket), keys[start : start + 1000])
                except _MISSING:
                    continue
                except _FAILED as exc:
                    raise StorageError(
                        f"cannot delete {len(keys)} objects in s3://{bucket}/: {_reason(exc)}"
                    ) from exc


def _stored(meta: ObjectMeta) -> Stored:
    return Stored(int(meta["size"]), meta.get("e_tag") or None, meta.get("version") or None)


def _chain_credentials(region: str) -> Boto3CredentialProvider:
    """Credentials from boto3's chain, looked up at the first request (a stack that moves no
    images needs none); ``StorageError`` if the chain has none."""
    try:
        return Boto3CredentialProvider(boto3.Session(region_name=region))
    except ValueError as exc:  # the chain found nothing
        raise StorageError(
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an AWS "
            "profile (AWS_PROFILE), or run where an instance role provides them"
        ) from exc


def _failed(what: str, exc: Exception) -> StorageError:
    """``what`` failed with ``exc``: an outage (``StorageUnavailable``) or a refusal."""
    if _unavailable(exc):
        return StorageUnavailable(f"{what}: S3 did not answer: {_reason(exc)}")
    return StorageError(f"{what}: {_reason(exc)}")


def _unavailable(exc: Exception) -> bool:
    """No connection, a timeout, or a 5xx: obstore says so in a ``GenericError`` without a
    status or with a 5xx one (a 403, 404... has a class of its own or a 4xx status)."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if not isinstance(exc, GenericError):
        return False
    status = _STATUS.search(str(exc))
    return status is None or status.group(1).startswith("5")


def _reason(exc: Exception) -> str:
    """The first line of an obstore error (the rest is its debug detail)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
