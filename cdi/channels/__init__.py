"""Channels: pub/sub topics and bidirectional streams over shared-memory rings.

    topic = cdi.channels.open_topic(client, "frames", readers=["detector"])
    topic.publish(b"...")                     # one writer

    sub = cdi.channels.subscribe(client, "frames")   # in the detector
    data = sub.receive()

A topic's ring is a CDI object (a memfd) its writer shares *live* with the containers it
grants: only they can map it, and only read-only. See *Channels* in
``docs/architecture.md``.
"""

from cdi.channels.stream import Stream, open_stream
from cdi.channels.subscription import Subscription, subscribe
from cdi.channels.topic import BackPressure, Topic, open_topic

__all__ = [
    "BackPressure",
    "Stream",
    "Subscription",
    "Topic",
    "open_stream",
    "open_topic",
    "subscribe",
]
