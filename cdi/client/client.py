"""The application-side CDI API: a ``Client`` per container and a ``CDIObject`` per key.

    with cdi.connect("unix:///run/cdi/minion.sock", "frame-extractor") as client:
        frame = client.create("frame-1", 2_000_000)
        frame.access()[:n] = pixels          # the owner writes in place
        frame.transfer("object-detector")    # atomic hand-over; our mapping is gone now

A ``Client`` is safe to share between threads, but a thread blocked in ``access()`` holds its
connection; give each thread that waits for objects a client of its own.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Any

from cdi import protocol
from cdi.client.connection import MinionConnection
from cdi.client.gateway_link import GatewayLink
from cdi.client.handle import CDIObject
from cdi.client.mapping import Mapping
from cdi.client.owned import OwnedMappings
from cdi.client.reading import ReadMappings
from cdi.errors import (
    AccessTimeout,
    NotRegistered,
    ObjectNotFound,
    ProtocolError,
    UnknownContainer,
)
from cdi.protocol import Isolation, Op
from cdi.url import resolve_socket_path

__all__ = ["DEFAULT_CACHE_BYTES", "CDIObject", "Client", "connect"]

DEFAULT_CACHE_BYTES = 256 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere pages fault in on first touch


class Client:
    """A container's connection to its host's minion."""

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 10.0,
        spin_us: int | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        """``spin_us``: how long ``access()`` polls before it sleeps (``$CDI_SPIN_US``, default
        200). A sleeping process takes ~40 us to wake on a VM; polling trades CPU for latency.
        ``cache_bytes``: how many bytes of mappings of cooperative objects we gave away stay
        mapped for their return (``$CDI_MAP_CACHE_BYTES``, default 256 MiB; 0 disables)."""
        self.socket_path = resolve_socket_path(url)
        if spin_us is None:
            spin_us = int(os.environ.get("CDI_SPIN_US", "200"))
        self._conn = MinionConnection(self.socket_path, timeout, spin_us=spin_us)
        if cache_bytes is None:
            cache_bytes = int(os.environ.get("CDI_MAP_CACHE_BYTES", str(DEFAULT_CACHE_BYTES)))
        self._owned = OwnedMappings(cache_bytes)
        self._maps = self._owned.maps  # key -> our mapping of an object we own alone
        self._cache = self._owned.cache  # mappings kept for the objects' return (see owned)
        self._reads = ReadMappings(self._conn)
        self.container_id: str | None = None
        self.host: str | None = None
        self.max_object: int | None = None
        # Cross-host: a transfer to a container of another host, or an access of an object on
        # its way here, goes through the gateway beside the minion when one runs.
        self.forwarding = True
        self._gateway = GatewayLink(self.socket_path)
        self._forward_lock = threading.Lock()

    # ------------------------------------------------------------- lifecycle
    def register(self, container_id: str | int) -> Client:
        """Announce this process as ``container_id``; required before any object operation."""
        cid = protocol.check_container_id(container_id)
        reply, _ = self._conn.call(Op.REGISTER, container=cid)
        self.container_id = cid
        self.host = reply["host"]
        self.max_object = reply["max_object"]
        return self

    def close(self) -> None:
        """Unmap everything and disconnect (objects we still own go to their recovery container)."""
        self._owned.close()
        self._reads.close()
        self._gateway.close()
        self._conn.close()

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
        first touch (the creator usually writes the whole object: a 26 MB write into a fresh
        mapping took 22 ms here, 9 ms populated; ``cdiflow bench images``)."""
        self._require_registered()
        key = protocol.check_key(key)
        protocol.check_sendable_size(size, self.max_object)
        args: dict[str, Any] = {"key": key, "size": size}
        if type(size) is int and size >= 0:
            offer = self._owned.offer(protocol.size_class(size))
            if offer:
                args["have"] = offer  # the minion reuses one of these if it is free: no fd
        if isolation is not None:
            args["isolation"] = str(Isolation(isolation))
        if recovery is not None:
            args["recovery"] = protocol.check_container_id(recovery)
        if zeroed is not True:
            args["zeroed"] = zeroed
        if generation is not None:
            args["generation"] = generation
        reply, fd = self._conn.call(Op.CREATE, **args)
        self._map(key, reply, fd, populate)
        return CDIObject(self, key, reply["size"])

    def use(self, key: str, *, check: bool = True) -> CDIObject:
        """A handle on an existing object (owned or not); ``ObjectNotFound`` if none.

        ``check=False`` skips the round trip that confirms the key exists (and learns its
        size): the handle's first operation reports ``ObjectNotFound`` instead. For a caller
        that accesses, transfers or destroys the object right away, as workers and the
        scheduler do for every task."""
        self._require_registered()
        key = protocol.check_key(key)
        return CDIObject(self, key, self._size_of(key) if check else None)

    def describe(self, key: str) -> dict[str, Any]:
        """What the minion says of an object here: ``size``, ``owner``, ``isolation``,
        ``recovery`` and ``generation``; ``ObjectNotFound`` if there is none."""
        self._require_registered()
        reply, _ = self._conn.call(Op.USE, key=protocol.check_key(key))
        return {k: reply[k] for k in ("size", "owner", "isolation", "recovery", "generation")}

    def stat(self) -> dict[str, Any]:
        """Minion counters: objects, bytes in use, warm pool, containers."""
        reply, _ = self._conn.call(Op.STAT)
        return reply

    def list_objects(self) -> list[dict[str, Any]]:
        """Every live object on this host: key, size, owner, generation, age."""
        reply, _ = self._conn.call(Op.LIST)
        objects: list[dict[str, Any]] = reply["objects"]
        return objects

    # ------------------------------------------------------------- internals
    def _require_registered(self) -> None:
        if self.container_id is None:
            raise NotRegistered("call register(container_id) before using objects")

    def _size_of(self, key: str) -> int:
        """The object's size, from the minion (or, for an object on another host, the
        directory through the gateway); ``ObjectNotFound`` if there is none."""
        try:
            reply, _ = self._conn.call(Op.USE, key=key)
        except ObjectNotFound:
            if not self._crosses_hosts():
                raise
            reply = self._gateway.call("locate", key=key)
        return int(reply["size"])

    @property
    def spans_hosts(self) -> bool:
        """Whether objects may reach this container from other hosts (a gateway runs beside
        the minion, and forwarding is on): an object not here may then be on its way."""
        return self.forwarding and self._gateway.present

    def _crosses_hosts(self) -> bool:
        return self.spans_hosts

    def _transfer(self, key: str, to: str, detach: bool) -> None:
        """Make ``to`` the owner of ``key``, on this host or (through the gateway) another.
        Once this client has a gateway slot, the minion is told to hand the object to the
        slot (``via``) if ``to`` is not here: one request where a refusal and a second
        transfer would be two."""
        via = self._gateway.slot if self._crosses_hosts() else None
        if via is None:
            try:
                self._give_up(key, Op.TRANSFER, detach, to=to)
            except UnknownContainer:
                if not self._crosses_hosts():
                    raise
                self._forward(key, to, detach)  # ``to`` is on another host
            return
        try:
            reply = self._give_up(key, Op.TRANSFER, detach, to=to, via=via)
        except UnknownContainer:  # the slot is gone too (a gateway restarted): reserve anew
            self._gateway.close()
            self._forward(key, to, detach)
            return
        if reply.get("to") == via:  # in our slot: the gateway sends it to ``to``'s host
            with self._forward_lock:
                self._gateway.call("forward", key=key, to=to, **{"from": self.container_id})

    def _forward(self, key: str, to: str, detach: bool) -> None:
        """Send ``key`` to ``to`` on another host: hand it to our gateway slot (a same-host
        transfer), which sends it and answers once ``to`` owns it — or gives it back to us
        and says why not."""
        with self._forward_lock:
            slot = self._gateway.reserve()
            self._give_up(key, Op.TRANSFER, detach, to=slot)
            self._gateway.call("forward", key=key, to=to, **{"from": self.container_id})

    def _grant_arriving(self, key: str, timeout: float | None, populate: bool) -> Mapping:
        """``access``: our grant of ``key``; if no such key is here but a gateway is, wait for
        it to arrive from another host (``ObjectNotFound`` if no host has it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            since = time.monotonic()
            try:
                return self._grant(key, Op.ACCESS, timeout, populate)
            except ObjectNotFound:
                if not self._crosses_hosts():
                    raise
            wait = 10.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                raise AccessTimeout(f"{key!r} did not arrive from another host before the timeout")
            try:
                self._gateway.await_arrival(key, min(wait, 10.0), since)
            except AccessTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())

    def _grant(
        self,
        key: str,
        op: Op,
        timeout: float | None = None,
        populate: bool = False,
        **args: Any,
    ) -> Mapping:
        """Ask for ``key``'s memory (``access``) and map it, reusing our cached mapping when the
        minion says it is of the same segment (then it sends no fd)."""
        have = self._owned.cached_segment(key)
        if have is not None:
            args["have"] = have
        try:
            if op is Op.ACCESS and args.get("wait") is not False:
                reply, fd = self._conn.call_blocking(op, timeout, key=key, **args)
            else:
                reply, fd = self._conn.call(op, key=key, **args)
        except ObjectNotFound:
            self._owned.drop_cached(key)
            raise
        return self._map(key, reply, fd, populate)

    def _map(
        self, key: str, reply: dict[str, Any], fd: int | None, populate: bool = False
    ) -> Mapping:
        """Make the memory of a grant ``key``'s mapping: a cached one if we still map the
        segment (then an fd sent anyway is closed unused), else a new ``mmap`` of ``fd``."""
        mapping = self._owned.reuse(key, reply)
        if mapping is not None:
            if fd is not None:
                os.close(fd)
            return mapping
        if fd is None:
            # We named a cached mapping that another thread evicted meanwhile: we own the
            # object now, so ask for its memory once more without claiming to have it.
            reply, fd = self._conn.call(Op.ACCESS, key=key, wait=False)
            if fd is None:
                raise ProtocolError("the minion granted an object without its memory")
        flags = mmap.MAP_SHARED | (_POPULATE if populate else 0)
        try:
            mm = mmap.mmap(fd, reply["capacity"], flags, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping is all we keep: no fd to re-map once ownership is gone
        mapping = Mapping(
            mm,
            reply["size"],
            reply["capacity"],
            reply["generation"],
            reply.get("segment"),
            reply.get("isolation", Isolation.COOPERATIVE) == Isolation.COOPERATIVE,
        )
        self._owned.install(key, mapping)
        return mapping

    def _give_up(self, key: str, op: Op, detach: bool = False, **args: Any) -> dict[str, Any]:
        """Run an operation that ends our ownership: revoke our views (no code of ours can touch
        the bytes any more), send, then unmap — or, after a transfer or destroy of a cooperative
        object whose memory only our uid was ever handed (the minion says ``keep_mapping``),
        keep the mapping for the object's return, or for a later object of ours in the same
        segment: the minion's pool gives that segment to our uid only. Unmapping 10 MB costs
        ~0.5 ms, which the new owner must not wait for: it happens after the reply."""
        self._reads.drop(key)  # what we read while we had shared it
        mapping = self._owned.revoke(key, detach)
        keep = op is Op.TRANSFER or op is Op.DESTROY
        reply: dict[str, Any] | None = None
        try:
            reply, _ = self._conn.call(op, key=key, **args)
        finally:
            if reply is not None and reply.get("keep_mapping") is False:
                keep = False  # another uid was handed this memory: never map it again
            if mapping is not None:
                if keep:
                    self._owned.keep(key, mapping)
                else:
                    mapping.close(key)
        if not keep:
            self._owned.drop_cached(key)
        return reply


def connect(
    url: str | None = None,
    container_id: str | int | None = None,
    *,
    timeout: float = 10.0,
    spin_us: int | None = None,
    cache_bytes: int | None = None,
) -> Client:
    """Connect to the local minion (``url``, else ``$CDI_URL``) and register if an id is given."""
    client = Client(url, timeout=timeout, spin_us=spin_us, cache_bytes=cache_bytes)
    if container_id is not None:
        try:
            client.register(container_id)
        except BaseException:
            client.close()
            raise
    return client
