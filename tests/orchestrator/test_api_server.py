"""The API's server: serves, stamps a Date header, and stops at once on SIGTERM although its
housekeeping tick is long (the signal wakes it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from orchestrator.child_process import free_port

# A tick of a minute: only the wake-up on the signal can stop the server in time.
_SCRIPT = """
import sys
from fastapi import FastAPI
import orchestrator.controller.api_server as server
server.TICK_S = 60.0
app = FastAPI()
@app.get("/ping")
def ping() -> dict[str, str]:
    return {"pong": "yes"}
server.serve(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
"""


def _get_when_up(url: str, proc: subprocess.Popen[bytes]) -> httpx.Response:
    for _ in range(200):
        assert proc.poll() is None, "the server exited before it answered"
        try:
            return httpx.get(url, timeout=1)
        except httpx.TransportError:
            time.sleep(0.05)
    pytest.fail(f"{url} never answered")


def test_serves_and_stops_on_sigterm_before_its_tick() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(port)], stderr=subprocess.PIPE)
    try:
        reply = _get_when_up(f"http://127.0.0.1:{port}/ping", proc)
        assert reply.json() == {"pong": "yes"} and reply.headers["date"].endswith("GMT")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)  # the 60 s tick would still be sleeping
        # A graceful shutdown, after which uvicorn raises the signal again, as uvicorn.run does.
        assert b"Finished server process" in err, err.decode()
        assert proc.returncode == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_port_in_use_ends_with_uvicorns_startup_failure_status() -> None:
    port = free_port()
    first = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(port)])
    try:
        _get_when_up(f"http://127.0.0.1:{port}/ping", first)
        second = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(port)], capture_output=True, timeout=60
        )
        assert second.returncode == 3, second.stderr.decode()
        assert b"address already in use" in second.stderr.lower()
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=20)
