"""One real stack for the SDK and CLI tests (Postgres, Redis, S3 endpoint, CDI controller and
minion, API, scheduler and two workers as processes), and clients of its API."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdiflow.client import Client
from orchestrator.stack import Stack
from tests.dashboard.support import free_port, sample

SLEEPER = "sdk_sleeper"  # a dataless run that sleeps, to act on while it runs
USER_TASKS = "usertasks"  # the folder of deployed task code in the stack's data folder


@dataclass(frozen=True)
class StackApi:
    """The stack, and how a client or a command reaches its API."""

    stack: Stack
    url: str
    key: str | None

    def client(self) -> Client:
        return Client(self.url, api_key=self.key)

    def headers(self) -> dict[str, str]:
        """What a plain HTTP request to the stack sends to be let in."""
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def cli_args(self) -> list[str]:
        """The options that point an API command at this stack."""
        return ["--api-url", self.url, *(["--api-key", self.key] if self.key else [])]


@pytest.fixture(scope="package")
def stack_api() -> Iterator[StackApi]:
    folder = tempfile.mkdtemp(prefix="cdiflow-sdk-")
    os.chmod(folder, 0o755)
    # Deployed task code, empty while the stack's workers start: test_task_code fills it and
    # starts a worker of its own that loads it.
    (Path(folder) / USER_TASKS).mkdir()
    try:
        # JSON logs here (the other suites' stacks log text): test_ops reads them.
        with Stack(folder, workers=2, port=free_port(), log_format="json",
                   tasks=[str(Path(folder) / USER_TASKS)]) as stack:  # fmt: skip
            target = StackApi(stack, stack.api_url, stack.api_key)
            with target.client() as api:
                nap = {"ref": "nap", "task": "sleep", "params": {"ms": 4_000}}
                api.apply_definition({"name": SLEEPER, "tasks": [nap]})
                # Every part ready (the scheduler's loop turning) before the tests ask.
                deadline = time.monotonic() + 120
                while (ready := api.readiness()).status != "ok":
                    assert time.monotonic() < deadline, f"the stack never got ready: {ready}"
                    time.sleep(0.2)
            yield target
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


@pytest.fixture
def api(stack_api: StackApi) -> Iterator[Client]:
    with stack_api.client() as client:
        yield client


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    path = tmp_path / "sunset.jpg"
    path.write_bytes(sample("sunset.jpg"))
    return path


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"
