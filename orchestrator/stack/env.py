"""The environment every orchestrator process of a stack gets: where everything is, how to log,
where task code may come from; and the admin key, which the API alone gets."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdi.auth import CLUSTER_KEY_ENV, CONTROLLER_TOKEN_ENV, GATEWAY_KEY_ENV
from orchestrator.apikeys import ensure_key_file
from orchestrator.logs import LOG_FORMAT_ENV
from orchestrator.services import RunningServices
from orchestrator.settings import load_settings
from orchestrator.stack.cdi_runtime import CdiRuntime
from workflows.loader import with_sources

__all__ = ["ADMIN_KEY_VARIABLES", "AdminKey", "admin_key", "host_environment", "stack_environment"]

ADMIN_KEY_VARIABLES = ("CDIFLOW_ADMIN_KEY", "CDIFLOW_ADMIN_KEY_FILE")
# The CDI cluster's secrets: the stack hands the reader's controller token to the API and
# the scheduler; no process inherits the caller's.
CDI_SECRET_VARIABLES = tuple(
    name + suffix
    for name in (CLUSTER_KEY_ENV, CONTROLLER_TOKEN_ENV, GATEWAY_KEY_ENV)
    for suffix in ("", "_FILE")
)


def stack_environment(
    services: RunningServices,
    *,
    data_dir: Path,
    minion_socket: str,
    controller_url: str,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` (default: ours) plus the variables the API, scheduler and workers read.

    The service names are ``Settings`` fields upper-cased, so ``load_settings()`` in a child
    finds the services this stack resolved (embedded or configured) rather than starting its
    own; CDI_URL and CDI_CONTROLLER_URL point at this stack's minion and CDI controller.
    The admin key and the CDI controller's token are left out: the stack gives the key to the
    API alone and the token to the API and the scheduler (the workers, where task code runs,
    get neither).
    """
    env = dict(os.environ if base is None else base)
    for name in (*ADMIN_KEY_VARIABLES, *CDI_SECRET_VARIABLES):
        env.pop(name, None)
    env.update(
        CDIFLOW_DATA_DIR=str(data_dir),
        DATABASE_URL=services.database_url,
        REDIS_URL=services.redis_url,
        S3_ENDPOINT_URL=services.s3_endpoint_url,
        S3_BUCKET=services.s3_bucket,
        AWS_REGION=services.aws_region,
        CDI_URL=f"unix://{minion_socket}",
        CDI_CONTROLLER_URL=controller_url,
        PYTHONUNBUFFERED="1",  # logs reach the file as they are written
    )
    if services.aws_access_key_id is not None:
        env["AWS_ACCESS_KEY_ID"] = services.aws_access_key_id
    if services.aws_secret_access_key is not None:
        env["AWS_SECRET_ACCESS_KEY"] = services.aws_secret_access_key
    return env


def host_environment(
    services: RunningServices,
    cdi: CdiRuntime,
    *,
    data_dir: Path,
    host: str,
    inside: bool,
    log_format: str,
    tasks: Sequence[str],
) -> dict[str, str]:
    """``stack_environment`` for the processes on ``host``: its minion; ``inside``, for one
    run in the host's namespace, the services as reached through the link emulator; the log
    format; and the task code besides the settings' (``--tasks``), which the API and the
    workers read alike."""
    env = stack_environment(
        services,
        data_dir=data_dir,
        minion_socket=cdi.socket_of(host),
        controller_url=cdi.controller_url,
    )
    if inside and cdi.host_of(host) is not None:
        for name in ("DATABASE_URL", "REDIS_URL", "S3_ENDPOINT_URL"):
            env[name] = cdi.reachable(env[name])
    env[LOG_FORMAT_ENV] = log_format
    if tasks:
        sources = with_sources(load_settings().task_sources(), tasks)
        env["CDIFLOW_TASK_PACKAGES"] = ",".join(sources.packages)
        env["CDIFLOW_TASK_PATHS"] = os.pathsep.join(str(p) for p in sources.paths)
    return env


@dataclass(frozen=True)
class AdminKey:
    """The stack's admin key, the file it is in (if any), and the variables that hand it to
    the API."""

    key: str
    key_file: Path | None
    variables: dict[str, str]


def admin_key(data_dir: Path) -> AdminKey:
    """The configured admin key (CDIFLOW_ADMIN_KEY[_FILE]), else ``<data>/api-key``, made at
    the first start."""
    configured = load_settings()
    if (key := configured.resolved_admin_key()) is not None:
        if configured.admin_key_file is not None:
            variables = {"CDIFLOW_ADMIN_KEY_FILE": str(configured.admin_key_file)}
        else:
            variables = {"CDIFLOW_ADMIN_KEY": key}
        return AdminKey(key, configured.admin_key_file, variables)
    key_file, key = ensure_key_file(data_dir)
    return AdminKey(key, key_file, {"CDIFLOW_ADMIN_KEY_FILE": str(key_file)})
