"""``Session``: what one container holds of its minion — the connection, the registration, the
mappings of the objects it owns and reads, and the way to other hosts through the gateway.

``Client`` (the public API) and each ``CDIObject`` act through it: the handle's operations are
its public methods (``handle.ObjectOps`` names them), so a handle never reaches into the
client's state.
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

__all__ = ["Session"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere pages fault in on first touch
ARRIVING_S = 0.5
"""How long the minion waits for an object not yet on this host before the gateway is asked
(which also tells whether any host has it)."""


class Session:
    """One container's connection to its host's minion and everything it maps through it."""

    def __init__(
        self,
        socket_path: str,
        timeout: float,
        spin_us: int,
        cache_bytes: int,
        native: bool | None = None,
    ) -> None:
        self.conn = MinionConnection(socket_path, timeout, spin_us=spin_us, native=native)
        self.owned = OwnedMappings(cache_bytes)
        self.reads = ReadMappings(self.conn)
        self.container_id: str | None = None
        self.host: str | None = None
        self.max_object: int | None = None
        # Cross-host: a transfer to a container of another host, or an access of an object on
        # its way here, goes through the gateway beside the minion when one runs.
        self.forwarding = True
        self.gateway = GatewayLink(socket_path)
        self._forward_lock = threading.Lock()

    # ------------------------------------------------------------- lifecycle
    def register(self, container_id: str) -> None:
        reply = self.conn.register(container_id)
        self.container_id = container_id
        self.host = reply["host"]
        self.max_object = reply["max_object"]

    def close(self) -> None:
        self.owned.close()
        self.reads.close()
        self.gateway.close()
        self.conn.close()

    def require_registered(self) -> None:
        if self.container_id is None:
            raise NotRegistered("call register(container_id) before using objects")

    # ------------------------------------------------------------- what a handle asks
    def mapping(self, key: str) -> Mapping | None:
        """Our mapping of ``key`` while we own it alone (no round trip)."""
        return self.owned.maps.get(key)

    def known_size(self, key: str) -> int | None:
        """``key``'s size as far as our mappings tell (owned or read); ``None``: ask."""
        mapping = self.owned.maps.get(key) or self.reads.get(key)
        return mapping.size if mapping is not None else None

    def size_of(self, key: str) -> int:
        """The object's size, from the minion (or, for an object on another host, the
        directory through the gateway); ``ObjectNotFound`` if there is none."""
        try:
            reply, _ = self.conn.call(Op.USE, key=key)
        except ObjectNotFound:
            if not self._crosses_hosts():
                raise
            reply = self.gateway.call("locate", key=key)
        return int(reply["size"])

    def access(self, key: str, timeout: float | None, populate: bool = False) -> Mapping:
        """Our mapping of ``key`` to write: the one we hold, else the minion's grant — at once
        (``timeout=0``: ``NotOwner`` or ``ObjectShared`` otherwise) or once it comes, from
        this host or another."""
        mapping = self.owned.maps.get(key)
        if mapping is not None:
            return mapping
        if timeout == 0:
            return self._grant(key, populate=populate, wait=False)
        return self._grant_arriving(key, timeout, populate)  # perhaps on its way from a host

    def create(self, key: str, size: int, populate: bool, **fields: Any) -> int:
        """A new object of ours (``Client.create`` checked the arguments); its size."""
        self.require_registered()
        if type(size) is int and size >= 0:
            offer = self.owned.offer(protocol.size_class(size))
            if offer:
                fields["have"] = offer  # the minion reuses one of these if it is free: no fd
        reply, fd = self.conn.call(Op.CREATE, key=key, size=size, **fields)
        self._map(key, reply, fd, populate)
        return int(reply["size"])

    def copy(self, key: str, new_key: str) -> int:
        """A copy of ``key`` as ``new_key``, ours and mapped; its size."""
        reply, fd = self.conn.call(Op.COPY, key=key, new_key=new_key)
        self._map(new_key, reply, fd)
        return int(reply["size"])

    def resize(self, key: str, size: int) -> int:
        return int(self._give_up(key, Op.RESIZE, size=size)["size"])

    def destroy(self, key: str) -> None:
        self._give_up(key, Op.DESTROY)

    def set_recovery(self, key: str, container_id: str) -> None:
        self.conn.call(Op.SET_RECOVERY, key=key, container=container_id)

    def transfer(self, key: str, to: str, detach: bool) -> None:
        """Make ``to`` the owner of ``key``, on this host or (through the gateway) another.
        Once this client has a gateway slot, the minion is told to send the object on to
        ``to``'s host (``via``) if ``to`` is not here: one request where a refusal and a second
        transfer would be two. Nothing is asked of the file system first: whether a gateway
        runs matters only once the minion says ``to`` is not here (a slot implies its link)."""
        via = self.gateway.slot if self.forwarding else None
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
        except UnknownContainer:
            if self.gateway.connected:
                raise  # our slot is there: no host has ``to``
            self.gateway.close()  # the slot is gone too (a gateway restarted): reserve anew
            self._forward(key, to, detach)
            return
        self._sent_on(key, to, reply, via)

    def _sent_on(self, key: str, to: str, reply: dict[str, Any], via: str) -> None:
        """After a ``transfer … via``: the minion either sent the object to ``to``'s host
        itself (its reply names ``to``), or put it in our slot for the gateway to send."""
        if reply.get("to") == via:
            with self._forward_lock:
                self.gateway.call("forward", key=key, to=to, **{"from": self.container_id})

    def share(self, key: str, readers: list[str], live: bool = False) -> list[str]:
        """Grant ``readers`` a share of ``key``; our views are revoked first and our mapping
        kept for the object's return to us alone. Every reader that holds a share now.
        ``live``: our views stay valid and we go on writing (``CDIObject.share``)."""
        self.require_registered()
        if live:
            return self._share_live(key, readers)
        mapping = self.owned.revoke(key)
        try:
            reply, _ = self.conn.call(Op.SHARE, key=key, readers=readers)
        except BaseException:
            if mapping is not None:
                self.owned.install(key, mapping)  # nothing was shared: still ours alone
            raise
        if mapping is not None:
            self.owned.keep(key, mapping)
        return list(reply["readers"])

    def _share_live(self, key: str, readers: list[str]) -> list[str]:
        """A live share: a strict object moves to fresh memory when its first share starts, so
        our mapping of it is closed (``access()`` maps it anew); a cooperative one stays."""
        mapping = self.owned.maps.get(key)
        strict = mapping is not None and not mapping.cacheable
        moved = self.owned.revoke(key) if strict else None  # before the call: BufferInUse
        try:
            reply, _ = self.conn.call(Op.SHARE, key=key, readers=readers, live=True)
        except BaseException:
            if moved is not None:
                self.owned.install(key, moved)  # nothing was shared
            raise
        if moved is not None:
            moved.close(key)
        return list(reply["readers"])

    def read(self, key: str, timeout: float | None) -> Mapping:
        """A mapping to read ``key`` through: ours if we own it, else a share's."""
        self.require_registered()
        mapping = self.owned.maps.get(key)
        return mapping if mapping is not None else self.reads.read(key, timeout)

    def release(self, key: str) -> bool:
        self.require_registered()
        return self.reads.release(key)

    @property
    def spans_hosts(self) -> bool:
        """Whether objects may reach this container from other hosts (``Client.spans_hosts``)."""
        return self.forwarding and self.gateway.present

    # ------------------------------------------------------------- internals
    def _crosses_hosts(self) -> bool:
        return self.spans_hosts

    def _forward(self, key: str, to: str, detach: bool) -> None:
        """Send ``key`` to ``to`` on another host: reserve our gateway slot, then transfer it
        ``via`` the slot; the minion (or the gateway, from the slot) answers once ``to`` owns
        it — or gives it back to us and says why not."""
        with self._forward_lock:
            slot = self.gateway.reserve()
        reply = self._give_up(key, Op.TRANSFER, detach, to=to, via=slot)
        self._sent_on(key, to, reply, slot)

    def _grant_arriving(self, key: str, timeout: float | None, populate: bool) -> Mapping:
        """``access``: our grant of ``key``; if no such key is here but a gateway is, wait for
        it to arrive from another host (``ObjectNotFound`` if no host has it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            since = time.monotonic()
            try:
                if not self._crosses_hosts():
                    return self._grant(key, timeout, populate)
                # The minion itself waits a moment for a key it does not have: the gateway
                # receiving the object creates it there, and the grant follows at once.
                arriving = ARRIVING_S if timeout is None else min(ARRIVING_S, timeout)
                return self._grant(key, timeout, populate, arriving=arriving)
            except ObjectNotFound:
                if not self._crosses_hosts():
                    raise
            wait = 10.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                raise AccessTimeout(f"{key!r} did not arrive from another host before the timeout")
            try:
                self.gateway.await_arrival(key, min(wait, 10.0), since)
            except AccessTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())

    def _grant(
        self, key: str, timeout: float | None = None, populate: bool = False, **args: Any
    ) -> Mapping:
        """Ask for ``key``'s memory (``access``) and map it, reusing our cached mapping when the
        minion says it is of the same segment (then it sends no fd)."""
        have = self.owned.cached_segment(key)
        if have is not None:
            args["have"] = have
        try:
            if args.get("wait") is not False:
                reply, fd = self.conn.call_blocking(Op.ACCESS, timeout, key=key, **args)
            else:
                reply, fd = self.conn.call(Op.ACCESS, key=key, **args)
        except ObjectNotFound:
            self.owned.drop_cached(key)
            raise
        return self._map(key, reply, fd, populate)

    def _map(
        self, key: str, reply: dict[str, Any], fd: int | None, populate: bool = False
    ) -> Mapping:
        """Make the memory of a grant ``key``'s mapping: a cached one if we still map the
        segment (then an fd sent anyway is closed unused), else a new ``mmap`` of ``fd``."""
        mapping = self.owned.reuse(key, reply)
        if mapping is not None:
            if fd is not None:
                os.close(fd)
            return mapping
        if fd is None:
            # We named a cached mapping that another thread evicted meanwhile: we own the
            # object now, so ask for its memory once more without claiming to have it.
            reply, fd = self.conn.call(Op.ACCESS, key=key, wait=False)
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
        self.owned.install(key, mapping)
        return mapping

    def _give_up(self, key: str, op: Op, detach: bool = False, **args: Any) -> dict[str, Any]:
        """Run an operation that ends our ownership: revoke our views (no code of ours can touch
        the bytes any more), send, then unmap — or, after a transfer or destroy of a cooperative
        object whose memory only our uid was ever handed (the minion says ``keep_mapping``),
        keep the mapping for the object's return, or for a later object of ours in the same
        segment: the minion's pool gives that segment to our uid only. Unmapping a large
        object takes time the new owner must not wait for: it happens after the reply."""
        self.reads.drop(key)  # what we read while we had shared it
        mapping = self.owned.revoke(key, detach)
        keep = op is Op.TRANSFER or op is Op.DESTROY
        reply: dict[str, Any] | None = None
        try:
            reply, _ = self.conn.call(op, key=key, **args)
        finally:
            if reply is not None and reply.get("keep_mapping") is False:
                keep = False  # another uid was handed this memory: never map it again
            if mapping is not None:
                if keep:
                    self.owned.keep(key, mapping)
                else:
                    mapping.close(key)
        if not keep:
            self.owned.drop_cached(key)
        return reply
