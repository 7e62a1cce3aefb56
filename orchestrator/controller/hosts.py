"""Answer only to the host names the operator configured (``CDIFLOW_ALLOWED_HOSTS``).

A page on ``evil.example`` whose DNS name is rebound to 127.0.0.1 makes the victim's browser
send requests to the API with ``Host: evil.example``; refusing unknown hosts (400) keeps such a
page from reading the dashboard or the API through the browser. Pure ASGI, in front of
everything else. *Why not Starlette's ``TrustedHostMiddleware``:* it answers in plain text;
this one answers with the API's JSON error body, naming the setting to change.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.controller.http_errors import error_response
from orchestrator.errors import BadHost

__all__ = ["AllowedHosts", "host_of"]


def host_of(header: str) -> str:
    """The host part of a Host header, lower-case, without port or IPv6 brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


class AllowedHosts:
    """ASGI middleware answering 400 to requests for any host but ``hosts``.

    ``"*"`` allows every host; ``"*.example.com"`` allows the subdomains of ``example.com``.
    """

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        names = {h.lower().rstrip(".") for h in hosts}
        self.any = "*" in names
        self.exact = {n for n in names if not n.startswith("*.")}
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))

    def allows(self, host: str) -> bool:
        host = host.rstrip(".")
        return self.any or host in self.exact or (bool(host) and host.endswith(self.suffixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.any:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if self.allows(host_of(header)):
            await self.app(scope, receive, send)
            return
        shown = header[:100] if header.isprintable() else repr(header[:100])
        message = (
            f"this server does not answer to the host {shown!r}; use one it is configured for, "
            "or add the name to CDIFLOW_ALLOWED_HOSTS (comma-separated) and restart the API"
        )
        await error_response(BadHost(message))(scope, receive, send)
