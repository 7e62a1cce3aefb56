"""The HTTP server the API runs in: uvicorn's, with its housekeeping tick once a second
instead of ten times.

uvicorn's ``Server.main_loop`` sleeps 0.1 s between housekeeping ticks (a fresh ``Date``
header once a second, a look at ``should_exit``); those wake-ups are most of an idle API's CPU
(``cdiflow bench idle``). Here the tick is 1 s, every tick refreshes the header, and the exit
signal wakes the loop at once, so the server still stops without delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from types import FrameType
from typing import Any, Final

import uvicorn

__all__ = ["TICK_S", "ApiServer", "serve"]

TICK_S: Final = 1.0
_STARTUP_FAILURE: Final = 3  # uvicorn.run's exit status when the server could not start
_DATE_EVERY: Final = 10  # on_tick refreshes the Date header when its counter is a multiple


class ApiServer(uvicorn.Server):
    """uvicorn's server with a one-second housekeeping tick that the exit signal cuts short."""

    _loop: asyncio.AbstractEventLoop | None = None
    _woken: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._woken = asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + _DATE_EVERY) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), TICK_S)
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._woken is not None:
            self._loop.call_soon_threadsafe(self._woken.set)


def serve(app: Any, **config: Any) -> None:
    """``uvicorn.run(app, **config)`` with ``ApiServer``."""
    server = ApiServer(uvicorn.Config(app, **config))
    server.run()
    if not server.started:
        sys.exit(_STARTUP_FAILURE)
