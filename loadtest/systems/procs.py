"""Child processes of the peers: started in their own session, stopped by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadtest.systems.services import BenchServices

__all__ = ["peer_env", "spawn", "stop_process"]


def spawn(
    argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """``argv`` in a new session (its process group is its PID), output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL to its whole process group if it is still there after
    ``grace_s``; the group also takes children it started but did not stop."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the leader may be gone, stragglers not
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def peer_env(services: BenchServices) -> dict[str, str]:
    """This environment plus S3 as the systems under test reach it (through the regional
    link's proxy if there is one), for ``orchestrator.settings.load_settings``."""
    running = services.running
    env = dict(
        os.environ,
        S3_ENDPOINT_URL=services.s3_url,
        S3_BUCKET=running.s3_bucket,
        AWS_REGION=running.aws_region,
        PYTHONUNBUFFERED="1",
    )
    env["AWS_ACCESS_KEY_ID"] = running.aws_access_key_id or "testing"
    env["AWS_SECRET_ACCESS_KEY"] = running.aws_secret_access_key or "testing"
    return env
