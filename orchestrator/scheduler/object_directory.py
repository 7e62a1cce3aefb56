"""Where the orphan sweep finds objects: on every host, not only the scheduler's own.

An object a worker of another host kept (its report lost with Redis, a run driven again) lives
on that host's minion, which the scheduler's own minion does not list. The CDI controller's
directory lists every host's objects, to a caller with a ``reader`` token of the cluster
(``CDI_CONTROLLER_URL``, and ``CDI_CONTROLLER_TOKEN`` or ``CDI_CONTROLLER_TOKEN_FILE``). The
sweep takes its own host's objects from its minion (the directory may trail it), and the other
hosts' from the directory, those of hosts whose minion is alive only: a dead minion's entries
stay in the directory, but its objects went with it. Without a token, or while the controller
does not answer, the sweep sees its own host's objects alone, as on a stack of one host.

The same client (``controller_from_env``) tells the scheduler where a silent worker's object is
(``MinionLink.located``): one on the worker's host is not waited for. Without a token it is not
asked at all: every question would be refused, and that step would wait for ever for an answer.
"""

from __future__ import annotations

import logging
import os
from typing import Final

import cdi
from cdi import ObjectKey
from cdi.auth import Role, controller_token
from cdi.controller.client import ControllerClient
from cdi.remote.gateway import GATEWAY_PREFIX
from orchestrator.errors import ConfigError
from orchestrator.scheduler.minion_link import MinionLink

__all__ = ["ObjectDirectory", "Seen", "controller_from_env"]

log = logging.getLogger(__name__)

Seen = tuple[ObjectKey, str]  # an object's key and its owner
# The loop asks it: a slow controller must not hold every run (nor the sweep, housekeeping).
_TIMEOUT_S: Final = 2.0


def controller_from_env() -> ControllerClient | None:
    """The CDI controller's directory when the scheduler was given its URL and a reader's
    token, else None; ``ConfigError`` for a token that is not one (a placeholder)."""
    url = os.environ.get("CDI_CONTROLLER_URL", "").strip()
    try:
        token = controller_token(Role.READER) if url else None
    except cdi.CDIError as exc:
        raise ConfigError(str(exc)) from exc
    if not url or token is None:
        log.info("no CDI controller token: objects are looked for on this host only")
        return None
    return ControllerClient(url, timeout=_TIMEOUT_S, token=token)


class ObjectDirectory:
    """``objects()``: (key, owner) of every object the sweep may free."""

    def __init__(self, link: MinionLink, controller: ControllerClient | None = None) -> None:
        self.link = link
        self.controller = controller
        self._warned = False

    def objects(self) -> list[Seen]:
        """This host's objects from its minion (which the directory may trail), and those of
        every other live host from the directory."""
        here = [
            (ObjectKey(str(o.get("key", ""))), str(o.get("owner", "")))
            for o in self.link.list_objects()
        ]
        if self.controller is None:
            return here
        try:
            return here + self._elsewhere(self.controller)
        except cdi.CDIError as exc:
            if not self._warned:
                log.warning("the CDI controller's directory is out of reach (%s); left objects "
                            "are looked for on this host only meanwhile", exc)  # fmt: skip
                self._warned = True
            return here

    def _elsewhere(self, controller: ControllerClient) -> list[Seen]:
        own = self.link.host
        alive = {m.host for m in controller.list_minions() if m.alive and m.host != own}
        # One in a gateway's hands is in transit between hosts, not left over.
        found = [
            (ObjectKey(o.key), o.owner)
            for o in controller.list_objects()
            if o.host in alive and not o.owner.startswith(GATEWAY_PREFIX)
        ]
        self._warned = False
        return found

    def close(self) -> None:
        if self.controller is not None:
            self.controller.close()
