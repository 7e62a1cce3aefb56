"""Run the CDI controller as a child process (for the stack, demos and tests)."""

from __future__ import annotations

from pathlib import Path

from cdi.auth import ClusterCredentials
from cdi.child import ServiceChild, python_module
from cdi.controller.client import ControllerClient, parse_controller_url
from cdi.errors import CDIError

__all__ = ["ControllerChild"]


class ControllerChild(ServiceChild):
    """``python -m cdi.controller --listen host:port --key-file ...``; ``start()`` returns
    once it answers.

    ``credentials``: the cluster's (``cdi.auth``); default: made in ``credentials/`` beside
    the log. Its minions and readers get their tokens from there (``self.credentials``)."""

    def __init__(
        self, url: str, log_path: str | Path, credentials: ClusterCredentials | None = None
    ) -> None:
        self.url = url
        self.credentials = credentials or ClusterCredentials.ensure(
            Path(log_path).parent / "credentials"
        )
        key_file = str(self.credentials.cluster_key_file)
        super().__init__(
            "CDI controller",
            python_module(
                "cdi.controller", "--listen", parse_controller_url(url), "--key-file", key_file
            ),
            Path(log_path),
            self._answers,
        )

    def client(self, timeout: float = 5.0) -> ControllerClient:
        """A client with the cluster's reader token."""
        return ControllerClient(self.url, timeout=timeout, token=self.credentials.reader_token())

    def _answers(self) -> bool:
        try:
            with self.client(timeout=1.0) as probe:
                probe.list_minions()
        except CDIError:
            return False
        return True
