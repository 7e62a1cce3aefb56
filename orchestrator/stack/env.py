"""The environment every orchestrator process of a stack gets: where everything is."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from orchestrator.services import RunningServices

__all__ = ["ADMIN_KEY_VARIABLES", "stack_environment"]

ADMIN_KEY_VARIABLES = ("CDIFLOW_ADMIN_KEY", "CDIFLOW_ADMIN_KEY_FILE")


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
    The admin key is left out: the stack gives it to the API alone.
    """
    env = dict(os.environ if base is None else base)
    for name in ADMIN_KEY_VARIABLES:
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
