"""Bidirectional streams: two topics, one each way, between two containers."""

from __future__ import annotations

import time

from cdi import protocol
from cdi.channels.ring import registered
from cdi.channels.subscription import Subscription, subscribe
from cdi.channels.topic import (
    DEFAULT_SLOT_BYTES,
    DEFAULT_SLOTS,
    BackPressure,
    Topic,
    open_topic,
)
from cdi.client import Client
from cdi.errors import AccessTimeout, InvalidArgument, UnknownContainer

__all__ = ["Stream", "open_stream"]

PEER_S = 0.01  # how often open_stream looks again for a peer that has not registered yet


class Stream:
    """One end of a stream: ``send`` to the peer, ``receive`` from it."""

    def __init__(self, outbound: Topic, inbound: Subscription) -> None:
        self.outbound = outbound
        self.inbound = inbound

    def send(self, data: bytes | bytearray | memoryview, timeout: float | None = None) -> int:
        return self.outbound.publish(data, timeout)

    def receive(self, timeout: float | None = None) -> bytes:
        return self.inbound.receive(timeout)

    def close(self) -> None:
        try:
            self.inbound.close()
        finally:
            self.outbound.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_stream(
    client: Client,
    name: str,
    peer: str | int,
    *,
    timeout: float | None = None,
    spin_us: int = 0,
    slots: int = DEFAULT_SLOTS,
    slot_bytes: int = DEFAULT_SLOT_BYTES,
    policy: BackPressure = BackPressure.BLOCK,
) -> Stream:
    """Open stream ``name`` with container ``peer``, which calls ``open_stream(client, name,
    <our id>)`` on its side: each end writes a topic ``name.<its id>`` that only the other end
    may read. Returns once the peer has joined both ways, so nothing sent after that is lost to
    it; waits up to ``timeout`` seconds for the peer (``AccessTimeout``)."""
    registered(client)
    me = str(client.container_id)
    other = protocol.check_container_id(peer)
    if other == me:
        raise InvalidArgument("a stream joins two different containers")
    deadline = None if timeout is None else time.monotonic() + timeout
    outbound = open_topic(client, f"{name}.{me}", slots=slots, slot_bytes=slot_bytes, policy=policy)
    try:
        while True:
            try:
                outbound.grant([other])
                break
            except UnknownContainer:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                time.sleep(PEER_S)
        inbound = subscribe(client, f"{name}.{other}", timeout=_left(deadline), spin_us=spin_us)
    except BaseException:
        outbound.close(linger=0)
        raise
    try:
        # The peer joins our topic only after its own grant: until it has, what we send would
        # be published before it joined, and lost to it.
        outbound.wait_for_reader(other, timeout=_left(deadline))
    except BaseException as exc:
        Stream(outbound, inbound).close()
        if isinstance(exc, TimeoutError):
            raise AccessTimeout(f"{other} did not join stream {name!r} within the timeout") from exc
        raise
    return Stream(outbound, inbound)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
