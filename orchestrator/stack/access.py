"""What a client needs to reach a running stack's embedded services, for the data folder's
owner: ``cdiflow status`` shows it to whoever can read ``<data>/credentials.json`` (0600)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.errors import ServiceError
from orchestrator.services.credentials import ServiceCredentials, credentials_path
from orchestrator.stack.state import StackState

__all__ = ["service_access"]

_HIDDEN = ":***@"


def service_access(data_dir: Path, state: StackState) -> dict[str, Any] | None:
    """URLs with their passwords and the S3 keys of the stack's embedded services; None when
    this user cannot read the credentials (or the stack embeds none)."""
    path = credentials_path(data_dir)
    if not path.exists():
        return None
    try:
        creds = ServiceCredentials.load_or_create(data_dir)
    except ServiceError:
        return None  # another user's folder: show nothing
    embedded = {p.name: p.address for p in state.processes if p.pid is not None}
    access: dict[str, Any] = {"file": str(path)}
    if url := embedded.get("postgres"):
        access["database_url"] = url.replace(_HIDDEN, f":{creds.postgres_password}@", 1)
    if url := embedded.get("redis"):
        access["redis_url"] = url.replace(_HIDDEN, f":{creds.redis_password}@", 1)
    if url := embedded.get("s3"):
        access["s3"] = {
            "endpoint_url": url,
            "access_key_id": creds.s3_access_key_id,
            "secret_access_key": creds.s3_secret_access_key,
        }
    return access if len(access) > 1 else None
