"""What one run of the AR application is: its video, backend, detectors, ring, and where each
role runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.ar.errors import BadRunConfig
from cdi.hosts import Host
from workflows.ar import framebuf

__all__ = ["LOOPBACK", "MAX_DETECTORS", "RunConfig", "Site"]

MAX_DETECTORS = 16
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Site:
    """Where one role runs: a host, and the CDI minion it talks to there."""

    host: Host | None = None
    """``None``: the launcher's own host, whose servers listen on loopback."""
    minion: str = ""
    """The socket of the minion on ``host`` (``""``: ``RunConfig.minion``)."""

    @property
    def address(self) -> str:
        """The address the role's servers listen on (TCP, REST, gRPC): its host's own, so a
        frame to a role on another host crosses the link between them."""
        return self.host.address if self.host is not None else LOOPBACK


@dataclass(frozen=True)
class RunConfig:
    """One run; every role process gets a copy."""

    backend: str
    video: str
    """The input video's path."""
    width: int
    height: int
    detectors: int = 5
    output: str | None = None
    """Where the combinator writes the labelled video; ``None`` encodes and discards it."""
    depth: int = 2
    """Frames a detector may have in hand: sent by the extractor, not yet passed on. The CDI
    ring has ``detectors * depth`` objects; the other backends hold the extractor back as
    far, so every version has as many frames in flight and its latency compares. 2 keeps a
    detector busy while its previous frame travels on: with 1 it waits for the combinator
    and the extractor every frame, as in the paper's code."""
    frames: int | None = None
    """Stop after this many frames (``None``: the whole video)."""
    minion: str = ""
    """The CDI minion's socket where every role runs on one host (``cdi-shm``)."""
    placement: dict[str, Site] = field(default_factory=dict)
    """Where roles run when they run on several hosts: ``"extractor"``, ``"combinator"``,
    ``"detector"`` (all detectors) or ``"detector-K"`` to a ``Site``; a role not named runs
    on the launcher's host with ``minion``. The application code is the same on every host:
    TCP, REST and gRPC listen on the site's address, and CDI hands an object to a container
    of another host through the minions' gateways (CDI-RPC)."""
    run_id: str = "ar"
    """Prefix of container ids and object keys, unique per run on a minion."""
    timeout_s: float = 60.0
    """How long a role waits for its next frame before it gives up."""
    detect_width: int = 640
    options: dict[str, str] = field(default_factory=dict)
    """Backend-specific settings (strings), e.g. ``{"cache": "0"}`` for ``cdi-shm``."""

    def __post_init__(self) -> None:
        if not 1 <= self.detectors <= MAX_DETECTORS:
            raise BadRunConfig(f"detectors must be 1 to {MAX_DETECTORS}, got {self.detectors}")
        if not 1 <= self.depth <= 8:
            raise BadRunConfig(
                f"depth (frames in flight per detector) must be 1 to 8, got {self.depth}"
            )
        if self.width < 64 or self.height < 128:
            raise BadRunConfig(
                f"a {self.width}x{self.height} video is too small for the people detector "
                "(64x128 at least)"
            )
        if self.frames is not None and self.frames < 1:
            raise BadRunConfig(f"frames must be at least 1, got {self.frames}")

    @property
    def message_size(self) -> int:
        """Bytes of one frame message (and of one CDI object of the ring)."""
        return framebuf.message_size(self.width, self.height)

    @property
    def ring(self) -> int:
        """Frames in flight at most: CDI objects in the ring, queue slots elsewhere."""
        return self.detectors * self.depth

    def site(self, role: str, index: int = 0) -> Site:
        """Where the role ``role`` (detector ``index``) runs."""
        return self.placement.get(f"{role}-{index}", self.placement.get(role, Site()))

    def minion_for(self, role: str, index: int = 0) -> str:
        """The minion socket the role ``role`` (detector ``index``) talks to."""
        return self.site(role, index).minion or self.minion

    def address_for(self, role: str, index: int = 0) -> str:
        """The address the role ``role`` (detector ``index``) listens on."""
        return self.site(role, index).address

    @property
    def hosts(self) -> int:
        """How many hosts the roles run on."""
        roles = [("extractor", 0), ("combinator", 0)]
        roles += [("detector", k) for k in range(self.detectors)]
        return len({self.site(role, k).host for role, k in roles})

    def detector_of(self, seq: int) -> int:
        """Frames go round the detectors in turn: frame ``seq`` to detector ``seq % N``."""
        return seq % self.detectors
