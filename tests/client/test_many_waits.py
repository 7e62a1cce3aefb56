"""The client scales with its caller: waits (long polls) have a pool of connections of their
own, so 300 waits open at once never hold up a start or a read. On a real stack with no
workers, where no run ends: every wait stays open for the whole test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdiflow.client import AsyncClient, Client, ConfigError
from cdiflow.client._calls import Calls, Pools
from orchestrator.stack import Stack
from tests.client.conftest import StackApi
from tests.dashboard.support import free_port

WAITS = 300  # three times httpx's default pool of 100 connections
HELD_WITHIN_S = 120.0  # a generous bound on sending 300 requests, so a failure says why


@pytest.fixture(scope="module")
def idle_stack() -> Iterator[StackApi]:
    folder = tempfile.mkdtemp(prefix="cdiflow-waits-")
    os.chmod(folder, 0o755)
    try:
        with Stack(folder, workers=0, port=free_port()) as stack:
            yield StackApi(stack, stack.api_url, stack.api_key)
    finally:
        subprocess.run(["rm", "-rf", folder], check=False)


def _long_polls(stack: StackApi) -> float:
    """How many long polls the API holds now (its own gauge)."""
    scraped = httpx.get(f"{stack.url}/metrics", headers=stack.headers(), timeout=30)
    for family in text_string_to_metric_families(scraped.text):
        if family.name == "cdiflow_api_long_polls":
            return float(family.samples[0].value)
    raise AssertionError("the API reports no cdiflow_api_long_polls")


async def _until_held(stack: StackApi, count: int, waits: list[asyncio.Task[object]]) -> None:
    """Until the API holds ``count`` long polls (a wait that ended fails the test at once)."""
    deadline = time.monotonic() + HELD_WITHIN_S
    while (held := await asyncio.to_thread(_long_polls, stack)) < count:
        assert not any(w.done() for w in waits), [w for w in waits if w.done()][:1]
        assert time.monotonic() < deadline, (
            f"the API holds {held:g} of {count} waits: the rest never left the client"
        )
        await asyncio.sleep(0.2)


def test_300_open_waits_never_hold_up_starts_or_reads(idle_stack: StackApi) -> None:
    async def scenario() -> None:
        async with AsyncClient(idle_stack.url, api_key=idle_stack.key) as api:
            await api.apply_definition({"name": "idle", "tasks": [{"ref": "a", "task": "noop"}]})
            runs = [await api.start("idle") for _ in range(WAITS)]
            waits: list[asyncio.Task[object]] = [
                asyncio.create_task(api.wait(run.id)) for run in runs
            ]
            try:
                await _until_held(idle_stack, WAITS, waits)  # every wait is open at the API
                # While all of them wait, starts, reads and lists go through on the other pool.
                started = [await api.start("idle", data={"i": i}) for i in range(5)]
                assert (await api.get(started[-1].id)).input["data"] == {"i": 4}
                page = await api.list_workflows(workflow="idle", limit=1)
                assert page.total == WAITS + 5
                assert not any(w.done() for w in waits)  # no wait returned to make room
                # Still every one open at the API (a poll that reached its 55 s is asked again by
                # its wait, so the gauge may dip for a moment on a slow machine).
                await _until_held(idle_stack, WAITS, waits)
            finally:
                for wait in waits:
                    wait.cancel()
                await asyncio.gather(*waits, return_exceptions=True)

    asyncio.run(scenario())


def test_the_pools_are_sized_by_name() -> None:
    pools = Pools.sized(max_connections=8, max_waits=1000)
    assert (pools.calls.max_connections, pools.calls.max_keepalive_connections) == (8, 8)
    assert (pools.waits.max_connections, pools.waits.max_keepalive_connections) == (1000, 1000)
    with Client("http://127.0.0.1:9", max_connections=8, max_waits=1000):
        pass  # the names a caller passes
    # More waits than max_waits take turns for a connection, however long: never a timeout.
    calls = Calls()
    assert calls.get(uuid.uuid4(), wait_s=55).timeout.pool is None
    assert calls.get(uuid.uuid4()).timeout.pool is not None
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="max_waits must be a positive number"):
            AsyncClient("http://127.0.0.1:9", max_waits=bad)  # type: ignore[arg-type]
