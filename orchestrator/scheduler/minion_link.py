"""The scheduler's connection to its host's CDI minion, made again when the minion restarts.

A minion with a state folder that restarts keeps its objects, and the client rides the restart
out on its own (docs/minion-restart.md). One that comes back empty has lost every object: the
client reports the minion gone, ``epoch`` counts the connections made, so the scheduler knows
when that happened and drives the workflows whose images were there again from their input in
S3 (``redrive.Redrive.minion_restarted``).
With the CDI controller's ``directory``, ``located`` says which host has an object (a silent
worker's, which the scheduler does not wait for when it is on the worker's host).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import cdi
from cdi.controller.client import ControllerClient

__all__ = ["MinionLink"]

log = logging.getLogger(__name__)


class MinionLink:
    """``use`` like a ``cdi.Client``; ``check`` notices a restarted minion and reconnects."""

    def __init__(
        self,
        url: str | None,
        container_id: str,
        *,
        connect: Callable[[str | None, str], cdi.Client] = cdi.connect,
        directory: ControllerClient | None = None,
    ) -> None:
        self._url = url
        self._id = container_id
        self._connect = connect
        self._directory = directory
        self._client: cdi.Client | None = connect(url, container_id)
        self.epoch = 1

    def use(self, key: str, *, check: bool = True) -> cdi.CDIObject:
        return self._live().use(key, check=check)

    def list_objects(self) -> list[dict[str, Any]]:
        return self._live().list_objects()

    def located(self, key: str) -> str | None:
        """The host the directory places ``key`` on (one question to the controller, with no
        wait for it to catch up), or ``None``: no directory, or no host has it."""
        found = self.whereabouts(key)
        return found[0] if found is not None else None

    def whereabouts(self, key: str) -> tuple[str, str] | None:
        """The host and owner the directory gives ``key``, or ``None``: no directory, or no
        host has it."""
        if self._directory is None:
            return None
        try:
            info = self._directory.lookup_object(key)
        except cdi.ObjectNotFound:
            return None
        return info.host, info.owner

    @property
    def spans_hosts(self) -> bool:
        """Whether objects may come to us from other hosts (``cdi.Client.spans_hosts``)."""
        return self._client is not None and self._client.spans_hosts

    @property
    def host(self) -> str:
        """The CDI host of our minion ("" while it is away)."""
        return (self._client.host or "") if self._client is not None else ""

    def check(self) -> bool:
        """Ask the minion whether it is there; reconnect if it went away. True when a new
        connection was made (the objects of earlier ones are gone). ``cdi.MinionUnavailable``
        while no minion answers yet."""
        if self._client is not None:
            try:
                self._client.stat()
                return False
            except cdi.MinionUnavailable as exc:
                log.warning("lost the CDI minion (%s); connecting again", exc)
                self._drop()
        self._client = self._connect(self._url, self._id)
        self.epoch += 1
        log.warning("connected to the CDI minion again (epoch %d): its objects are gone",
                    self.epoch)  # fmt: skip
        return True

    def close(self) -> None:
        self._drop()  # the directory is its giver's to close (``ObjectDirectory``'s)

    def _live(self) -> cdi.Client:
        if self._client is None:
            raise cdi.MinionUnavailable("the CDI minion went away; waiting for it to come back")
        return self._client

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(cdi.CDIError, OSError):
                client.close()
