"""The application-side CDI API: a ``Client`` per container and a ``CDIObject`` per key.

    with cdi.connect("unix:///run/cdi/minion.sock", "frame-extractor") as client:
        frame = client.create("frame-1", 2_000_000)
        frame.access()[:n] = pixels          # the owner writes in place
        frame.transfer("object-detector")    # atomic hand-over; our mapping is gone now

A ``Client`` is safe to share between threads, but a thread blocked in ``access()`` holds its
connection; give each thread that waits for objects a client of its own.
"""

from __future__ import annotations

import os
from typing import Any

from cdi import protocol
from cdi.client.handle import CDIObject
from cdi.client.session import Session
from cdi.protocol import Isolation, Op
from cdi.url import resolve_socket_path

__all__ = ["DEFAULT_CACHE_BYTES", "CDIObject", "Client", "connect"]

DEFAULT_CACHE_BYTES = 256 << 20


class Client:
    """A container's connection to its host's minion."""

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 10.0,
        spin_us: int | None = None,
        cache_bytes: int | None = None,
        native: bool | None = None,
    ) -> None:
        """``spin_us``: how long ``access()`` polls before it sleeps (``$CDI_SPIN_US``, default
        200). A sleeping process takes ~40 us to wake on a VM; polling trades CPU for latency.
        ``cache_bytes``: how many bytes of mappings of cooperative objects we gave away stay
        mapped for their return (``$CDI_MAP_CACHE_BYTES``, default 256 MiB; 0 disables).
        ``native``: ``transfer`` and ``access`` through the client's native extension
        (``cdi._hotpath``); by default whenever it is built, unless ``$CDI_CLIENT_NATIVE`` is 0."""
        self.socket_path = resolve_socket_path(url)
        if spin_us is None:
            spin_us = int(os.environ.get("CDI_SPIN_US", "200"))
        if cache_bytes is None:
            cache_bytes = int(os.environ.get("CDI_MAP_CACHE_BYTES", str(DEFAULT_CACHE_BYTES)))
        self._session = Session(self.socket_path, timeout, spin_us, cache_bytes, native)

    @property
    def container_id(self) -> str | None:
        """The id this client registered as (``None`` before ``register``)."""
        return self._session.container_id

    @property
    def host(self) -> str | None:
        """The minion's host name, from the registration."""
        return self._session.host

    @property
    def max_object(self) -> int | None:
        """The largest object the minion holds, from the registration."""
        return self._session.max_object

    @property
    def forwarding(self) -> bool:
        """Whether transfers to (and accesses of objects on) other hosts go through the
        gateway beside the minion; the gateway's own clients turn it off."""
        return self._session.forwarding

    @forwarding.setter
    def forwarding(self, value: bool) -> None:
        self._session.forwarding = value

    @property
    def spans_hosts(self) -> bool:
        """Whether objects may reach this container from other hosts (a gateway runs beside
        the minion, and forwarding is on): an object not here may then be on its way."""
        return self._session.spans_hosts

    # ------------------------------------------------------------- lifecycle
    def register(self, container_id: str | int) -> Client:
        """Announce this process as ``container_id``; required before any object operation."""
        self._session.register(protocol.check_container_id(container_id))
        return self

    def close(self) -> None:
        """Unmap everything and disconnect (objects we still own go to their recovery container)."""
        self._session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- objects
    def create(
        self,
        key: str,
        size: int,
        *,
        isolation: Isolation | str | None = None,
        recovery: str | None = None,
        populate: bool = True,
        zeroed: bool = True,
        generation: int | None = None,
    ) -> CDIObject:
        """Create an object of ``size`` bytes owned by this container; ``KeyExists`` if taken.

        ``generation``: the object's first (default 1); the minion's own uid and root only
        (a gateway carrying an object on from another host).

        ``zeroed=False``: the caller will overwrite all ``size`` bytes, so the minion need not
        zero recycled memory there that only processes of our own uid have used (another uid's
        bytes, and old bytes beyond ``size``, are zeroed anyway).

        ``populate``: map every page now, in one system call, rather than fault each in on
        first touch (the creator usually writes the whole object, and one populating call costs less
        than a fault per page; ``cdiflow bench images`` measures both)."""
        self._session.require_registered()
        key = protocol.check_key(key)
        protocol.check_sendable_size(size, self.max_object)
        fields: dict[str, Any] = {}
        if isolation is not None:
            fields["isolation"] = str(Isolation(isolation))
        if recovery is not None:
            fields["recovery"] = protocol.check_container_id(recovery)
        if zeroed is not True:
            fields["zeroed"] = zeroed
        if generation is not None:
            fields["generation"] = generation
        created = self._session.create(key, size, populate, **fields)
        return CDIObject(self._session, key, created)

    def use(self, key: str, *, check: bool = True) -> CDIObject:
        """A handle on an existing object (owned or not); ``ObjectNotFound`` if none.

        ``check=False`` skips the round trip that confirms the key exists (and learns its
        size): the handle's first operation reports ``ObjectNotFound`` instead. For a caller
        that accesses, transfers or destroys the object right away, as workers and the
        scheduler do for every task."""
        self._session.require_registered()
        key = protocol.check_key(key)
        return CDIObject(self._session, key, self._session.size_of(key) if check else None)

    def describe(self, key: str) -> dict[str, Any]:
        """What the minion says of an object here: ``size``, ``owner``, ``isolation``,
        ``recovery`` and ``generation``; ``ObjectNotFound`` if there is none."""
        self._session.require_registered()
        reply, _ = self._session.conn.call(Op.USE, key=protocol.check_key(key))
        return {k: reply[k] for k in ("size", "owner", "isolation", "recovery", "generation")}

    def stat(self) -> dict[str, Any]:
        """Minion counters: objects, bytes in use, warm pool, containers."""
        reply, _ = self._session.conn.call(Op.STAT)
        return reply

    def list_objects(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every live object on this host the caller may see (key, size, owner, readers,
        generation, age), or only the one of ``key`` (a lookup: ``[]`` if there is none)."""
        if key is None:
            reply, _ = self._session.conn.call(Op.LIST)
        else:
            reply, _ = self._session.conn.call(Op.LIST, key=protocol.check_key(key))
        objects: list[dict[str, Any]] = reply["objects"]
        # (a minion older than ``key`` lists everything: the answer is the same either way)
        return objects if key is None else [o for o in objects if o.get("key") == key]

    def bridge_channel(self, name: str, reader: str, **geometry: int) -> str:
        """Ask this host's gateway to carry our topic ``name`` to ``reader`` on another host
        (``Topic.grant`` does, for a reader that is not here); the gateway's relay container,
        which the topic grants instead. ``UnknownContainer`` if no host has ``reader``,
        ``ChannelBroken`` if its host's gateway cannot be reached or carries no channels."""
        self._session.require_registered()
        reply = self._session.gateway.call(
            "channel", name=name, to=reader, **{"from": self.container_id}, **geometry
        )
        return str(reply["relay"])


def connect(
    url: str | None = None,
    container_id: str | int | None = None,
    *,
    timeout: float = 10.0,
    spin_us: int | None = None,
    cache_bytes: int | None = None,
    native: bool | None = None,
) -> Client:
    """Connect to the local minion (``url``, else ``$CDI_URL``) and register if an id is given."""
    client = Client(url, timeout=timeout, spin_us=spin_us, cache_bytes=cache_bytes, native=native)
    if container_id is not None:
        try:
            client.register(container_id)
        except BaseException:
            client.close()
            raise
    return client
