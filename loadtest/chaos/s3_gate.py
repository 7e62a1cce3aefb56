"""The S3 endpoint as a chaos stack reaches it: through ``loadtest.netem_proxy`` on a port of
its own, which a fault takes down (connections refused, as from an endpoint that is not
running) or slows (every request answered a set time late), and opens again.

    with S3Gate(services.s3_endpoint_url) as gate:   # open: no delay added
        Stack(..., services=replace(services, s3_endpoint_url=gate.url))
        gate.down(); ...; gate.slow(1.0); ...; gate.open()

Each change stops the proxy and starts it again on the same port, so connections open at that
moment are reset, as a restarted or failed-over endpoint would do to them.
"""

from __future__ import annotations

from types import TracebackType
from typing import Final, Self

from loadtest.netem_proxy import LinkSpec, NetemProxy
from orchestrator.child_process import free_port

__all__ = ["S3Gate"]

_UNCAPPED: Final = 10e9  # bytes/s: the proxy adds no bandwidth limit of its own


class S3Gate:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.port = free_port()
        self._proxy: NetemProxy | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        """Requests pass at once."""
        self._run(LinkSpec(rtt_s=0.0, bytes_per_s=_UNCAPPED))

    def slow(self, per_request_s: float) -> None:
        """Each request and its answer take ``per_request_s`` longer (half each way)."""
        self._run(LinkSpec(rtt_s=per_request_s, bytes_per_s=_UNCAPPED))

    def down(self) -> None:
        """Nothing listens: every connection is refused."""
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.stop()

    def _run(self, link: LinkSpec) -> None:
        self.down()
        proxy = NetemProxy(self.endpoint, link, port=self.port)
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
