"""Helpers for the dashboard tests: the stack's API and S3, and waiting."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import httpx

from orchestrator.stack import Stack
from workflows.samples import bundled_samples

FINISHED: Final = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
UUID: Final = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(probe: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def sample(name: str = "sunset.jpg") -> bytes:
    return bundled_samples()[name].read_bytes()


@dataclass
class Harness:
    """The stack, its API and its S3 bucket, for arranging what the browser then looks at."""

    stack: Stack
    api: httpx.Client
    s3: Any
    bucket: str

    def upload(self, key: str, data: bytes) -> str:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        return f"s3://{self.bucket}/{key}"

    def start(self, workflow: str, image: str, policy: str = "transfer") -> str:
        body = {"workflow": workflow, "input": {"image": image}, "policy": policy}
        reply = self.api.post("/api/workflows", json=body)
        assert reply.status_code == 201, reply.text
        run_id: str = reply.json()["id"]
        return run_id

    def get(self, run_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.api.get(f"/api/workflows/{run_id}").raise_for_status().json()
        return body

    def wait(self, run_id: str, timeout: float = 120) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            body = self.get(run_id)
            return body if body["status"] in FINISHED else None

        done: dict[str, Any] = wait_for(finished, f"workflow {run_id}", timeout)
        return done

    def register(self, path: str, body: dict[str, Any]) -> None:
        reply = self.api.post(path, json=body)
        assert reply.status_code == 201, reply.text
