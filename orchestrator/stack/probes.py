"""Is it up yet? Small checks the stack runs while it starts its processes."""

from __future__ import annotations

import urllib.error
import urllib.request

import redis

from orchestrator.contract.keys import worker_key

__all__ = [
    "http_ok",
    "url_host",
    "worker_heartbeat",
]

# A worker start stamped this long before its launch is a previous run's (stamps may be
# rounded to the second).
_CLOCK_SLACK_S = 1.0


def url_host(host: str) -> str:
    """The host clients should use for a server bound to ``host`` (wildcards -> loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def worker_heartbeat(client: redis.Redis, worker_id: str, launched_at: float) -> bool:
    """Whether the worker launched at ``launched_at`` (unix s) has written its heartbeat hash.

    A hash left by a previous run (or by a namesake on a shared Redis) has an older
    ``started_at`` (else ``last_heartbeat``). ``client`` must decode responses. Redis errors
    propagate: the caller decides whether to keep waiting.
    """
    fields = client.hgetall(worker_key(worker_id))
    if not fields:
        return False
    stamp = fields.get("started_at", fields.get("last_heartbeat"))
    if stamp is None:
        return True  # a hash without a timestamp: its existence is all we can check
    try:
        return float(stamp) >= launched_at - _CLOCK_SLACK_S
    except (TypeError, ValueError):
        return True
