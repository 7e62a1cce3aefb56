"""Where a container lives, from the controller's directory, cached briefly."""

from __future__ import annotations

import threading
import time

from cdi.controller.client import ControllerClient
from cdi.controller.models import ObjectInfo, Route
from cdi.errors import ControllerUnavailable, ObjectNotFound, TransferFailed, UnknownContainer

__all__ = ["RouteCache"]

TTL_S = 5.0
# A container's registration, or a new object, reaches the directory a moment after it happens
# (the minion's reporter batches for 0.2 s; a loaded machine can starve its thread for
# seconds): a lookup that misses is asked again for this long before it fails. Only a miss
# pays it — a transfer to a container, or a use() of a key, that no host has.
REGISTRATION_LAG_S = 5.0


class RouteCache:
    """``route(container)`` -> its host and that host's gateway address."""

    def __init__(self, controller_url: str, this_host: str, token: str | None = None) -> None:
        self.this_host = this_host
        self._url = controller_url
        self._token = token  # this host's minion's (None: from the environment)
        self._client: ControllerClient | None = None  # made on first use: no gRPC before fork
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[float, Route]] = {}

    @property
    def _controller(self) -> ControllerClient:
        with self._lock:
            if self._client is None:
                self._client = ControllerClient(self._url, token=self._token)
            return self._client

    def route(self, container_id: str, *, here: bool = False) -> Route:
        """The route to ``container_id`` on another host; ``UnknownContainer`` if it has none,
        ``TransferFailed`` if its host serves no transfers. ``here``: a container the directory
        lists on this host is answered at once, with this host's route (not cached)."""
        now = time.monotonic()
        with self._lock:
            cached = self._routes.get(container_id)
        if cached is not None and now - cached[0] < TTL_S:
            return cached[1]
        deadline = now + REGISTRATION_LAG_S
        while True:
            try:
                route = self._controller.route_container(container_id)
            except ControllerUnavailable:
                if cached is None:
                    raise
                return cached[1]  # the controller restarts: the last route is the best guess
            except UnknownContainer:
                if cached is not None:
                    # A restarted controller learns containers as minions re-announce them;
                    # the receiving gateway refuses if the container is really gone.
                    return cached[1]
                if time.monotonic() >= deadline:
                    raise UnknownContainer(
                        f"no live container {container_id!r} is registered on any host"
                    ) from None
                time.sleep(0.1)
                continue
            if route.host != self.this_host:
                break
            if here:
                return route
            if time.monotonic() >= deadline:  # the directory still lists it here: it left
                raise UnknownContainer(
                    f"no live container {container_id!r} is registered with this minion"
                )
            time.sleep(0.1)
        if not route.rpc_address:
            raise TransferFailed(
                f"{container_id!r} is on host {route.host}, whose minion serves no transfers "
                "(start it with --rpc-listen)"
            )
        with self._lock:
            self._routes[container_id] = (time.monotonic(), route)
        return route

    def locate(self, key: str, *, wait: bool = True) -> ObjectInfo:
        """The directory's entry of ``key`` (asked again for a moment unless not ``wait``:
        reports lag a little); ``ObjectNotFound`` if no host has it."""
        deadline = time.monotonic() + (REGISTRATION_LAG_S if wait else 0.0)
        while True:
            try:
                return self._controller.lookup_object(key)
            except ObjectNotFound:
                if time.monotonic() >= deadline:
                    raise ObjectNotFound(f"no object with key {key!r} on any host") from None
                time.sleep(0.1)

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._routes.pop(container_id, None)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
