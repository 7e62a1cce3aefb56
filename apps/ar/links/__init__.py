"""How frames move between the roles: one small contract, one module per backend.

A backend gives each role an *end* of the pipeline:

* the extractor's: ``slot(seq)`` a writable frame message for frame ``seq`` (it may wait
  until one is free), ``send(seq)`` hands it to detector ``seq % N``;
* a detector's: ``receive()`` its next message (writable: it draws on it), ``forward()``
  hands that message on to the combinator;
* the combinator's: ``receive(seq)`` frame ``seq``, in order; ``release(seq)`` says it is
  done with it (CDI: the object goes back to the extractor for reuse).

Every end is opened in two steps, because servers must listen before clients connect:
``open_*`` prepares (listens, registers with the minion, creates the ring) and tells its
``address``; ``connect(peers)`` then reaches the others. ``close()`` ends it (the extractor's
waits for every object to come back, then frees them). Views returned by ``slot`` and
``receive`` are valid until the next ``send``/``forward``/``release``; a caller drops every
NumPy array over them first.

``BACKENDS`` maps each name to its module's ``Backend``. ``cdi-shm`` and ``cdi-rpc`` are the
same code: CDI objects between roles on one host, or on two (``RunConfig.placement``), where
the runtime hands an object to another host's container through the minions' gateways.
TCP, REST and gRPC run on one host or across hosts alike, listening on each role's address.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from apps.ar.config import RunConfig
from apps.ar.errors import BackendUnavailable

__all__ = [
    "BACKENDS",
    "CROSS_HOST_BACKENDS",
    "DEFAULT_BACKENDS",
    "Backend",
    "CombinatorEnd",
    "DetectorEnd",
    "ExtractorEnd",
    "Peers",
    "backend",
    "backends_for",
]


@dataclass(frozen=True)
class Peers:
    """Where the other roles listen (addresses as each backend writes them)."""

    detectors: list[str]
    combinator: str


class _End(Protocol):
    address: str

    def connect(self, peers: Peers) -> None: ...

    def close(self) -> None: ...


class ExtractorEnd(_End, Protocol):
    def slot(self, seq: int) -> memoryview: ...

    def send(self, seq: int) -> None: ...


class DetectorEnd(_End, Protocol):
    def receive(self) -> memoryview: ...

    def forward(self) -> None: ...


class CombinatorEnd(_End, Protocol):
    def receive(self, seq: int) -> memoryview: ...

    def release(self, seq: int) -> None: ...


@dataclass(frozen=True)
class Backend:
    name: str
    open_extractor: Callable[[RunConfig], ExtractorEnd]
    open_detector: Callable[[RunConfig, int], DetectorEnd]
    open_combinator: Callable[[RunConfig], CombinatorEnd]
    needs_minion: bool = False
    hosts: tuple[int, ...] = (1, 2)
    """How many hosts its roles may run on."""


def _load(name: str) -> Backend:
    if name == "tcp":
        from apps.ar.links import tcp

        return tcp.BACKEND
    if name == "rest":
        from apps.ar.links import rest

        return rest.BACKEND
    if name == "grpc":
        from apps.ar.links import grpc_link

        return grpc_link.BACKEND
    if name == "cdi-shm":
        from apps.ar.links import cdi_link

        return cdi_link.BACKEND
    if name == "cdi-rpc":
        from apps.ar.links import cdi_link

        return cdi_link.CROSS_HOST_BACKEND
    raise BackendUnavailable(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")


BACKENDS = ("tcp", "rest", "grpc", "cdi-shm", "cdi-rpc")
DEFAULT_BACKENDS = ("tcp", "rest", "grpc", "cdi-shm")
CROSS_HOST_BACKENDS = ("tcp", "rest", "grpc", "cdi-rpc")


def backend(name: str, hosts: int | None = None) -> Backend:
    """The backend called ``name``; ``BackendUnavailable`` says why one cannot run (on
    ``hosts`` hosts, when given)."""
    found = _load(name)
    if hosts is not None and hosts not in found.hosts:
        if found.hosts == (2,):
            raise BackendUnavailable(f"{name} moves frames between hosts: run it with --hosts 2")
        raise BackendUnavailable(
            f"{name} moves frames on one host only; between hosts use "
            f"{', '.join(CROSS_HOST_BACKENDS)}"
        )
    return found


def backends_for(hosts: int) -> tuple[str, ...]:
    """The backends that run on ``hosts`` hosts, in the order of the comparison."""
    return DEFAULT_BACKENDS if hosts == 1 else CROSS_HOST_BACKENDS
