"""The scheduler's orphan sweep looks at every host: an object of its run that a worker of the
other host kept, and that no run names, is asked back from that worker; on a real two-host CDI
cluster (its controller's directory, read with the cluster's reader token)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis

import cdi
from cdi import ObjectKey
from cdi.auth import ClusterCredentials
from cdi.cluster import LocalCluster
from cdi.controller.client import ControllerClient
from orchestrator.contract import keys
from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.scheduler.claims import with_input_fetch
from orchestrator.scheduler.context import SchedulerContext
from orchestrator.scheduler.data import Obj
from orchestrator.scheduler.dispatch import Dispatcher
from orchestrator.scheduler.endings import Endings
from orchestrator.scheduler.minion_link import MinionLink
from orchestrator.scheduler.object_directory import ObjectDirectory, controller_from_env
from orchestrator.scheduler.orphans import OrphanObjects
from orchestrator.scheduler.runs import RunState, StepSpec
from workflows.graph import build_graph
from workflows.kinds import Kind

# What is tested is the scheduler's sweep through the directory, not the gateway: one cluster.
CLUSTER_GATEWAYS = ["native"]


def _run(workflow_id: uuid.UUID, held: str, owner: str) -> RunState:
    """A run of ours in memory, holding one object (so the sweep looks)."""
    graph = with_input_fetch(build_graph([{"ref": "a", "task": "noop"}], lambda name: None))
    specs = {r: StepSpec(r, n.task, f"m:{n.task}", 30.0, 2, 0.1)
             for r, n in graph.nodes.items() if n.task}  # fmt: skip
    run = RunState(workflow_id, Policy.TRANSFER, DataPlane.CDI, graph, specs, "s3://b/in.jpg")
    run.objects[ObjectKey(held)] = Obj(ObjectKey(held), Kind.IMAGE, 64, owner)
    return run


def test_an_object_left_on_another_host_is_asked_back_from_its_worker(
    cluster: LocalCluster,
    redis_url: str,
    unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, far_worker = unique("scheduler"), unique("worker-far")
    workflow = uuid.uuid4()
    named, left = f"wf-{workflow}-1", f"wf-{workflow}-2"
    reader = ClusterCredentials(cluster.directory / "credentials").reader_token_file
    monkeypatch.setenv("CDI_CONTROLLER_URL", cluster.controller_url)
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN", raising=False)
    monkeypatch.setenv("CDI_CONTROLLER_TOKEN_FILE", str(reader))
    link = MinionLink(cluster.minions[0].socket_path, scheduler)  # the scheduler: host 1
    directory = ObjectDirectory(link, controller_from_env())
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    queue = keys.worker_queue_key(far_worker)
    nothing = cast(Any, None)  # the sweep reads no run store for runs it has in memory
    ctx = SchedulerContext(scheduler, nothing, client, link, nothing)
    ctx.runs[workflow] = _run(workflow, named, scheduler)
    sweep = OrphanObjects(ctx, Endings(ctx, Dispatcher(ctx)), directory)
    try:
        with cdi.connect(cluster.minions[1].socket_path, far_worker) as worker:  # host 2
            worker.create(left, 64).release()  # kept, and named by no run any more
            _wait_listed(cluster, reader.read_text().strip(), left)
            sweep.sweep()  # seen once: it may be in transit
            assert client.llen(queue) == 0
            sweep.sweep()  # seen twice: left over
            asked = client.lrange(queue, 0, -1)
            assert len(asked) == 1 and left in asked[0], asked
            worker.use(left).destroy()  # what the worker does with the no-op it was sent
    finally:
        client.delete(queue)
        client.close()
        directory.close()
        link.close()


def _wait_listed(cluster: LocalCluster, token: str, key: str) -> None:
    """Until the controller's directory lists ``key`` (the minion reports it at once, the
    directory trails by a moment)."""
    deadline = time.monotonic() + 10
    with ControllerClient(cluster.controller_url, token=token) as controller:
        while key not in {o.key for o in controller.list_objects()}:
            assert time.monotonic() < deadline, f"{key} never reached the directory"
            time.sleep(0.05)
