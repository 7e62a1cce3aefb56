"""Where to find a minion: ``CDI_URL`` and friends.

``unix:///run/cdi/minion.sock`` (or a bare absolute path) selects the shared-memory backend through
the local minion. Other schemes are for cross-host backends and are refused here with a clear error.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from cdi.errors import ConfigError

__all__ = ["default_socket_path", "gateway_socket_path", "resolve_socket_path"]


def default_socket_path() -> str:
    """``$CDI_SOCKET``, else ``/run/cdi/minion.sock`` for root, else a per-user path in /tmp."""
    if path := os.environ.get("CDI_SOCKET"):
        return path
    if os.geteuid() == 0:
        return "/run/cdi/minion.sock"
    return f"/tmp/cdi-{os.geteuid()}/minion.sock"


def resolve_socket_path(url: str | None = None) -> str:
    """Turn a CDI URL (or ``$CDI_URL``, or the default) into a minion socket path."""
    url = url or os.environ.get("CDI_URL")
    if not url:
        return default_socket_path()
    if url.startswith("/"):
        return url
    parts = urlsplit(url)
    if parts.scheme != "unix":
        raise ConfigError(
            f"CDI URL {url!r}: a client talks to its local minion, so use unix:///path/to/minion.sock"
        )
    path = (parts.netloc + parts.path) if parts.netloc else parts.path
    if not path.startswith("/"):
        raise ConfigError(f"CDI URL {url!r} must name an absolute socket path")
    return path


def gateway_socket_path(minion_socket: str) -> str:
    """The Unix socket of the host's gateway: beside the minion's, in the directory pods mount."""
    return f"{minion_socket}.gateway"
