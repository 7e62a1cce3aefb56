"""The client honours the API's back-pressure: a 429 is sent again after its ``Retry-After``,
for up to ``busy_timeout``, then raised as ``TooManyRequests``; a read or a start (it carries
an idempotency key) whose connection was closed unanswered is sent again (twice at most). A
small fake transport plays the API here (what the API answers at capacity is tested against
the real one in ``tests/orchestrator/test_api_back_pressure.py``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from cdiflow.client import AsyncClient, Client, TooManyRequests, TransportError
from cdiflow.client._calls import retry_after_s

BUSY = {"detail": "the API is at capacity; send the request again in 1 s", "code": "overloaded"}


class _Busy:
    """Answers 429 (``Retry-After: <retry_after>``) to the first ``times`` requests, then 200."""

    def __init__(self, times: int, retry_after: str = "0") -> None:
        self.times, self.retry_after, self.seen = times, retry_after, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen += 1
        if self.seen <= self.times:
            return httpx.Response(429, json=BUSY, headers={"Retry-After": self.retry_after})
        return httpx.Response(200, json=[])


def _client(api: _Busy, busy_timeout: float = 60.0) -> Client:
    return Client(
        "http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api),
        busy_timeout=busy_timeout,
    )  # fmt: skip


def test_a_429_is_sent_again_after_retry_after() -> None:
    api = _Busy(times=3)
    with _client(api) as client:
        assert client.workers() == []
    assert api.seen == 4


def test_the_async_client_sends_it_again_too() -> None:
    api = _Busy(times=2)

    async def workers() -> list[object]:
        async with AsyncClient(
            "http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api)
        ) as client:
            return list(await client.workers())

    assert asyncio.run(workers()) == []
    assert api.seen == 3


def test_past_busy_timeout_it_raises_too_many_requests() -> None:
    api = _Busy(times=10, retry_after="5")
    with _client(api, busy_timeout=4.0) as client, pytest.raises(TooManyRequests) as caught:
        client.workers()  # the first wait (5 s) would already pass the 4 s allowed
    assert api.seen == 1
    assert caught.value.status == 429 and caught.value.code == "overloaded"
    assert caught.value.retry_after_s == 5.0
    assert "send the request again" in str(caught.value)


def test_busy_timeout_0_raises_at_once() -> None:
    api = _Busy(times=1)
    with _client(api, busy_timeout=0) as client, pytest.raises(TooManyRequests):
        client.workers()
    assert api.seen == 1


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("3", 3.0), ("", 1.0), ("soon", 1.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_retry_after_seconds_or_a_date(header: str, seconds: float) -> None:
    response = httpx.Response(429, headers={"Retry-After": header})
    assert retry_after_s(response) == seconds


def test_retry_after_a_date_to_come() -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    response = httpx.Response(429, headers={"Retry-After": format_datetime(when, usegmt=True)})
    assert 25.0 < retry_after_s(response) <= 30.0


class _Hangs:
    """Closes the connection unanswered on the first ``times`` requests, then answers 200."""

    def __init__(self, times: int) -> None:
        self.times, self.seen = times, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen += 1
        if self.seen <= self.times:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, json=[])


def test_a_read_the_server_closed_unanswered_is_sent_again() -> None:
    api = _Hangs(times=2)
    with Client("http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api)) as c:
        assert c.workers() == []
    assert api.seen == 3


def test_the_async_client_sends_a_closed_read_again_too() -> None:
    api = _Hangs(times=1)

    async def workers() -> list[object]:
        async with AsyncClient(
            "http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api)
        ) as client:
            return list(await client.workers())

    assert asyncio.run(workers()) == []
    assert api.seen == 2


def test_a_read_closed_every_time_says_the_api_cannot_be_reached() -> None:
    api = _Hangs(times=10)
    client = Client("http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api))
    with client, pytest.raises(TransportError, match="cannot reach the cdiflow API"):
        client.workers()
    assert api.seen == 3  # the first try and two more


def test_a_write_the_server_closed_unanswered_is_not_sent_again() -> None:
    """A start may have been made before the connection dropped: sending it again could
    start a second run, so the caller decides (an idempotency key makes that safe)."""
    api = _Hangs(times=1)
    client = Client("http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api))
    with client, pytest.raises(TransportError):
        client.cancel("3f2b8c1e-0000-4000-8000-000000000000")
    assert api.seen == 1


class _Records(_Hangs):
    """``_Hangs`` that keeps every request's idempotency key and answers a started run."""

    def __init__(self, times: int) -> None:
        super().__init__(times)
        self.keys: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers.get("Idempotency-Key"))
        super().__call__(request)
        return httpx.Response(201, json=RUN)


RUN = {
    "id": "3f2b8c1e-0000-4000-8000-000000000000", "workflow": "noop", "workflow_version": 1,
    "status": "PENDING", "policy": "affinity", "data_plane": "cdi", "input": {}, "output": None,
    "error": None, "result_uri": None, "retry_of": None, "created_at": "2026-12-05T00:00:00Z",
    "started_at": None, "finished_at": None, "claimed_by": None, "claimed_at": None,
    "started_by": "admin",
}  # fmt: skip


@pytest.mark.parametrize("given", [None, "my-key"])
def test_a_start_the_server_closed_unanswered_is_sent_again_under_one_key(
    given: str | None,
) -> None:
    """Every start carries an idempotency key (the caller's or one the client made), so the
    API answers the run a start that did reach it made: sending it again is safe."""
    api = _Records(times=1)
    with Client("http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api)) as c:
        run = c.start("noop", None, idempotency_key=given)
    assert str(run.id) == RUN["id"] and api.seen == 2
    assert api.keys[0] is not None and api.keys == [api.keys[0]] * 2
    assert given is None or api.keys[0] == given


def test_each_start_gets_a_key_of_its_own() -> None:
    api = _Records(times=0)
    with Client("http://api.test", api_key="k" * 32, transport=httpx.MockTransport(api)) as c:
        c.start("noop", None)
        c.start("noop", None)
    assert len(set(api.keys)) == 2 and None not in api.keys
