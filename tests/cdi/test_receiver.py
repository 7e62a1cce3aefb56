"""The client's message receiver: one reused buffer of ``MAX_MESSAGE`` bytes per connection,
resident only where messages reach (every CDI client holds one or two)."""

from __future__ import annotations

import socket

import psutil

from cdi.protocol import MAX_MESSAGE, Receiver, pack


def test_a_receivers_buffer_is_resident_only_where_messages_reach() -> None:
    before = psutil.Process().memory_info().rss
    receivers = [Receiver() for _ in range(16)]  # 16 buffers of MAX_MESSAGE
    grown = psutil.Process().memory_info().rss - before
    assert grown < 4 * MAX_MESSAGE, f"{grown} bytes resident for 16 idle receivers"

    ours, theirs = socket.socketpair()
    with ours, theirs:
        message = {"op": "access", "key": "k" * 1000}
        for receiver in receivers[:2]:
            theirs.sendall(pack(message))
            assert receiver.receive(ours) == (message, None)
        theirs.close()
        assert receivers[2].receive(ours) == (None, None)  # the peer hung up
