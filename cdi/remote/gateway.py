"""A host's gateway: sends objects to other hosts and receives theirs (CDI-RPC).

Sending, for a container A that transfers an object to B on another host (the client library
does this when its minion answers ``UnknownContainer``), is the minion's own by default
(``cdi/minion-native/src/sending.rs``: this process only answers its questions for routes,
``cdi.remote.native``); with ``outbound="python"`` it is this process's:

1. A transfers the object to its slot, a container of the gateway's (a same-host transfer:
   A's views are revoked, exactly one owner);
2. the slot maps it and offers its bytes to B's host's gateway (``cdi.remote.outbound``),
   found through the controller's directory (``RouteContainer``);
3. that gateway creates the object, receives the bytes into it and transfers it to B, whose
   ``access()`` therefore returns only once every byte has landed; it answers;
4. the slot destroys its copy: the key's home is now B's host (both minions report it).

If B's host refuses or the link fails, the slot gives the object back to A, intact, and A's
``transfer`` raises; if the outcome is in doubt, the slot keeps it until B's host answers.

Receiving (``cdi.remote.inbound``) gives each new object the gateway's recovery container, so
that if its owner dies the object comes back here and is sent on to the recovery container it
had on its former host.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import cdi
from cdi.errors import (
    CDIError,
    MinionUnavailable,
    ObjectNotFound,
    TransferFailed,
    UnknownContainer,
)
from cdi.remote.channels import Bridges, Mirrors
from cdi.remote.inbound import InboundServer
from cdi.remote.local import LocalService
from cdi.remote.native import NativeInbound
from cdi.remote.outbound import Sender
from cdi.remote.routes import REGISTRATION_LAG_S, RouteCache
from cdi.remote.transport import choose_transport
from cdi.remote.wire import LINK_TIMEOUT_S
from cdi.url import gateway_socket_path

__all__ = ["GATEWAY_PREFIX", "Gateway", "GatewayConfig", "container_prefix"]

log = logging.getLogger(__name__)

RECOVERY_POLL_S = 0.5
_REMEMBERED = 100_000


GATEWAY_PREFIX = "cdi-gateway."


def container_prefix(host: str) -> str:
    """Every container id of a host's gateway starts with this."""
    return f"{GATEWAY_PREFIX}{host}."


@dataclass(frozen=True)
class GatewayConfig:
    minion_socket: str
    host: str
    controller_url: str
    key: str = field(repr=False)
    """The cluster's gateway key: every link proves both ends hold it (``cdi.auth``)."""
    listen: str
    """``host:port`` the gateway accepts other hosts' transfers on (port 0: any)."""
    advertise: str = ""
    """The address other hosts dial, if not ``listen`` (e.g. listening on 0.0.0.0)."""
    transport: str = "auto"
    controller_token: str | None = field(default=None, repr=False)
    """This host's minion's token, for the controller's routes (None: from the environment)."""
    socket_mode: int = 0o660
    socket_group: int | None = None
    """The local socket's mode and group: the minion's (``MinionConfig``)."""
    inbound: str = "native"
    """Who receives other hosts' offers: ``native``, the minion itself (``cdi.remote.native``;
    TCP only), or ``python``, this process (``cdi.remote.inbound``)."""
    outbound: str = "native"
    """Who sends to other hosts: ``native``, the minion itself (when it receives too), or
    ``python``, this process (``cdi.remote.outbound``)."""


class Gateway:
    """One per host, beside its minion; ``start()``, then ``close()``."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        prefix = container_prefix(config.host)
        self._transport = choose_transport(config.transport)
        self._sender = Sender(self._transport, config.key, config.host)
        self._routes = RouteCache(config.controller_url, config.host, config.controller_token)
        self._recovery_id = f"{prefix}recovery"
        self._recovery: cdi.Client | None = None  # connected in start(), once the minion is up
        # key -> its recovery container on its former host; the oldest forgotten past a bound
        # (entries of objects destroyed since are never asked for again)
        self._recover_to: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lock = threading.Lock()
        # Keys whose copy here waits for the other host's answer: an object with the same key
        # can come back before the copy is destroyed (its new owner sends it straight back).
        self._leaving: dict[str, threading.Event] = {}
        # Channels between hosts (cdi.remote.channels): relays of this host's topics, and
        # mirrors of other hosts' topics for readers here.
        self.bridges = Bridges(self._transport, config.key, config.host, config.minion_socket,
                               f"{prefix}relay", self._routes)  # fmt: skip
        self.mirrors = Mirrors(config.minion_socket, f"{prefix}mirror")
        self.local = LocalService(
            gateway_socket_path(config.minion_socket), config.minion_socket, f"{prefix}out",
            self.forward, self._locate, self._routes.locate,
            config.socket_mode, config.socket_group, channel=self.bridges.open,
        )  # fmt: skip
        self.inbound = InboundServer(
            self._transport, config.listen, config.minion_socket, f"{prefix}in",
            self._recovery_for, self.local.arrived, self._left, config.key,
            channel=self.mirrors.serve,
        )  # fmt: skip
        self.native: NativeInbound | None = None
        if config.inbound == "native" and self._transport.name == "tcp":
            route = self._minion_route if config.outbound == "native" else None
            self.native = NativeInbound(
                self.inbound.listener, config.key, self.mirrors.serve, route
            )
        host, _, port = self.inbound.address.rpartition(":")
        self.address = config.advertise or (
            self.inbound.address if host not in ("0.0.0.0", "::") else f"{config.host}:{port}"
        )
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._recover, name="cdi-gateway-rec", daemon=True)

    def start(self, timeout: float = 30.0) -> Gateway:
        """Connect to the minion (waiting up to ``timeout`` for it to answer) and serve."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._recovery = cdi.connect(self.config.minion_socket, self._recovery_id)
                break
            except MinionUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self._recovery.forwarding = False
        self.local.start()
        if self.native is not None:
            self.native.start()
        else:
            self.inbound.start()
        self._poller.start()
        log.info("gateway of %s: transfers on %s (%s)", self.config.host, self.address,
                 self._transport.name)  # fmt: skip
        return self

    def close(self) -> None:
        self._stop.set()
        self.local.close()
        self.bridges.close()
        if self.native is not None:
            self.native.close()
        else:
            self.inbound.close()
        self._poller.join(5)
        self._sender.close()
        self._routes.close()
        if self._recovery is not None:
            self._recovery.close()

    # ------------------------------------------------------------------ sending
    def forward(self, slot: cdi.Client, key: str, to: str, back: str) -> None:
        """Send ``key`` (which ``slot`` owns) to ``to`` on its host; give it back to ``back``
        on failure. Raises what the caller's ``transfer`` should raise."""
        obj = slot.use(key, check=False)
        try:
            view = obj.access(timeout=2.0)
        except CDIError as exc:
            raise TransferFailed(f"{key!r} did not reach the gateway: {exc}") from exc
        gone = threading.Event()
        with self._lock:
            self._leaving[key] = gone
        try:
            self._send(slot, obj, view, to, back)
        finally:
            with self._lock:
                if self._leaving.get(key) is gone:
                    del self._leaving[key]
            gone.set()

    def _left(self, key: str) -> None:
        """Wait (a link timeout at most) until our copy of ``key``, if one is on its way to
        another host, is destroyed or back with its owner."""
        with self._lock:
            gone = self._leaving.get(key)
        if gone is not None:
            gone.wait(LINK_TIMEOUT_S)

    def _send(
        self, slot: cdi.Client, obj: cdi.CDIObject, view: memoryview, to: str, back: str
    ) -> None:
        key = obj.key
        try:
            described = slot.describe(key)
            header = {"key": key, "to": to, "recovery": self._original_recovery(key, described),
                      "from": self.config.host, "isolation": obj.isolation,
                      "generation": described["generation"]}  # fmt: skip
            route = self._routes.route(to)
            try:
                self._sender.send(route.rpc_address, header, view)
            except UnknownContainer:
                # Not there (any more): a route from the cache may be stale; ask once more.
                self._routes.forget(to)
                fresh = self._routes.route(to)
                if fresh == route:
                    raise
                route = fresh
                self._sender.send(route.rpc_address, header, view)
        except TransferFailed as exc:
            view.release()
            if exc.in_doubt:
                threading.Thread(
                    target=self._settle, args=(slot, key, back, route.rpc_address, exc.xfer),
                    daemon=True,
                ).start()  # fmt: skip
            else:
                self._give_back(obj, back)
            raise
        except CDIError:
            view.release()
            self._give_back(obj, back)
            raise
        view.release()
        obj.destroy()

    def _minion_route(self, to: str, fresh: bool) -> str:
        """For the sending minion: the gateway address of ``to``'s host."""
        if fresh:
            self._routes.forget(to)
        return self._routes.route(to).rpc_address

    def _give_back(self, obj: cdi.CDIObject, back: str) -> None:
        try:
            obj.transfer(back)
        except CDIError as exc:  # the sender is gone: the slot's recovery rules apply
            log.warning("cannot give %r back to %s: %s", obj.key, back, exc)

    def _settle(self, slot: cdi.Client, key: str, back: str, address: str, xfer: str) -> None:
        """Ask until the other host says whether it kept an in-doubt transfer."""
        while not self._stop.is_set():
            outcome = self._sender.resolve(address, xfer)
            obj = slot.use(key, check=False)
            if outcome == "committed":
                obj.destroy()
                return
            if outcome == "aborted":
                self._give_back(obj, back)
                return
            self._stop.wait(1.0)

    def _original_recovery(self, key: str, described: dict[str, Any]) -> str:
        """The recovery container the object should have wherever it goes: its own here, or,
        for an object that came from another host (ours stands in for it here), the one it
        had there. Never a gateway's: two gateways would pass it back and forth."""
        recovery = str(described["recovery"])
        if recovery == self._recovery_id:
            with self._lock:
                recovery = self._recover_to.get(key, "")
        return "" if recovery.startswith(GATEWAY_PREFIX) else recovery

    def _locate(self, key: str) -> dict[str, Any]:
        """Where ``key`` is, our minion having just said it has no such object."""
        info = self._routes.locate(key)
        while True:
            if info.host == self.config.host:
                # Our minion is the authority on its own objects: the directory lags behind a
                # destroy (or a move away) here.
                raise ObjectNotFound(f"no object with key {key!r}")
            when, generation = self.local.arrival(key)
            if info.generation >= generation or time.monotonic() - when >= REGISTRATION_LAG_S:
                return {"host": info.host, "size": info.size}
            # The entry is older than the object's arrival here, and it is no longer here: the
            # directory has not yet heard where it went, or that it was destroyed here (a
            # minion tells it what lingered, a fraction of a second later). A key created
            # afresh on that host has a lower generation too, so the entry is believed once
            # the arrival is older than any report can be.
            time.sleep(0.05)
            info = self._routes.locate(key, wait=False)

    # ------------------------------------------------------------------ receiving
    def native_inbound(self) -> NativeInbound | None:
        """The minion's part of receiving, if it receives (``cdi.remote.native``)."""
        return self.native

    def arrived(self, key: str, recovery: str, generation: int) -> None:
        """The minion received ``key`` from another host and handed it to its owner;
        ``recovery``: the recovery container it had there; ``generation``: its generation
        here (0: unknown)."""
        self._recovery_for(key, recovery)
        self.local.arrived(key, generation)

    # ------------------------------------------------------------------ recovery
    def _recovery_for(self, key: str, theirs: str) -> str:
        """The recovery container a received object gets here: ours, which sends it on."""
        with self._lock:
            if theirs:
                self._recover_to[key] = theirs
                self._recover_to.move_to_end(key)
                if len(self._recover_to) > _REMEMBERED:
                    self._recover_to.popitem(last=False)
            else:
                self._recover_to.pop(key, None)
        return self._recovery_id

    def _recover(self) -> None:
        """Objects whose owner died come back to our recovery container: send each on to the
        recovery container it had (on its former host, or here), else reclaim it."""
        proxy = self._recovery
        assert proxy is not None
        while not self._stop.wait(RECOVERY_POLL_S):
            try:
                mine = [o for o in proxy.list_objects() if o["owner"] == self._recovery_id]
            except CDIError as exc:
                log.warning("gateway recovery: cannot list objects: %s", exc)
                continue
            for entry in mine:
                key = entry["key"]
                with self._lock:
                    target = self._recover_to.pop(key, "")
                obj = proxy.use(key, check=False)
                try:
                    if not target:
                        raise UnknownContainer("no recovery container is known")
                    try:
                        obj.transfer(target)
                    except UnknownContainer:  # on another host: send it there
                        self.forward(proxy, key, target, self._recovery_id)
                    log.info("recovered %r to %s", key, target)
                except TransferFailed as exc:
                    if not exc.in_doubt:
                        log.warning("cannot recover %r to %r (%s); reclaiming it", key, target, exc)
                        obj.destroy()
                except CDIError as exc:
                    log.warning("cannot recover %r to %r (%s); reclaiming it", key, target, exc)
                    obj.destroy()
        with self._lock:
            self._recover_to.clear()
