"""Run the CDI controller as a child process (for the stack, demos and tests)."""

from __future__ import annotations

from cdi.child import ChildProcess, python_module
from cdi.controller.client import ControllerClient, parse_controller_url
from cdi.errors import CDIError

__all__ = ["ControllerChild"]


class ControllerChild(ChildProcess):
    """``python -m cdi.controller --listen host:port``; ``start()`` returns once it answers."""

    def __init__(self, url: str, log_path: str) -> None:
        self.url = url
        super().__init__(
            python_module("cdi.controller", "--listen", parse_controller_url(url)),
            log_path,
            self._answers,
            "CDI controller",
        )

    def _answers(self) -> bool:
        try:
            with ControllerClient(self.url, timeout=1.0) as probe:
                probe.list_minions()
        except CDIError:
            return False
        return True

    def __enter__(self) -> ControllerChild:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
