"""The thread that sends webhook deliveries, one per scheduler process (``cdiflow scheduler``).

Each turn it takes the deliveries due (``db.delivery_store``), sends each as a signed ``POST``
of its JSON payload (``signing``) to the URL its webhook was registered with, a few at once,
and records the outcome: a 2xx answer delivers it; anything else (another status, a redirect,
no answer within ``TIMEOUT_S``) is tried again after ``BACKOFF_S`` doubling with each attempt
(at most ``MAX_BACKOFF_S``), until ``MAX_ATTEMPTS`` have failed.

*Where it sends:* only to the URL an admin registered, as it is: redirects are not followed (a
receiver cannot send the payload on elsewhere through us). *What it logs:* the webhook's name,
the delivery's id and the outcome; never the secret nor the signature, nor the URL, whose path
or query may hold a token.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import httpx
from sqlalchemy import Engine

from orchestrator.db.delivery_store import DeliveryStore, Due
from orchestrator.errors import ServiceError
from orchestrator.notify.signing import signed_headers

__all__ = ["BACKOFF_S", "MAX_ATTEMPTS", "MAX_BACKOFF_S", "TIMEOUT_S", "Deliverer", "backoff_s"]

log = logging.getLogger(__name__)

POLL_S: Final = 1.0  # how often it looks for due deliveries
TIMEOUT_S: Final = 10.0  # a receiver that has not answered by then failed the attempt
BACKOFF_S: Final = 1.0  # before the second attempt; doubling
MAX_BACKOFF_S: Final = 300.0
MAX_ATTEMPTS: Final = 10  # about 17 minutes of tries
_LEASE_S: Final = 3 * TIMEOUT_S  # a taken delivery is taken again after this if not recorded
_AT_ONCE: Final = 4
_ERROR_CHARS: Final = 300


def backoff_s(attempt: int) -> float:
    """How long after its ``attempt``-th failure a delivery is tried again."""
    return min(MAX_BACKOFF_S, BACKOFF_S * 2.0 ** (attempt - 1))


class Deliverer:
    """Sends due deliveries until ``stop()``; ``start()`` runs it on a daemon thread."""

    def __init__(self, engine: Engine, *, transport: httpx.BaseTransport | None = None) -> None:
        # httpx logs each request with its URL at INFO: the log says which webhook instead.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self.store = DeliveryStore(engine)
        self._http = httpx.Client(
            timeout=TIMEOUT_S,
            follow_redirects=False,
            transport=transport,
            headers={"content-type": "application/json", "user-agent": "cdiflow-webhooks"},
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)
        self._pool = ThreadPoolExecutor(_AT_ONCE, thread_name_prefix="webhook")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = TIMEOUT_S) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()
        self.store.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sent = self.turn()
            except ServiceError as exc:
                log.warning("webhook deliveries wait for Postgres: %s", exc)
                sent = 0
            if not sent:
                self._stop.wait(POLL_S)

    def turn(self) -> int:
        """Send what is due now; how many were sent."""
        due = self.store.take(_AT_ONCE * 4, _LEASE_S)
        outcomes = list(self._pool.map(self._send, due))
        for delivery, (code, error) in zip(due, outcomes, strict=True):
            if error is None and code is not None:
                self.store.delivered(delivery.id, code)
                log.info("webhook %s: delivery %d (%s) delivered, HTTP %d",
                         delivery.webhook, delivery.id, delivery.event, code)  # fmt: skip
                continue
            last = delivery.attempt >= MAX_ATTEMPTS
            wait = backoff_s(delivery.attempt)
            self.store.failed(delivery.id, code, error or "", wait, MAX_ATTEMPTS)
            log.warning("webhook %s: delivery %d (%s) attempt %d failed: %s; %s",
                        delivery.webhook, delivery.id, delivery.event, delivery.attempt, error,
                        "giving up" if last else f"again in {wait:g} s")  # fmt: skip
        return len(due)

    def _send(self, delivery: Due) -> tuple[int | None, str | None]:
        """(status, None) for a 2xx answer, else (status or None, why)."""
        body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
        headers = signed_headers(delivery.secret, str(delivery.id), int(time.time()), body)
        try:
            response = self._http.post(delivery.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
        if response.is_success:
            return response.status_code, None
        if response.is_redirect:
            return response.status_code, "answered a redirect, which is not followed"
        return response.status_code, f"answered HTTP {response.status_code}"
