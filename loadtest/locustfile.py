"""Locust users that run workflows as people would: start one, follow it to its end, repeat.

Locust patches the standard library for gevent on import, so ``time.sleep`` and threads here
are cooperative greenlets.

With the web UI, against a stack started by ``cdiflow up`` (the images are generated and
uploaded to that stack's S3 when you press Start)::

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 \\
        --system transfer --image-size 500KB --tasks 3 --stack-dir .data

Headless, as ``cdiflow bench workflows`` runs it (one point of a scenario, described by a
``loadtest.plan.Target`` JSON file; the run quits once every user ran its ``rounds``)::

    locust -f loadtest/locustfile.py --headless -u 10 -r 10 --target-file point.json

Each workflow becomes one ``WORKFLOW`` row in locust's statistics (start to "result stored",
from the system's own stamp) and one JSON line in the target's ``records`` file. ``system``
is a cdiflow policy (``affinity``, ``transfer``, ``auto``, ``object-store``: the REST API) or
``celery`` (a chain through the Redis broker; needs the benchmark's Celery workers) or
``conductor`` (Conductor's REST API; needs the benchmark's server and workers).

Every client learns of a workflow's end the way its system tells one, without polling where
the system offers that: cdiflow's long poll, Celery's result backend (``get()``: a Redis
subscription), Conductor's synchronous ``execute`` (the server waits for the end); each
record says when the client noticed (``noticed_at``).

A closed loop (``concurrency`` users, each starting its next workflow when the last ended)
unless the target has an ``arrival_rate``: then one user starts ``rounds`` workflows at that
fixed rate (an open loop), each followed in a greenlet of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import resource
import sys
import threading
import time
import uuid
from argparse import ArgumentParser
from pathlib import Path
from typing import Any, Protocol

import gevent.pool  # type: ignore[import-untyped]
from locust import User, events, task
from locust.env import Environment
from locust.exception import StopUser

from loadtest.cdiflow_api import FINISHED, SYSTEM_MODES, stamp, while_busy
from loadtest.images import chain_ops, chain_workflow
from loadtest.locust_http import LONG_POLL_S, http_session
from loadtest.pipeline_ops import RESULT_FORMAT
from loadtest.plan import Target, client_usage_path
from loadtest.stats import WorkflowRecord
from loadtest.systems.conductor_client import ConductorBackend

# (status, stored_at, error, ops_cpu_ms) once a workflow has finished; ops_cpu_ms is the CPU
# its image operations took, where the system's answer carries it (None elsewhere).
Outcome = tuple[str, float | None, str, float | None]

_TARGET: Target | None = None
_user_ids = itertools.count()
_finished = 0
_celery_results: list[Any] = []
_cpu_at_first_start: tuple[float, float] | None = None  # (user + system, system) seconds


def _arguments(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--target-file",
        default="",
        include_in_web_ui=False,
        help="A loadtest.plan.Target JSON (cdiflow bench workflows writes it)",
    )
    parser.add_argument(
        "--system",
        default="transfer",
        choices=sorted(SYSTEM_MODES),
        help="cdiflow policy / data plane of the workflows started",
    )
    parser.add_argument("--image-size", default="100KB", help="Input image size, e.g. 500KB")
    parser.add_argument("--tasks", type=int, default=3, help="Image tasks per workflow")
    parser.add_argument("--stack-dir", default=".data", help="Data folder of `cdiflow up`")
    parser.add_argument("--records", default="", help="Append one JSON line per workflow")


_hooks: Any = events  # locust's event hooks are untyped
_hooks.init_command_line_parser.add_listener(_arguments)


class Backend(Protocol):
    # True: ``poll`` itself waits for the end (a long poll), so no sleep between polls.
    long_poll: bool

    def start(self, uri: str) -> Any: ...
    def poll(self, handle: Any) -> Outcome | None: ...


def _check(reply: Any, what: str) -> None:
    if reply.status_code is None or not 200 <= reply.status_code < 300:
        detail = reply.error or (reply.text or "")[:200]
        raise RuntimeError(f"{what}: {reply.status_code} {detail}")


class CdiflowBackend:
    """The REST API, through locust's HTTP client (its requests show in the statistics).

    Starts a workflow and waits for its end in one request (``POST ...?wait_s=``), then, if it
    is still running, follows it with the long poll (``GET ...?wait_s=``), as a client of ours
    should: the answer comes when the workflow ends, and no polling takes the CPU meanwhile.
    """

    long_poll = True

    def __init__(self, user: User, target: Target) -> None:
        self.http = http_session(
            user,
            target.api_url,
            open_loop=bool(target.arrival_rate),
            headers={"Authorization": f"Bearer {target.api_key}"},
        )
        self.target = target
        self.policy, self.plane = SYSTEM_MODES[target.system]
        self._ended: dict[str, Outcome] = {}  # answered by the start itself

    def start(self, uri: str) -> str:
        body = {
            "workflow": self.target.workflow,
            "input": {
                "image": uri,
                "result_format": RESULT_FORMAT,
                "intermediate_format": self.target.intermediate,
            },
            "policy": self.policy,
            "data_plane": self.plane,
        }
        reply = while_busy(
            lambda: self.http.post(f"/api/workflows?wait_s={LONG_POLL_S:g}", json=body)
        )
        _check(reply, "POST /api/workflows")
        answer = reply.json()
        handle = str(answer["id"])
        outcome = _outcome(answer)
        if outcome is not None:
            self._ended[handle] = outcome
        return handle

    def poll(self, handle: str) -> Outcome | None:
        ended = self._ended.pop(handle, None)
        if ended is not None:
            return ended
        reply = while_busy(
            lambda: self.http.get(
                f"/api/workflows/{handle}?events=0&wait_s={LONG_POLL_S:g}",
                name="/api/workflows/[id]",
            )
        )
        _check(reply, f"GET /api/workflows/{handle}")
        return _outcome(reply.json())


def _outcome(body: dict[str, Any]) -> Outcome | None:
    """A workflow's outcome from its detail; ``None`` while it runs."""
    if body["status"] not in FINISHED:
        return None
    stored = stamp(body["finished_at"]) if body["status"] == "COMPLETED" else None
    # cdiflow's operations' CPU is read for the whole point (every attempt's), from its API.
    return body["status"], stored, body.get("error") or "", None


class CeleryBackend:
    """A Celery chain per workflow; its end comes from the Redis result backend, as Celery's
    documentation has a client wait for a result: ``AsyncResult.get()``, which subscribes to
    the result's channel (under gevent, Celery's gevent drainer) instead of polling."""

    long_poll = True

    def __init__(self, user: User, target: Target) -> None:
        os.environ["LOADTEST_CELERY_BROKER"] = target.celery_broker
        os.environ["LOADTEST_CELERY_BACKEND"] = target.celery_backend
        from loadtest.systems import celery_app  # reads the two variables on first import

        self.app = celery_app
        self.ops = chain_ops(target.tasks)
        self.intermediate = target.intermediate

    def start(self, uri: str) -> Any:
        signature = self.app.workflow_signature(self.ops, uuid.uuid4().hex, uri, self.intermediate)
        handle = signature.apply_async()
        # Celery's AsyncResult.__del__ touches gevent locals; collected in a greenlet that
        # locust is killing, it fails noisily. Kept alive here, it is never collected there.
        _celery_results.append(handle)
        return handle

    def poll(self, handle: Any) -> Outcome | None:
        from celery.exceptions import TimeoutError as ResultTimeout  # type: ignore[import-untyped]

        try:
            value = handle.get(timeout=LONG_POLL_S, propagate=False, disable_sync_subtasks=False)
        except ResultTimeout:
            return None
        if not handle.successful():
            return "FAILED", None, f"{type(value).__name__}: {value}", None
        return "COMPLETED", float(value["stored_at"]), "", float(value["ops_cpu_ms"])


_BACKENDS: dict[str, Any] = {
    "celery": CeleryBackend,
    "conductor": ConductorBackend,
    "conductor-redis": ConductorBackend,
}


class WorkflowUser(User):
    """Runs one workflow at a time: start, poll with a growing interval, record."""

    def wait_time(self) -> float:
        return 0.0

    def on_start(self) -> None:
        self.target = _load_target(self.environment)
        self.index = next(_user_ids)
        self.rng = random.Random(self.target.seed * 100_003 + self.index)
        self.backend: Backend = _BACKENDS.get(self.target.system, CdiflowBackend)(self, self.target)
        self.done = 0

    @task
    def run_workflow(self) -> None:
        target = self.target
        if target.rounds and self.done >= target.rounds:
            raise StopUser()
        if target.arrival_rate:
            self._open_loop(target.arrival_rate, target.rounds)
            raise StopUser()
        self.done += 1
        self._one_workflow()

    def _open_loop(self, rate: float, count: int) -> None:
        """``count`` workflows started ``1 / rate`` seconds apart, whatever the system's pace;
        each followed in its own greenlet."""
        followers = gevent.pool.Group()
        began = time.time()
        for i in range(count):
            delay = began + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            self.done += 1
            followers.spawn(self._one_workflow)
        followers.join()

    def _one_workflow(self) -> None:
        target = self.target
        uri, size = self.rng.choice(target.images)
        _note_first_start()
        submitted = time.time()
        try:
            handle = self.backend.start(uri)
        except Exception as exc:  # the system refused (or never answered) the start
            outcome: Outcome = ("REFUSED", None, f"{type(exc).__name__}: {exc}", None)
        else:
            outcome = self._follow(handle, submitted)
        noticed = time.time()
        status, stored_at, error, ops_cpu_ms = outcome
        self._record(
            WorkflowRecord(
                system=target.system,
                size=size,
                tasks=target.tasks,
                submitted_at=submitted,
                stored_at=stored_at,
                status=status,
                error=error,
                ops_cpu_ms=ops_cpu_ms,
                noticed_at=noticed if status == "COMPLETED" else None,
            )
        )

    def _follow(self, handle: Any, submitted: float) -> Outcome:
        """Poll until the workflow ends. A failed poll is retried, as a person would reload
        the page; it shows in locust's request statistics, not as a failed workflow."""
        target, interval, problem = self.target, self.target.poll_first_s, ""
        while time.time() - submitted <= target.timeout_s:
            if not self.backend.long_poll:
                time.sleep(interval)
                interval = min(target.poll_max_s, interval * 1.5)
            try:
                outcome = self.backend.poll(handle)
            except Exception as exc:
                problem = f"; last poll failed: {type(exc).__name__}: {exc}"
                time.sleep(interval)  # a failing long poll must not spin either
                continue
            if outcome is not None:
                return outcome
        return ("TIMEOUT", None, f"not finished after {target.timeout_s:g} s{problem}", None)

    def _record(self, record: WorkflowRecord) -> None:
        try:
            self._report(record)
        finally:  # whatever happened, count it: the run must end when all are done
            self._count_finished()

    def _report(self, record: WorkflowRecord) -> None:
        latency = record.latency_s
        self.environment.events.request.fire(
            request_type="WORKFLOW",
            name=f"{record.system} {record.size // 1000} KB x{record.tasks}",
            response_time=(latency if latency is not None else time.time() - record.submitted_at)
            * 1000,
            response_length=0,
            exception=None if record.status == "COMPLETED" else RuntimeError(record.error),
            context={},
        )
        if self.target.records:
            with open(self.target.records, "a") as out:
                out.write(json.dumps(record.as_dict()) + "\n")

    def _count_finished(self) -> None:
        global _finished
        _finished += 1
        expected = self.target.rounds * self.target.concurrency
        runner = self.environment.runner
        if expected and _finished >= expected:
            _write_client_usage(self.target)
            if runner is not None:
                threading.Timer(0.1, runner.quit).start()  # not from this user: quit kills it


def _cpu_s() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


def _note_first_start() -> None:
    global _cpu_at_first_start
    if _cpu_at_first_start is None:
        _cpu_at_first_start = _cpu_s()


def _write_client_usage(target: Target) -> None:
    """Our own CPU from the first start to the last record, and our peak memory, for the
    benchmark's per-component table: this process exits before the benchmark's meter looks
    again, and its start-up (importing locust) is not the clients' work."""
    if not target.records or _cpu_at_first_start is None:
        return
    cpu, sys_cpu = _cpu_s()
    usage = {
        "cpu_s": cpu - _cpu_at_first_start[0],
        "sys_s": sys_cpu - _cpu_at_first_start[1],
        "peak_rss": _peak_rss(),
    }
    client_usage_path(target.records).write_text(json.dumps(usage))


def _peak_rss() -> int:
    """Bytes. Linux's ``VmHWM`` is this program's own high-water mark; ``ru_maxrss`` would
    also count the benchmark's memory, which the child had between ``fork`` and ``exec``."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    scale = 1 if sys.platform == "darwin" else 1024  # macOS counts bytes, the others KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _load_target(environment: Environment) -> Target:
    global _TARGET
    if _TARGET is None:
        options = environment.parsed_options
        if options is not None and options.target_file:
            _TARGET = Target.read(Path(options.target_file))
        else:
            _TARGET = _interactive_target(environment)
    return _TARGET


def _interactive_target(environment: Environment) -> Target:
    """A person's run against ``cdiflow up``: upload an image of the chosen size, go."""
    from cdi.minion.config import parse_bytes
    from loadtest.webui import api_key_of, upload_sample  # not needed by headless runs

    options = environment.parsed_options
    if options is None or not environment.host:
        raise RuntimeError("give the API address with --host, e.g. http://127.0.0.1:8000")
    size = parse_bytes(options.image_size)
    uri = upload_sample(Path(options.stack_dir), size)
    api_key = api_key_of(Path(options.stack_dir))
    return Target(
        system=options.system,
        images=[(uri, size)],
        tasks=options.tasks,
        concurrency=0,
        rounds=0,
        records=options.records,
        api_url=environment.host,
        api_key=api_key,
        workflow=_ensure_workflow(environment.host, api_key, options.tasks),
        poll_max_s=0.5,
    )


def _ensure_workflow(api_url: str, api_key: str, tasks: int) -> str:
    if tasks == 3:
        return chain_workflow(3)
    from loadtest.cdiflow_api import connect, ensure_chain

    with connect(api_url, api_key) as api:
        return ensure_chain(api, tasks)


def _prepare(environment: Environment, **_: Any) -> None:
    target = _load_target(environment)  # upload before the users start, not in the first one
    if target.rounds:
        threading.Thread(target=_progress, args=(target,), daemon=True).start()


_hooks.test_start.add_listener(_prepare)


def _progress(target: Target) -> None:
    """One line every 5 s on stderr (headless runs pass --only-summary to locust)."""
    expected = target.rounds * target.concurrency
    began = time.time()
    while _finished < expected:
        time.sleep(5.0)
        print(
            f"  [{target.system}] {_finished}/{expected} workflows done, "
            f"{time.time() - began:.0f} s",
            file=sys.stderr,
            flush=True,
        )
