"""Before a task is registered: can a live worker run it?

Workers announce the task code they loaded with every heartbeat (``workflows.loader``'s
``TaskCatalog`` in the ``tasks`` field). A task is registered only when a live worker loaded
its module and the function there is a ``@task``; a registration that leaves a setting out
(timeout, retries, backoff) gets the ``@task``'s. Otherwise the API answers 422 with what a
worker said: the module's import error, the tasks the module has, or which modules the
workers did load. *Why at registration:* a task whose module does not import was accepted
and failed every run that used it, at run time, on a worker's log.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import redis

from orchestrator.contract import keys
from orchestrator.errors import InvalidRequest
from workflows.loader import TaskCatalog

__all__ = ["SETTINGS", "live_catalogs", "runnable_settings"]

SETTINGS: Final = ("timeout_s", "retries", "retry_backoff_s")
_START_WORKERS: Final = "cdiflow up --tasks PATH, or cdiflow worker --tasks PATH"


def live_catalogs(client: redis.Redis, now: float | None = None) -> dict[str, TaskCatalog]:
    """The task catalog of every live worker (heartbeat younger than
    ``keys.WORKER_DEAD_AFTER_S``), by worker id."""
    now = time.time() if now is None else now
    ids = sorted(str(i) for i in client.smembers(keys.WORKERS))
    with client.pipeline(transaction=False) as pipe:
        for worker_id in ids:
            pipe.hmget(keys.worker_key(worker_id), ["last_heartbeat", "tasks"])
        beats = pipe.execute()
    catalogs = {}
    for worker_id, (last, tasks) in zip(ids, beats, strict=True):
        try:
            alive = now - float(last) < keys.WORKER_DEAD_AFTER_S
        except (TypeError, ValueError):
            alive = False
        if alive:
            catalogs[worker_id] = TaskCatalog.from_json(tasks or "")
    return catalogs


def runnable_settings(module_path: str, catalogs: Mapping[str, TaskCatalog]) -> dict[str, Any]:
    """The ``@task`` settings of ``module_path`` from a live worker that loaded it;
    ``InvalidRequest`` saying why none can run it."""
    for catalog in catalogs.values():
        found = catalog.task(module_path)
        if found is not None:
            return dict(found)
    problem = _why_not(module_path, catalogs)
    raise InvalidRequest(problem, [problem])


def _why_not(module_path: str, catalogs: Mapping[str, TaskCatalog]) -> str:
    module, _, attr = module_path.partition(":")
    if not catalogs:
        return (
            f"no worker is alive to load {module_path!r}; start workers with the task code "
            f"({_START_WORKERS}), then register it"
        )
    errors = [f"{w}: {e}" for w, c in catalogs.items() if (e := c.error_for(module_path))]
    if errors:
        return f"no live worker could import {module!r}: " + "; ".join(errors)
    having = {w: c.modules[module] for w, c in catalogs.items() if module in c.modules}
    if having:
        worker, tasks = next(iter(having.items()))
        names = ", ".join(sorted(tasks)) or "none"
        return (
            f"module {module!r} (loaded by {worker}) has no @task function {attr!r}; its "
            f"@task functions: {names}"
        )
    loaded = sorted({m for c in catalogs.values() for m in c.modules})
    return (
        f"no live worker loaded module {module!r} (they loaded: {', '.join(loaded)}); give "
        f"the workers its code ({_START_WORKERS})"
    )
