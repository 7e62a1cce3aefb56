"""Prometheus's ``/metrics`` on a port of its own, served from a daemon thread: the workers'
(``--metrics-port``) and the API's scrape port (``--metrics-port``), which needs no key.

*Why not ``prometheus_client.start_http_server``:* its thread wakes twice a second to look for
a shutdown that never comes (the thread ends with the process), and an idle stack's CPU is its
wake-ups (docs/architecture.md, *Quiet when idle*); this one sleeps until a scrape arrives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["serve_metrics"]

_NEVER_S: Final = 24 * 3600.0  # how often the server looks for a shutdown: never asked for
_StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def serve_metrics(registry: Callable[[], CollectorRegistry | None], host: str, port: int) -> None:
    """Serve ``registry()`` (asked at each scrape; ``None`` answers 503 until it exists) on
    ``host:port`` from a daemon thread; ``OSError`` if it cannot listen there."""

    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        found = registry()
        if found is None:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"starting\n"]
        served: Iterable[bytes] = make_wsgi_app(found)(environ, start_response)
        return served

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_Unlogged)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": _NEVER_S}, name="metrics",
        daemon=True,
    )  # fmt: skip
    thread.start()


class _Unlogged(WSGIRequestHandler):
    """No access line on standard error for each scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        return None
