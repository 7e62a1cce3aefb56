"""Which S3 objects cdiflow may read and write on a user's behalf.

cdiflow reads workflow inputs and writes results with its own credentials, which may reach
more than any one user should: a caller who names ``s3://private-other/secret.png`` as an input
would have cdiflow fetch it for them (and the dashboard show its thumbnail). So inputs must lie
under the operator's prefixes (``CDIFLOW_S3_INPUTS``; default: the whole ``S3_BUCKET``),
results go under ``CDIFLOW_S3_RESULTS`` (default ``s3://<bucket>/results/``), and the
object-store plane's images between tasks under ``s3://<bucket>/work/``.

Every URI is checked first as a key a store can hold: no ``.`` or ``..`` segment, no empty
segment, no control character, at most 1024 bytes. Such keys are refused with
``S3NotAllowed`` (an ``InvalidRequest``: 422 at the API, a failure no retry repeats at a
worker), never sent to S3.

Prefixes match whole path segments: ``s3://b/in/`` covers ``s3://b/in/cat.png``, not
``s3://b/inbox/x``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from orchestrator.errors import S3NotAllowed

if TYPE_CHECKING:
    from orchestrator.settings import Settings

__all__ = ["S3Policy", "check_s3_uri"]

_URI: Final = re.compile(r"s3://([^/]*)/(.*)", re.S)
_BUCKET: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
MAX_KEY_BYTES: Final = 1024
WORK_PREFIX: Final = "work/"
UPLOAD_PREFIX: Final = "uploads/"


def check_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key); ``S3NotAllowed`` naming what is wrong."""
    match = _URI.fullmatch(uri) if isinstance(uri, str) else None
    if match is None:
        raise S3NotAllowed(f"{uri!r} is not an S3 URI; write it as s3://bucket/path/to/object")
    bucket, key = match[1], match[2]
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise S3NotAllowed(
            f"{bucket!r} is not a valid S3 bucket name (3-63 lowercase letters, digits, '.' or "
            "'-', starting and ending with a letter or digit)"
        )
    if not key:
        raise S3NotAllowed(f"{uri!r} names a bucket but no object key")
    if _CONTROL.search(key):
        raise S3NotAllowed("the object key holds a control character; remove it")
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise S3NotAllowed("the object key is not valid Unicode text (a lone surrogate)") from None
    if size > MAX_KEY_BYTES:
        raise S3NotAllowed(f"the object key is {size} bytes; S3 allows {MAX_KEY_BYTES}")
    segments = key.split("/")
    if any(s in (".", "..") for s in segments):
        raise S3NotAllowed(
            f"the object key {key!r} has a '.' or '..' segment; name the object by its own path"
        )
    if "" in segments:
        raise S3NotAllowed(
            f"the object key {key!r} has an empty segment (a leading, trailing or double '/')"
        )
    return bucket, key


@dataclass(frozen=True)
class S3Policy:
    """Prefixes (``s3://bucket/path/``, ending in ``/`` or bare ``s3://bucket/``) cdiflow may
    read inputs from, and write results and in-between images to."""

    inputs: tuple[str, ...]
    results: str
    work: str
    archive: str | None = None  # where retention archives pruned runs (CDIFLOW_ARCHIVE_URI)

    @classmethod
    def from_settings(cls, settings: Settings) -> S3Policy:
        bucket = f"s3://{settings.s3_bucket}/"
        return cls(
            inputs=tuple(settings.s3_inputs) or (bucket,),
            results=settings.s3_results or f"{bucket}results/",
            work=f"{bucket}{WORK_PREFIX}",
            archive=settings.archive_uri,
        )

    def check_input(self, uri: str) -> None:
        """Refuse (``S3NotAllowed``) an input a user named that lies outside ``inputs``."""
        check_s3_uri(uri)
        if not _under(uri, self.inputs):
            raise S3NotAllowed(
                f"{uri} is outside the S3 locations this cdiflow reads inputs from "
                f"({', '.join(self.inputs)}); copy the image there, or have the operator add "
                "its prefix to CDIFLOW_S3_INPUTS"
            )

    def check_read(self, uri: str) -> None:
        """Refuse a read outside inputs, results and in-between images (a worker's, the
        dashboard's): whatever an instruction or a stored row says."""
        check_s3_uri(uri)
        if not _under(uri, (*self.inputs, self.results, self.work)):
            raise S3NotAllowed(f"{uri} is outside the S3 locations this cdiflow may read")

    def check_result(self, uri: str) -> None:
        """Refuse a result (to read back or show) outside ``results``."""
        check_s3_uri(uri)
        if not _under(uri, (self.results,)):
            raise S3NotAllowed(f"{uri} is outside the S3 location of results ({self.results})")

    def check_write(self, uri: str) -> None:
        """Refuse a write outside results, in-between images and the archive."""
        check_s3_uri(uri)
        places = (self.results, self.work, *((self.archive,) if self.archive else ()))
        if not _under(uri, places):
            raise S3NotAllowed(
                f"{uri} is outside the S3 locations this cdiflow writes to ({', '.join(places)})"
            )

    def upload_uri(self, name: str) -> str:
        """Where an input a client uploads through the API goes: under the first inputs
        prefix, so a workflow may read it."""
        return f"{self.inputs[0]}{UPLOAD_PREFIX}{name}"

    def result_uri(self, name: str) -> str:
        return self.results + name

    def work_uri(self, name: str) -> str:
        return self.work + name


def _under(uri: str, prefixes: tuple[str, ...]) -> bool:
    return any(uri.startswith(prefix) for prefix in prefixes)
