"""Frames as CDI objects: the paper's version, with objects sized to the frame.

The extractor creates a ring of ``detectors * depth`` objects of exactly one frame message
each (variable-sized objects: no 10 MB object for a 2.8 MB frame) and owns them. Object ``i``
serves detector ``i % N`` only, so a detector maps at most ``depth`` objects, and frame
``seq`` lives in object ``seq % ring``. For each frame the extractor ``access``es the object
(waiting until it is back), decodes into it and transfers it to its detector; the detector
draws in place and transfers it to the combinator; the combinator encodes from it and
transfers it back to the extractor for reuse. No byte of a frame is copied between roles.

Roles find each other by name: container ids and keys derive from ``config.run_id``, so
there is nothing to connect. Each role talks to the minion ``config.minion_for`` names: one
for all on one host (``cdi-shm``). ``cdi-rpc`` is this same code with the roles on two hosts
(``placement``), each on its host's minion: a transfer to a container of the other host goes
through the two minions' gateways, which carry the bytes over TCP into a new object there,
and the receiver's ``access`` returns once every byte has landed. The objects' creator
(the extractor) is their recovery container: a role that dies hands its objects back, and
the others time out.

Options (``config.options``): ``cache`` — ``"1"`` (default) lets a detector keep its
mappings of the objects it hands on, so an object coming back is not mapped again (it maps
its ``depth`` objects); ``"0"`` maps each object on every access and unmaps it on every
transfer (one frame mapped at a time, at the price of mapping it each time). ``spin_us`` —
how long a role polls in ``access()`` before it sleeps (default ``"0"``): every role here
waits milliseconds for its next frame, and on a small machine a poller takes the core a
detector needs; the client's own default (200 µs) is for hand-offs measured in microseconds.
"""

from __future__ import annotations

import cdi
from apps.ar.config import RunConfig
from apps.ar.errors import BadRunConfig
from apps.ar.links import Backend, Peers

__all__ = [
    "BACKEND",
    "CROSS_HOST_BACKEND",
    "combinator_id",
    "detector_id",
    "extractor_id",
    "object_key",
]


def extractor_id(config: RunConfig) -> str:
    return f"{config.run_id}-extractor"


def detector_id(config: RunConfig, index: int) -> str:
    return f"{config.run_id}-detector-{index}"


def combinator_id(config: RunConfig) -> str:
    return f"{config.run_id}-combinator"


def object_key(config: RunConfig, index: int) -> cdi.ObjectKey:
    return cdi.ObjectKey(f"{config.run_id}-frame-{index}")


def _detector_cache_bytes(config: RunConfig) -> int | None:
    choice = config.options.get("cache", "1")
    if choice not in ("0", "1"):
        raise BadRunConfig(f"{config.backend} option cache must be 0 or 1, got {choice!r}")
    return None if choice == "1" else 0  # None: the client's default budget


def _spin_us(config: RunConfig) -> int:
    text = config.options.get("spin_us", "0")
    if not text.isdigit():
        raise BadRunConfig(f"{config.backend} option spin_us must be a whole number, got {text!r}")
    return int(text)


def _connect(
    config: RunConfig, container: str, minion: str, cache_bytes: int | None = None
) -> cdi.Client:
    if not minion:
        raise BadRunConfig("a CDI backend needs a minion socket (RunConfig.minion)")
    return cdi.connect(minion, container, spin_us=_spin_us(config), cache_bytes=cache_bytes)


class _Extractor:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.address = ""
        self._client = _connect(config, extractor_id(config), config.minion_for("extractor"))
        self._ring: list[cdi.CDIObject] = []
        try:
            for i in range(config.ring):
                # zeroed=False: every frame overwrites header and pixels; the box area beyond
                # a frame's box count is never read.
                self._ring.append(
                    self._client.create(object_key(config, i), config.message_size, zeroed=False)
                )
        except BaseException:
            self.close()
            raise
        self._view: memoryview | None = None

    def connect(self, peers: Peers) -> None:
        """Detectors and combinator find the ring by its keys."""

    def slot(self, seq: int) -> memoryview:
        self._view = self._ring[seq % len(self._ring)].access(timeout=self.config.timeout_s)
        return self._view

    def send(self, seq: int) -> None:
        assert self._view is not None
        self._view.release()
        self._view = None
        target = detector_id(self.config, self.config.detector_of(seq))
        self._ring[seq % len(self._ring)].transfer(target)

    def close(self) -> None:
        """Wait for every object to come back, then free the ring."""
        try:
            for obj in self._ring:
                obj.access(timeout=self.config.timeout_s).release()
                obj.destroy()
        finally:
            self._client.close()  # objects still out go to us by recovery, then are reclaimed


class _Detector:
    def __init__(self, config: RunConfig, index: int) -> None:
        self.config = config
        self.address = ""
        self._client = _connect(
            config,
            detector_id(config, index),
            config.minion_for("detector", index),
            _detector_cache_bytes(config),
        )
        self._mine = [
            self._client.use(object_key(config, i), check=False)
            for i in range(index, config.ring, config.detectors)
        ]
        self._turn = 0
        self._view: memoryview | None = None
        self._to = combinator_id(config)

    def connect(self, peers: Peers) -> None:
        """Nothing to reach: the extractor transfers our objects to us."""

    def receive(self) -> memoryview:
        obj = self._mine[self._turn % len(self._mine)]
        # populate: a new mapping gets every page in one call; detection reads them all.
        self._view = obj.access(timeout=self.config.timeout_s, populate=True)
        return self._view

    def forward(self) -> None:
        assert self._view is not None
        self._view.release()
        self._view = None
        self._mine[self._turn % len(self._mine)].transfer(self._to)
        self._turn += 1

    def close(self) -> None:
        self._client.close()


class _Combinator:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.address = ""
        self._client = _connect(config, combinator_id(config), config.minion_for("combinator"))
        self._ring = [
            self._client.use(object_key(config, i), check=False) for i in range(config.ring)
        ]
        self._view: memoryview | None = None
        self._to = extractor_id(config)

    def connect(self, peers: Peers) -> None:
        """Nothing to reach: detectors transfer frames to us."""

    def receive(self, seq: int) -> memoryview:
        obj = self._ring[seq % len(self._ring)]
        self._view = obj.access(timeout=self.config.timeout_s, populate=True)  # encoded whole
        return self._view

    def release(self, seq: int) -> None:
        assert self._view is not None
        self._view.release()
        self._view = None
        self._ring[seq % len(self._ring)].transfer(self._to)

    def close(self) -> None:
        self._client.close()


BACKEND = Backend("cdi-shm", _Extractor, _Detector, _Combinator, needs_minion=True, hosts=(1,))
CROSS_HOST_BACKEND = Backend(
    "cdi-rpc", _Extractor, _Detector, _Combinator, needs_minion=True, hosts=(2,)
)
