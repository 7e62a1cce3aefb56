"""The HTTP client of the load test's users: locust's, so its requests show in the statistics.

Imported only in locust's process (``loadtest.locustfile`` and the backends it loads): locust
patches the standard library for gevent on import.
"""

from __future__ import annotations

from typing import Any, Final

from locust.contrib.fasthttp import FastHttpSession

from loadtest.cdiflow_api import LONG_POLL_S

__all__ = ["LONG_POLL_S", "OPEN_LOOP_CONNECTIONS", "http_session"]

# Connections one user may hold at once: an open loop follows every workflow in flight.
OPEN_LOOP_CONNECTIONS: Final = 1000


def http_session(
    user: Any, base_url: str, *, open_loop: bool, headers: dict[str, str] | None = None
) -> FastHttpSession:
    """A session for waits of up to ``LONG_POLL_S`` (geventhttpclient's default network
    timeout is 5 s) and, in an open loop, as many requests at once as workflows in flight;
    ``headers`` go with every request (cdiflow's API key)."""
    return FastHttpSession(
        base_url,
        user.environment.events.request,
        user,
        connection_timeout=30.0,
        network_timeout=LONG_POLL_S + 30.0,
        concurrency=OPEN_LOOP_CONNECTIONS if open_loop else 10,
        headers=headers or {},
    )
