"""A burst: thousands of workflows started at once, every one followed to its end.

``clients`` connections (one ``cdiflow.client.AsyncClient`` each, as that many users would
have) start ``workflows`` runs between them as fast as the API takes them. Where it cannot take
more it answers 429 with ``Retry-After`` and the client sends the start again after it; every
answer the API gave is counted as it came (``answers``). The goal: no 5xx at all, every start
taken in the end, and every run completed with the right result (0 stuck, 0 lost, 0 wrong).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from cdiflow.client import APIError, AsyncClient, TooManyRequests, TransportError
from loadtest.chaos.checks import all_running
from loadtest.chaos.faults import Target
from loadtest.chaos.judge import Tally, judge
from loadtest.chaos.workload import Planned, Started, Workload

__all__ = ["BurstResult", "run_burst"]


@dataclass(kw_only=True)
class BurstResult(Tally):
    workflows: int
    clients: int
    answers: dict[str, int]  # every answer to a start, by HTTP status ("no answer": none)
    accepted_s: float  # from the first start sent to the last one taken
    drained_s: float | None  # from the first start to the last run ended; None: not all did
    duration_s: float
    problems: list[str] = field(default_factory=list)
    fault: str = "burst"
    target: str = "embedded"

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.answers.items() if status.startswith("5"))

    @property
    def passed(self) -> bool:
        return (
            self.server_errors == 0
            and self.ended_right
            and self.completed == self.workflows
            and not self.problems
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed, "server_errors": self.server_errors}


class _Counted(httpx.AsyncBaseTransport):
    """A transport that counts every answer by status before the client sees it."""

    def __init__(self, inner: httpx.AsyncBaseTransport, answers: collections.Counter[str]):
        self.inner, self.answers = inner, answers

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError:
            self.answers["no answer"] += 1
            raise
        self.answers[str(response.status_code)] += 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def run_burst(
    target: Target, *, workflows: int = 5000, clients: int = 1000, deadline_s: float = 3600.0
) -> BurstResult:
    """Start ``workflows`` runs from ``clients`` connections at once; judge every one."""
    began = time.monotonic()
    since = time.time()
    load = Workload(target.stack)
    answers: collections.Counter[str] = collections.Counter()
    try:
        plans = [load.next_run() for _ in range(workflows)]
        runs = asyncio.run(_start_all(target, plans, clients, answers))
        accepted_s = time.monotonic() - began
        tally = judge(load, runs, target, since=since, deadline_s=deadline_s)
        ends = [r.finished_at for r in runs.values() if r.finished_at is not None]
        drained = max(ends) - since if len(ends) == len(runs) else None
        problems = all_running(target)
    finally:
        load.close()
    return BurstResult(
        **vars(tally),
        workflows=workflows,
        clients=clients,
        answers=dict(answers),
        accepted_s=round(accepted_s, 1),
        drained_s=None if drained is None else round(drained, 1),
        duration_s=round(time.monotonic() - began, 1),
        problems=problems,
    )


async def _start_all(
    target: Target, plans: list[Planned], clients: int, answers: collections.Counter[str]
) -> dict[str, Started]:
    """Every plan started by one of ``clients`` clients, each taking the next one left."""
    stack = target.stack
    waiting = collections.deque(plans)
    runs: dict[str, Started] = {}
    tls = ssl.create_default_context()  # made once: each client would make its own, slowly

    async def client() -> None:
        transport = _Counted(
            httpx.AsyncHTTPTransport(verify=tls, limits=httpx.Limits(max_connections=1)),
            answers,
        )
        async with AsyncClient(stack.api_url, api_key=stack.api_key, transport=transport) as api:
            while waiting:
                plan = waiting.popleft()
                try:
                    run = await api.start(
                        plan.workflow, plan.uri, policy=plan.policy, data_plane=plan.plane
                    )
                except (TooManyRequests, TransportError):
                    waiting.append(plan)  # past the client's own patience: try again later
                    await asyncio.sleep(1.0)
                    continue
                except APIError as exc:
                    if exc.status < 500:
                        raise  # a request of ours the API cannot take: a bug here
                    waiting.append(plan)  # counted (the goal is none); started again
                    continue
                runs[str(run.id)] = plan.started(str(run.id))

    await asyncio.gather(*(client() for _ in range(min(clients, len(plans)))))
    return runs
