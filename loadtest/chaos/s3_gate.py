"""The S3 endpoint as a chaos stack reaches it: through a ``cdi.link_emulator.LinkProxy`` on a
port of its own, which a fault takes down (connections refused, as from an endpoint that is not
running) or slows (every request answered a set time late), and opens again.

    with S3Gate(services.s3_endpoint_url, folder) as gate:   # open: no delay added
        Stack(..., services=replace(services, s3_endpoint_url=gate.url))
        gate.down(); ...; gate.slow(1.0); ...; gate.open()

Each change stops the proxy and starts it again on the same port, so connections open at that
moment are reset, as a restarted or failed-over endpoint would do to them.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Final, Self

from cdi.link_emulator import Link, LinkProxy
from orchestrator.child_process import free_port

__all__ = ["S3Gate"]

_UNCAPPED: Final = 80_000.0  # Mbit/s: the proxy adds no bandwidth limit of its own


class S3Gate:
    """``folder``: where the proxy keeps its log and port file."""

    def __init__(self, endpoint: str, folder: Path) -> None:
        self.endpoint = endpoint
        self.folder = folder
        self.port = free_port()
        self._proxy: LinkProxy | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        """Requests pass at once."""
        self._run(Link(mbit=_UNCAPPED, rtt_ms=0.0))

    def slow(self, per_request_s: float) -> None:
        """Each request and its answer take ``per_request_s`` longer (half each way)."""
        self._run(Link(mbit=_UNCAPPED, rtt_ms=per_request_s * 1000))

    def down(self) -> None:
        """Nothing listens: every connection is refused."""
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.stop()

    def _run(self, link: Link) -> None:
        self.down()
        proxy = LinkProxy(self.endpoint, link, self.folder, port=self.port)
        proxy.start()
        self._proxy = proxy

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()
