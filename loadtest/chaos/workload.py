"""What the chaos runs put through a stack: image workflows under every policy, each result
checked against the same operations run here (by the hash of its pixels).

Two workflows, each napping so that workflows are in flight when a fault strikes:

* the chain ``deblur -> nap -> denoise -> classify``, under every policy (``MIX``); its result
  equals the bundled ``reference_pipeline`` of the input, whatever ran where and however often;
* the graph (``GRAPH``): ``deblur`` forks into ``smooth`` (at once) and ``nap -> sharpen``,
  which ``blend`` joins before ``classify``; under ``transfer`` and ``auto`` (``GRAPH_MIX``),
  where each branch's image goes straight to the join's worker, so that worker holds
  ``smooth``'s image ahead of the join for the nap. Its result equals ``graph_reference``.

A workload runs one of them or both in turn (``SHAPES``); the probes are always chains.
"""

from __future__ import annotations

import collections
import hashlib
import io
import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import httpx
import numpy as np
from PIL import Image

from loadtest.systems.services import s3_client
from orchestrator.services import RunningServices
from workflows.api import TaskContext
from workflows.image_tasks import blend, classify, deblur, denoise, reference_pipeline
from workflows.imagebuf import normalize_mode

__all__ = [
    "GRAPH",
    "PIPELINE",
    "SHAPES",
    "Planned",
    "Reachable",
    "Started",
    "Workload",
    "graph_reference",
    "pixels_digest",
]

PIPELINE: Final = "chaos_pipeline"
GRAPH: Final = "chaos_graph"
NAP_TASK: Final = "chaos_nap"
REASON_CHARS: Final = 240  # of a task run's error, in a case's report
STUCK_EVENTS: Final = 12  # a stuck run's last events, in a case's report
EVENT_CHARS: Final = 160  # of each one's data
INPUT_STEP: Final = "deblur"  # the step that reads the workflow's input from S3
# (policy, data plane) in turn: the three CDI policies and the Conductor-style plane.
MIX: Final = (
    ("affinity", "cdi"),
    ("transfer", "cdi"),
    ("auto", "cdi"),
    ("affinity", "object-store"),
)
# The graph's: the policies that hand a join's inputs straight to its worker.
GRAPH_MIX: Final = (("transfer", "cdi"), ("auto", "cdi"))
# What a workload starts, in turn: (workflow, policy, data plane).
SHAPES: Final[dict[str, tuple[tuple[str, str, str], ...]]] = {
    "chain": tuple((PIPELINE, *run) for run in MIX),
    "graph": tuple((GRAPH, *run) for run in GRAPH_MIX),
    "mixed": tuple(
        (workflow, *run)
        for chain, graph in zip(MIX, itertools.cycle(GRAPH_MIX), strict=False)
        for workflow, run in ((PIPELINE, chain), (GRAPH, graph))
    ),
}
FINISHED: Final = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
PAGE: Final = 200  # the API's largest page of runs
MAX_SINGLES: Final = 50  # runs a refresh asks for one by one (those the list did not show)
CLOCK_SLACK_S: Final = 5.0  # a run's created_at may come a little before we saw it start


class Reachable(Protocol):
    """A running stack as a chaos run reaches it from this machine: its API's address, the
    header that makes a request its admin's, and its services (the S3 bucket). A process
    stack (``orchestrator.stack.Stack``) is one, the stack as containers
    (``deploy.containers.stack.ContainerStack``) another."""

    @property
    def api_url(self) -> str: ...

    @property
    def auth_headers(self) -> dict[str, str]: ...

    @property
    def services(self) -> RunningServices: ...


def graph_reference(img: Image.Image) -> tuple[Image.Image, str]:
    """``GRAPH`` in process: the blend of the deblurred input sharpened and smoothed, and its
    label."""
    ctx = TaskContext(task_name=GRAPH, workflow_id="reference")
    first = deblur(normalize_mode(img), ctx).image
    assert first is not None
    sharp, smooth = deblur(first, ctx).image, denoise(first, ctx).image
    assert sharp is not None and smooth is not None
    blended = blend(sharp, smooth, ctx).image
    assert blended is not None
    return blended, str(classify(blended, ctx).output["label"])


def pixels_digest(img: Image.Image) -> str:
    """What identifies a result: its size, mode and every pixel."""
    arr = np.asarray(img)
    return hashlib.sha256(f"{img.mode}{arr.shape}".encode() + arr.tobytes()).hexdigest()


@dataclass
class Started:
    """A workflow this run started, and what it must end with."""

    id: str
    input_key: str
    policy: str
    plane: str
    started_at: float  # unix seconds (client clock = server clock: one machine)
    probe: bool = False  # started after a fault, to time the recovery
    status: str = "PENDING"
    finished_at: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    workflow: str = PIPELINE


@dataclass(frozen=True)
class Planned:
    """A workflow about to be started: its input and how it runs."""

    input_key: str
    policy: str
    plane: str
    bucket: str
    workflow: str = PIPELINE

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.input_key}"

    @property
    def body(self) -> dict[str, Any]:
        """The start request's body."""
        return {"workflow": self.workflow, "input": {"image": self.uri}, "policy": self.policy,
                "data_plane": self.plane}  # fmt: skip

    def started(self, workflow_id: str, *, probe: bool = False) -> Started:
        return Started(workflow_id, self.input_key, self.policy, self.plane, time.time(), probe,
                       workflow=self.workflow)  # fmt: skip


class Workload:
    """Inputs in the stack's S3 bucket, both workflows registered, and their expected results;
    ``shape`` picks what it starts (``SHAPES``)."""

    def __init__(
        self, stack: Reachable, *, images: int = 4, nap_ms: int = 300, shape: str = "chain"
    ) -> None:
        self.stack = stack
        self.nap_ms = nap_ms
        self.bucket = stack.services.s3_bucket
        self.s3 = s3_client(stack.services)
        self.api = api_client(stack)
        # (workflow, input key) -> the result's (digest, label)
        self.expected: dict[tuple[str, str], tuple[str, str]] = {}
        # Answers other than 201 to a start, by status ("no answer": none came), and the
        # first words of each kind, to tell a clear refusal from a crash.
        self.refused: collections.Counter[str] = collections.Counter()
        self.refusal_texts: dict[str, str] = {}
        self._singles = 0  # where the last refresh's one-by-one reads stopped
        # Workflows a fault started to keep the stack busy while it struck (``feed``): the
        # case judges them with its own.
        self.fed: list[Started] = []
        # Every workflow it may start (the probes are chains), for the API's lists.
        self.workflows = sorted({PIPELINE, *(w for w, _, _ in SHAPES[shape])})
        self._mix = itertools.cycle(SHAPES[shape])
        self._inputs = itertools.cycle(self._upload(images))
        self._register()

    def close(self) -> None:
        self.api.close()
        self.s3.close()

    def reconnect(self, stack: Reachable) -> None:
        """Follow a stack started again on the same data folder (``down`` + ``up``)."""
        self.stack = stack
        self.api.close()
        self.api = api_client(stack)
        self.s3.close()
        self.s3 = s3_client(stack.services)  # the embedded endpoint came back on another port

    # ------------------------------------------------------------------ set-up
    def _upload(self, count: int) -> list[str]:
        keys = []
        for n in range(count):
            rng = np.random.default_rng(n)
            h, w = 96 + 16 * n, 128 + 8 * n
            ys, xs = np.mgrid[0:h, 0:w]
            base = np.stack([xs * (3 + n), ys * 5, (xs + ys) * 2], axis=-1) % 256
            noise = rng.integers(0, 40, size=(h, w, 3))
            img = Image.fromarray(((base + noise) % 256).astype(np.uint8), "RGB")
            out = io.BytesIO()
            img.save(out, "PNG")
            key = f"chaos/in/{uuid.uuid4().hex}-{n}.png"
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=out.getvalue())
            for workflow, reference in ((PIPELINE, reference_pipeline), (GRAPH, graph_reference)):
                result, label = reference(img)
                self.expected[workflow, key] = (pixels_digest(result), label)
            keys.append(key)
        return keys

    def _register(self) -> None:
        for path, body in (
            ("/api/tasks", {"name": NAP_TASK, "module": "workflows.image_tasks:sleep",
                            "timeout_s": 20, "retries": 3, "retry_backoff_s": 0.2}),
            ("/api/workflow-definitions", {"name": PIPELINE, "tasks": [
                {"ref": "deblur", "task": "deblur"},
                {"ref": "nap", "task": NAP_TASK, "depends_on": ["deblur"],
                 "params": {"ms": self.nap_ms}},
                {"ref": "denoise", "task": "denoise", "depends_on": ["nap"]},
                {"ref": "classify", "task": "classify", "depends_on": ["denoise"]},
            ]}),
            ("/api/workflow-definitions", {"name": GRAPH, "tasks": [
                {"ref": "deblur", "task": "deblur"},
                {"ref": "smooth", "task": "denoise", "inputs": {"image": "deblur.image"}},
                {"ref": "nap", "task": NAP_TASK, "inputs": {"image": "deblur.image"},
                 "params": {"ms": self.nap_ms}},
                {"ref": "sharpen", "task": "deblur", "inputs": {"image": "deblur.image"},
                 "depends_on": ["nap"]},
                {"ref": "blend", "task": "blend",
                 "inputs": {"sharp": "sharpen.image", "smooth": "smooth.image"}},
                {"ref": "classify", "task": "classify", "depends_on": ["blend"]},
            ]}),
        ):  # fmt: skip
            reply = self.api.post(path, json=body)
            if reply.status_code not in (201, 409):  # 409: registered by an earlier case
                raise RuntimeError(f"POST {path}: {reply.status_code} {reply.text}")

    # ------------------------------------------------------------------ runs
    def next_run(self, *, probe: bool = False) -> Planned:
        """What the next workflow runs: the next workflow, policy and plane in turn (a probe is
        always the chain under affinity on CDI), and the next input."""
        workflow, policy, plane = (PIPELINE, "affinity", "cdi") if probe else next(self._mix)
        return Planned(next(self._inputs), policy, plane, self.bucket, workflow)

    def start(self, *, probe: bool = False, deadline_s: float = 60.0) -> Started:
        """Start one workflow (the next policy and input in turn); retries while the API
        cannot take it (a fault may be under way)."""
        run = self.next_run(probe=probe)
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                reply = self.api.post("/api/workflows", json=run.body)
                if reply.status_code == 201:
                    return run.started(reply.json()["id"], probe=probe)
                problem = f"{reply.status_code} {reply.text[:200]}"
                self.note_refusal(str(reply.status_code), reply.text)
            except httpx.HTTPError as exc:
                problem = str(exc)
                self.note_refusal("no answer", f"{type(exc).__name__}: {exc}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API took no workflow for {deadline_s:g} s: {problem}")
            time.sleep(0.2)

    def feed(self) -> Started:
        """Start one workflow for a fault that needs work in flight to strike (judged with
        the case's workflows, ``fed``)."""
        started = self.start()
        self.fed.append(started)
        return started

    def note_refusal(self, status: str, text: str) -> None:
        self.refused[status] += 1
        self.refusal_texts.setdefault(status, text[:300])

    def refresh(self, runs: dict[str, Started]) -> None:
        """Read the status of every run not yet finished: the list's pages of the runs created
        since the oldest of them, newest first, until every one was seen; then any the list
        did not show on its own (``MAX_SINGLES`` a call, taking turns: a run the API does
        not know is LOST). Thousands in flight cost a page per 200, not a request each."""
        waiting = [r for r in runs.values() if r.status not in FINISHED and r.status != "LOST"]
        if not waiting:
            return
        since = datetime.fromtimestamp(min(r.started_at for r in waiting) - CLOCK_SLACK_S, UTC)
        rows: dict[str, dict[str, Any]] = {}
        for workflow in {r.workflow for r in waiting}:
            wanted = {r.id for r in waiting if r.workflow == workflow}
            seen = len(rows)
            cursor: str | None = None
            while True:  # by cursor: an offset past the API's MAX_OFFSET is refused (422)
                page = self._page(workflow, {"created_after": since.isoformat()}, cursor)
                if page is None:
                    return  # the API is away now: look again later
                found, cursor = page
                rows.update((item["id"], item) for item in found if item["id"] in wanted)
                if cursor is None or len(rows) - seen == len(wanted):
                    break
        unseen = [r for r in waiting if r.id not in rows]
        if unseen:
            first = self._singles % len(unseen)
            for run in (unseen[first:] + unseen[:first])[:MAX_SINGLES]:
                row = self._one(run.id)
                if row is not None:
                    rows[run.id] = row
            self._singles = first + MAX_SINGLES
        for run in waiting:
            row = rows.get(run.id)
            if row is None:
                continue
            run.status = row["status"]
            run.detail = row
            if row.get("finished_at"):
                run.finished_at = datetime.fromisoformat(row["finished_at"]).timestamp()

    def finished_since(self, since: float) -> int | None:
        """How many runs of the workload's workflows created since ``since`` (unix seconds)
        have finished; ``None`` while the API does not answer. ``since``: a time read before the
        first of them was started (one machine: the API's clock is ours). From the list's
        totals (one request a workflow and status) while they are exact; a total the API
        capped (past ``COUNT_CAP`` matches, ``total_exact`` false) is counted from its pages."""
        after = datetime.fromtimestamp(since, UTC).isoformat()
        total = 0
        for workflow, status in itertools.product(self.workflows, FINISHED):
            filters = {"status": status, "created_after": after}
            try:
                reply = self.api.get(
                    "/api/workflows", params={"workflow": workflow, "limit": 1, **filters}
                )
            except httpx.HTTPError:
                return None
            if reply.status_code != 200:
                return None
            body = reply.json()
            if body.get("total_exact", True):
                total += int(body["total"])
                continue
            counted = self._count(workflow, filters)
            if counted is None:
                return None
            total += counted
        return total

    def _count(self, workflow: str, filters: dict[str, str]) -> int | None:
        """The runs of ``workflow`` that match ``filters``, page by page; ``None`` while the
        API does not answer."""
        counted, cursor = 0, None
        while True:
            page = self._page(workflow, filters, cursor)
            if page is None:
                return None
            items, cursor = page
            counted += len(items)
            if cursor is None:
                return counted

    def _page(
        self, workflow: str, filters: dict[str, str], cursor: str | None
    ) -> tuple[list[dict[str, Any]], str | None] | None:
        """One page of ``workflow``'s runs from ``cursor`` (the first without one) and the
        cursor of the next (``None`` at the last); ``None`` while the API does not answer."""
        params: dict[str, str | int] = {"workflow": workflow, "limit": PAGE, **filters}
        if cursor is not None:
            params["cursor"] = cursor
        try:
            reply = self.api.get("/api/workflows", params=params)
        except httpx.HTTPError:
            return None
        if reply.status_code != 200:
            return None
        body = reply.json()
        items: list[dict[str, Any]] = body["items"]
        return items, body.get("next_cursor")

    def _one(self, workflow_id: str) -> dict[str, Any] | None:
        try:
            reply = self.api.get(f"/api/workflows/{workflow_id}")
        except httpx.HTTPError:
            return None
        if reply.status_code == 404:
            return {"status": "LOST", "finished_at": None}
        return reply.json() if reply.status_code == 200 else None

    def reruns_from_input(self, runs: dict[str, Started]) -> tuple[int, list[str]] | None:
        """How many of ``runs`` ran again from their input: their input step (the one that
        reads the input from S3) ran more than once — a redrive after lost objects, or a retry
        of that step; counted from each workflow's task runs. With it, the distinct errors of
        the task runs that failed in those workflows (what made them start over). ``None`` if
        the API did not answer for one of them."""
        again, reasons = 0, set[str]()
        for run in runs.values():
            detail = self._one(run.id)
            if detail is None:
                return None
            task_runs = detail.get("task_runs") or ()
            if sum(t.get("ref") == INPUT_STEP for t in task_runs) > 1:
                again += 1
                reasons.update(
                    f"{t.get('ref')}: {str(t.get('error'))[:REASON_CHARS]}"
                    for t in task_runs
                    if t.get("status") == "FAILED"
                )
        return again, sorted(reasons)

    def where_stuck(self, run: Started) -> dict[str, Any]:
        """What a run that did not finish was doing: its status, each task run (ref, attempt,
        status, worker) and its last events, from the API (for the report of a stuck run)."""
        detail = self._one(run.id) or {}
        return {
            "id": run.id,
            "workflow": run.workflow,
            "policy": run.policy,
            "status": detail.get("status", run.status),
            "task_runs": [
                f"{t.get('ref')}#{t.get('attempt')} {t.get('status')} on {t.get('worker_id')}"
                for t in detail.get("task_runs") or ()
            ],
            "events": [
                f"{e.get('kind')} {json.dumps(e.get('data'))[:EVENT_CHARS]}"
                for e in (detail.get("events") or ())[-STUCK_EVENTS:]
            ],
        }

    def verdict(self, run: Started) -> str:
        """``ok`` (completed with the right pixels and label, or failed saying why), else
        what is wrong: ``wrong``, ``lost`` (no such workflow, or its result is gone),
        ``stuck`` (not finished)."""
        if run.status == "LOST":
            return "lost"
        if run.status not in FINISHED:
            return "stuck"
        if run.status != "COMPLETED":
            return "ok" if run.detail.get("error") else "wrong"
        uri = str(run.detail.get("result_uri") or "")
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        try:
            data = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception:
            return "lost"
        digest, label = self.expected[run.workflow, run.input_key]
        got = pixels_digest(Image.open(io.BytesIO(data)))
        output = run.detail.get("output") or {}
        return "ok" if got == digest and output.get("label") == label else "wrong"


def api_client(stack: Reachable) -> httpx.Client:
    """The one place the chaos runs make their API client (as the stack's admin)."""
    return httpx.Client(base_url=stack.api_url, timeout=30, headers=stack.auth_headers)
