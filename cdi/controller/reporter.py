"""Minion-side reporting of containers and objects to the CDI controller.

The minion calls a ``DirectoryReporter`` from its single-threaded event loop, so every method
only validates and enqueues. ``GrpcDirectoryReporter`` does the network work on a daemon thread:
it coalesces queued changes per id, sends them in batches, heartbeats when idle and keeps a mirror
of everything the minion holds, which it re-announces in full whenever the controller may have
lost track (the controller restarted, or a call failed and its effect is unknown). The controller
being down never reaches the minion: the thread logs one warning per outage and retries.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Protocol

from cdi.controller.client import DEFAULT_TIMEOUT_S, ControllerClient
from cdi.controller.models import Changes, ContainerRecord, ObjectRecord, Restarts
from cdi.controller.validation import (
    check_container_id,
    check_container_record,
    check_host,
    check_interval,
    check_key,
    check_object_record,
    check_restarts,
    check_rpc_address,
    check_socket_path,
)
from cdi.errors import CDIError, ControllerUnavailable

__all__ = [
    "CLOSE_FLUSH_S",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_LINGER_S",
    "MAX_BACKOFF_S",
    "DirectoryReporter",
    "GrpcDirectoryReporter",
    "NullDirectoryReporter",
]

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 2.0
# After a change, wait this long for more before calling the controller. *Why:* a workflow makes
# several object changes within milliseconds; one call each would cost the minion's host a gRPC
# call's CPU on both ends per change, and an object created and destroyed in between never
# needs to travel at all. The directory serves lookups and dashboards, not same-host hand-offs.
# 0.2 s rather than 0.05: fewer, fuller calls, and more short-lived objects never sent (the
# minion and the controller use less CPU per workflow at every image size).
DEFAULT_LINGER_S = 0.2
INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
CLOSE_FLUSH_S = 1.0
# Bounds one batch so a flood of events cannot starve heartbeats or grow one request unboundedly.
_MAX_EVENTS_PER_BATCH = 10_000


class DirectoryReporter(Protocol):
    """What the minion tells the controller's directory. Implementations must never block."""

    def container_registered(self, container_id: str, pid: int, uid: int) -> None:
        """A container registered with this minion."""

    def container_gone(self, container_id: str) -> None:
        """A container unregistered or died."""

    def object_changed(
        self, key: str, size: int, owner: str, generation: int, created_at: float = 0.0
    ) -> None:
        """An object was created, resized, transferred or otherwise changed; ``created_at``:
        when it was made (Unix seconds, as its minion knows it across restarts), 0 if unknown."""

    def object_removed(self, key: str) -> None:
        """An object was destroyed or reclaimed."""

    def store_resumed(self, restarts: Restarts) -> None:
        """The minion keeps its objects across restarts (a state folder): how often it was
        restarted, and what it found again."""

    def close(self) -> None:
        """Flush what can be flushed quickly and release resources."""


class NullDirectoryReporter:
    """A reporter for minions that run without a controller: every call does nothing."""

    def container_registered(self, container_id: str, pid: int, uid: int) -> None:
        """Ignore."""

    def container_gone(self, container_id: str) -> None:
        """Ignore."""

    def object_changed(
        self, key: str, size: int, owner: str, generation: int, created_at: float = 0.0
    ) -> None:
        """Ignore."""

    def object_removed(self, key: str) -> None:
        """Ignore."""

    def store_resumed(self, restarts: Restarts) -> None:
        """Ignore."""

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True, slots=True)
class _ContainerGone:
    container_id: str


@dataclass(frozen=True, slots=True)
class _ObjectRemoved:
    key: str


# ``None`` only wakes the thread up (on close).
_Event = ContainerRecord | ObjectRecord | _ContainerGone | _ObjectRemoved | Restarts | None


class GrpcDirectoryReporter:
    """Reports one minion's containers and objects to the controller at ``controller_url``.

    Event methods validate their arguments (raising ``InvalidArgument``, as the controller would
    reject the whole batch otherwise) and enqueue; they never block and never see the network.
    ``ConfigError`` is raised at construction for a malformed URL.
    """

    def __init__(
        self,
        controller_url: str,
        host: str,
        socket_path: str,
        rpc_address: str = "",
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        linger_s: float = DEFAULT_LINGER_S,
        token: str | None = None,
    ) -> None:
        self.controller_url = controller_url
        self.linger_s = max(0.0, float(linger_s))
        self.host = check_host(host)
        self.socket_path = check_socket_path(socket_path)
        self.rpc_address = check_rpc_address(rpc_address)
        self.heartbeat_s = check_interval(heartbeat_s, "heartbeat_s")
        # token: this host's minion's (cdi.auth); None: $CDI_CONTROLLER_TOKEN[_FILE]
        self._client = ControllerClient(controller_url, timeout=DEFAULT_TIMEOUT_S, token=token)
        # SimpleQueue.put never blocks: the only thing the minion's event loop ever does here.
        self._queue: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._close_lock = threading.Lock()
        self._flush_deadline = 0.0
        # Owned by the reporter thread alone, so no lock.
        self._containers: dict[str, ContainerRecord] = {}
        self._objects: dict[str, ObjectRecord] = {}
        self._pending_containers: dict[str, ContainerRecord | None] = {}  # None: removed
        self._pending_objects: dict[str, ObjectRecord | None] = {}
        self._restarts = Restarts()  # what the minion keeps across restarts: nothing, until told
        self._epoch: str | None = None  # None: the controller must get the full snapshot
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=f"cdi-reporter-{host}", daemon=True)
        self._thread.start()

    # -- called by the minion; enqueue only ------------------------------------------------

    def container_registered(self, container_id: str, pid: int, uid: int) -> None:
        """Report a container that registered with this minion."""
        self._put(check_container_record(ContainerRecord(container_id, pid, uid, time.time())))

    def container_gone(self, container_id: str) -> None:
        """Report a container that left or died."""
        self._put(_ContainerGone(check_container_id(container_id)))

    def object_changed(
        self, key: str, size: int, owner: str, generation: int, created_at: float = 0.0
    ) -> None:
        """Report an object's current state (created, resized, transferred, ...)."""
        record = ObjectRecord(key, size, owner, generation, created_at, updated_at=time.time())
        self._put(check_object_record(record))

    def object_removed(self, key: str) -> None:
        """Report an object that no longer exists on this minion."""
        self._put(_ObjectRemoved(check_key(key)))

    def store_resumed(self, restarts: Restarts) -> None:
        """Report what the minion keeps across restarts (sent with the next full snapshot)."""
        self._put(check_restarts(restarts))

    def close(self) -> None:
        """Flush pending changes best-effort within about a second and stop the thread."""
        with self._close_lock:
            if self._stop.is_set():
                return
            self._flush_deadline = time.monotonic() + CLOSE_FLUSH_S
            self._stop.set()
        self._queue.put(None)
        self._thread.join(max(0.0, self._flush_deadline - time.monotonic()))
        # Closing the channel cancels a call still in flight (a controller that accepted the
        # connection but does not answer), which lets the thread finish.
        self._client.close()
        self._thread.join(0.2)
        if self._thread.is_alive():
            log.warning("directory reporter thread for %s did not stop; abandoning it", self.host)

    @property
    def running(self) -> bool:
        """Whether the background thread is still alive (false once ``close`` returned)."""
        return self._thread.is_alive()

    def __enter__(self) -> GrpcDirectoryReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GrpcDirectoryReporter({self.controller_url!r}, host={self.host!r})"

    def _put(self, event: _Event) -> None:
        if self._stop.is_set():
            log.debug("directory reporter for %s is closed; dropping %r", self.host, event)
            return
        self._queue.put(event)

    # -- the reporter thread ---------------------------------------------------------------

    def _run(self) -> None:
        backoff = INITIAL_BACKOFF_S
        retry_at = 0.0  # monotonic; no call before this while backing off
        beat_at = 0.0  # monotonic; when an idle reporter heartbeats next
        while not self._stop.is_set():
            due = retry_at if self._has_work() else max(retry_at, beat_at)
            self._drain(max(0.0, due - time.monotonic()))
            if self.linger_s and self._has_work() and not self._stop.is_set():
                self._stop.wait(self.linger_s)  # let the rest of a burst join this call
                self._drain(0.0)
            now = time.monotonic()
            if self._stop.is_set() or now < retry_at or (not self._has_work() and now < beat_at):
                continue
            if self._sync(self._client.timeout):
                backoff = INITIAL_BACKOFF_S
                retry_at = 0.0
                beat_at = time.monotonic() + self.heartbeat_s
            else:
                retry_at = time.monotonic() + backoff
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        self._flush()

    def _flush(self) -> None:
        self._drain(0.0)
        remaining = self._flush_deadline - time.monotonic()
        if remaining > 0 and self._has_work():
            self._sync(remaining)

    def _has_work(self) -> bool:
        return self._epoch is None or bool(self._pending_containers or self._pending_objects)

    def _drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the first event, then apply whatever else is queued."""
        try:
            event = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            for _ in range(_MAX_EVENTS_PER_BATCH):
                self._apply(event)
                event = self._queue.get_nowait()
        except queue.Empty:
            return
        self._apply(event)

    def _apply(self, event: _Event) -> None:
        # While the epoch is unknown the next call sends the whole mirror, so no pending batch.
        tracking = self._epoch is not None
        match event:
            case ContainerRecord(container_id=container_id):
                self._containers[container_id] = event
                if tracking:
                    self._pending_containers[container_id] = event
            case _ContainerGone(container_id=container_id):
                self._containers.pop(container_id, None)
                if tracking:
                    self._pending_containers[container_id] = None
            case ObjectRecord(key=key):
                previous = self._objects.get(key)
                # The minion's own time of creation (it outlives a restart of the minion),
                # else the first report of the object.
                created = event.created_at or (
                    previous.created_at if previous else event.updated_at
                )
                record = replace(event, created_at=created)
                self._objects[key] = record
                if tracking:
                    self._pending_objects[key] = record
            case _ObjectRemoved(key=key):
                self._objects.pop(key, None)
                if tracking:
                    self._pending_objects[key] = None
            case Restarts():
                # Told once, at the minion's start: the controller gets it with a snapshot.
                self._restarts = event
                self._epoch = None
                self._pending_containers.clear()
                self._pending_objects.clear()
            case None:
                pass

    def _sync(self, timeout: float) -> bool:
        """Bring the controller up to date with one or two calls; False if that failed."""
        try:
            if self._epoch is None:
                self._register(timeout)
            elif self._client.report_changes(
                self.host, self._epoch, self._batch(), timeout=timeout
            ):
                log.info(
                    "CDI controller at %s does not know this minion's state (it restarted?); "
                    "re-announcing %d containers and %d objects",
                    self.controller_url,
                    len(self._containers),
                    len(self._objects),
                )
                self._register(timeout)
            else:
                self._pending_containers.clear()
                self._pending_objects.clear()
        except Exception as exc:  # the thread must survive anything; it is retried with backoff
            # A failed call may or may not have been applied: re-announce everything next time.
            self._epoch = None
            self._pending_containers.clear()
            self._pending_objects.clear()
            self._note_failure(exc)
            return False
        if self._failing:
            self._failing = False
            log.info("CDI controller at %s is reachable again", self.controller_url)
        return True

    def _register(self, timeout: float) -> None:
        self._epoch = None
        self._epoch = self._client.register_minion(
            self.host,
            self.socket_path,
            self.rpc_address,
            heartbeat_s=self.heartbeat_s,
            containers=list(self._containers.values()),
            objects=list(self._objects.values()),
            restarts=self._restarts,
            timeout=timeout,
        )
        self._pending_containers.clear()
        self._pending_objects.clear()

    def _batch(self) -> Changes:
        return Changes(
            upsert_containers=[c for c in self._pending_containers.values() if c is not None],
            removed_containers=[k for k, c in self._pending_containers.items() if c is None],
            upsert_objects=[o for o in self._pending_objects.values() if o is not None],
            removed_objects=[k for k, o in self._pending_objects.items() if o is None],
        )

    def _note_failure(self, exc: Exception) -> None:
        """Log once per outage; later failures of the same outage only at debug level."""
        if self._failing or self._stop.is_set():  # closing cancels calls: not an outage
            log.debug("CDI controller at %s: call failed: %s", self.controller_url, exc)
            return
        self._failing = True
        if isinstance(exc, ControllerUnavailable):
            log.warning(
                "CDI controller at %s is unavailable; the minion keeps working and the "
                "directory reporter retries in the background: %s",
                self.controller_url,
                exc,
            )
        elif isinstance(exc, CDIError):
            log.error("CDI controller at %s rejected a report: %s", self.controller_url, exc)
        else:
            log.error("directory reporter for %s failed; retrying", self.host, exc_info=exc)
