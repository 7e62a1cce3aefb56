"""Where the orchestrator's processes listen: an address checked before anything binds it.

Every listener of a stack is on loopback unless configured: the API's ``--host`` and a worker's
``--metrics-host`` (``CDIFLOW_WORKER_METRICS_HOST``) default to ``127.0.0.1``. docs/security.md
lists every listener with who may reach it.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Final

import click

__all__ = ["LOOPBACK", "BindAddress", "check_bind_address"]

LOOPBACK: Final = "127.0.0.1"


def check_bind_address(value: str) -> str:
    """``value`` if a server can bind it: an IPv4 or IPv6 address (``[::1]`` too) or
    ``localhost``; ``ValueError`` saying what to write otherwise."""
    text = value.strip()
    if text == "localhost":
        return text
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        raise ValueError(
            f"{value!r} is not an address to listen on; write an IP address such as "
            f"{LOOPBACK} (this machine only) or 0.0.0.0 (every interface)"
        ) from None
    return text.strip("[]") if ":" in text else text


class BindAddress(click.ParamType[str]):
    """A click option holding an address to listen on (``check_bind_address``)."""

    name = "address"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_bind_address(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
