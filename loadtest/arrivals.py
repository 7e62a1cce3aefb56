"""When the load drivers that are not locust (the floor, Ray's, Temporal's) start a workflow.

A closed loop: ``users`` users each start ``each`` workflows, the next when the last ended, so
at most ``users`` are in flight. An open loop (``rate`` > 0): one user starts ``each``
workflows ``1 / rate`` seconds apart, whatever the system's pace. Users draw their images
as locust's users do (``random.Random(seed * 100_003 + user)``), so every system gets the
same sequence.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

__all__ = ["Arrivals"]


class Arrivals:
    def __init__(self, users: int, each: int, rate: float, seed: int) -> None:
        self.rate = rate
        self.rngs = [random.Random(seed * 100_003 + i) for i in range(users)]
        self.left = dict.fromkeys(range(users), each)
        self.began = time.time()
        self.started = 0

    @property
    def open_loop(self) -> bool:
        return self.rate > 0

    def initial(self) -> list[int]:
        """The users who start a workflow at once (the closed loop's: every one)."""
        return [] if self.open_loop else [u for u, n in self.left.items() if n > 0]

    def take(self, user: int) -> random.Random:
        """Count a start by ``user``; the generator its image is drawn with."""
        self.left[user] -= 1
        self.started += 1
        return self.rngs[user]

    def again(self, user: int) -> bool:
        """Whether ``user``, whose workflow just ended, starts another now (closed loop)."""
        return not self.open_loop and self.left[user] > 0

    def due_in(self) -> float | None:
        """Open loop: seconds until the next start is due (<= 0: now); None when there is no
        start to wait for (every one made, or the closed loop)."""
        if not self.open_loop or self.left[0] <= 0:
            return None
        return self.began + self.started / self.rate - time.time()

    def drive(
        self,
        submit: Callable[[int], None],
        busy: Callable[[], bool],
        wait: Callable[[float | None], None],
    ) -> None:
        """Start every workflow when due and return once all have ended: ``submit(user)``
        starts one; ``busy()`` says whether any is in flight; ``wait(timeout)`` waits for
        ends (at most ``timeout`` s, None: until one ends) and handles them, calling
        ``submit`` for each user ``again`` names."""
        for user in self.initial():
            submit(user)
        while busy() or self.due_in() is not None:
            due = self.due_in()
            if due is not None and due <= 0:
                submit(0)
            elif not busy():
                time.sleep(due or 0.0)
            else:
                wait(due)
