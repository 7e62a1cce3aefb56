"""``cdiflow demo``: the whole stack on this machine, the image pipeline under every policy.

Starts the stack (embedded Postgres, Redis, S3 endpoint, CDI controller and minion, REST API,
scheduler, two workers), uploads the bundled sample photos, runs ``image_pipeline`` on each with
the ``affinity``, ``transfer`` and ``auto`` policies and once in Orkes style (the object-store
data plane), ``fork_join_pipeline`` (two branches side by side, then a join) and ``ar_video``
(three seconds of the generated sample video, one ``detect`` step per frame: see
``cdiflow.demo_ar``), and prints a summary: status, label, latency, where the result is.
``--json`` also lists every run's task runs (ref, worker, started, finished), so anyone can see
the branches overlap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import boto3
import click
import httpx

from cdiflow.demo_ar import AR_WORKFLOW, ar_available, start_ar_video, video_uri
from orchestrator.contract.vocabulary import DataPlane, Policy, WorkflowStatus
from orchestrator.stack import Stack
from orchestrator.stack.state import format_table
from workflows.samples import bundled_samples

__all__ = ["run_demo"]

PIPELINE = "image_pipeline"
FORK_JOIN = "fork_join_pipeline"
RUNS = [
    (PIPELINE, Policy.AFFINITY, DataPlane.CDI),
    (PIPELINE, Policy.TRANSFER, DataPlane.CDI),
    (PIPELINE, Policy.AUTO, DataPlane.CDI),
    (PIPELINE, Policy.AFFINITY, DataPlane.OBJECT_STORE),
    (FORK_JOIN, Policy.TRANSFER, DataPlane.CDI),
]


def _s3(stack: Stack) -> Any:
    services = stack.services
    return boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.aws_region,
        aws_access_key_id=services.aws_access_key_id,
        aws_secret_access_key=services.aws_secret_access_key,
    )


def _upload_samples(stack: Stack) -> list[str]:
    services, s3 = stack.services, _s3(stack)
    uris = []
    for name, path in sorted(bundled_samples().items()):
        key = f"samples/{name}"
        s3.put_object(Bucket=services.s3_bucket, Key=key, Body=path.read_bytes())
        uris.append(f"s3://{services.s3_bucket}/{key}")
    return uris


def _download_results(stack: Stack, workflows: list[dict[str, Any]]) -> Path:
    """Copy each result image out of S3 (the embedded endpoint keeps them only while it runs)."""
    folder = stack.data_dir / "demo-results"
    folder.mkdir(parents=True, exist_ok=True)
    s3 = _s3(stack)
    for w in workflows:
        if w["result"]:
            bucket, key = w["result"].removeprefix("s3://").split("/", 1)
            stem = w["input"].rsplit("/", 1)[-1].rsplit(".", 1)[0]
            suffix = ".mp4" if w["workflow"] == AR_WORKFLOW else ".png"
            path = folder / f"{stem}-{w['workflow']}-{w['policy']}-{w['data_plane']}{suffix}"
            path.write_bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            w["result_file"] = str(path)
    return folder


def _wait(api: httpx.Client, ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    pending = set(ids)
    done: dict[str, dict[str, Any]] = {}
    while pending and time.monotonic() < deadline:
        for workflow_id in list(pending):
            body = api.get(f"/api/workflows/{workflow_id}").raise_for_status().json()
            if WorkflowStatus(body["status"]).finished:
                done[workflow_id] = body
                pending.discard(workflow_id)
        time.sleep(0.05)
    for workflow_id in pending:
        done[workflow_id] = api.get(f"/api/workflows/{workflow_id}").raise_for_status().json()
    return [done[i] for i in ids]


def _summary(body: dict[str, Any], policy: str, plane: str, image: str) -> dict[str, Any]:
    """One run as the demo reports it."""
    output = body.get("output") or {}
    latency = None
    if body.get("started_at") and body.get("finished_at"):
        from datetime import datetime

        latency = (
            datetime.fromisoformat(body["finished_at"]) - datetime.fromisoformat(body["created_at"])
        ).total_seconds()
    runs = body.get("task_runs", [])
    return {
        "id": body["id"],
        "workflow": body["workflow"],
        "policy": policy,
        "data_plane": plane,
        "input": image,
        "status": body["status"],
        "label": output.get("label"),
        "latency_s": round(latency, 4) if latency is not None else None,
        "workers": sorted({r["worker_id"] for r in runs if r.get("worker_id")}),
        "handoffs": len(body.get("handoffs", [])),
        "result": body.get("result_uri") or video_uri(body),
        "error": body.get("error"),
        "task_runs": [
            {
                "ref": r["ref"],
                "status": r["status"],
                "worker": r.get("worker_id"),
                "started": r.get("started_at"),
                "finished": r.get("finished_at"),
            }
            for r in runs
        ],
    }


def run_demo(
    data_dir: str | None = None, as_json: bool = False, port: int = 8000
) -> dict[str, Any]:
    with Stack(data_dir=data_dir, port=port) as stack:
        if not as_json:
            click.echo(f"stack up (data in {stack.data_dir}):")
            click.echo(format_table(stack.processes(), stack.data_dir))
        images = _upload_samples(stack)
        with httpx.Client(base_url=stack.api_url, timeout=30, headers=stack.auth_headers) as api:
            started: list[tuple[str, str, str, str]] = []

            def start(workflow: str, policy: str, plane: str, image: str) -> str:
                body = {"workflow": workflow, "input": {"image": image}, "policy": policy,
                        "data_plane": plane}  # fmt: skip
                run_id: str = api.post("/api/workflows", json=body).raise_for_status().json()["id"]
                started.append((run_id, policy, plane, image))
                return run_id

            # The pipelines all at once; then each fork/join alone, so its two branches find
            # both workers free and overlap (in a burst they would queue behind the others).
            for workflow, policy, plane in RUNS:
                for image in images if workflow == PIPELINE else ():
                    start(workflow, policy, plane, image)
            finished = _wait(api, [s[0] for s in started], timeout_s=300)
            for workflow, policy, plane in RUNS:
                for image in images if workflow != PIPELINE else ():
                    finished += _wait(api, [start(workflow, policy, plane, image)], timeout_s=120)
            # The AR video alone too: its per-frame detect steps spread over both workers.
            if ar_available():
                ar_id, video = start_ar_video(api, _s3(stack), stack.services.s3_bucket)
                started.append((ar_id, Policy.TRANSFER, DataPlane.CDI, video))
                finished += _wait(api, [ar_id], timeout_s=300)
            elif not as_json:
                click.echo("no AR video: install the optional 'ar' dependencies (PyAV, OpenCV)")
        workflows = [
            _summary(body, policy, plane, image)
            for body, (_, policy, plane, image) in zip(finished, started, strict=True)
        ]
        results_dir = _download_results(stack, workflows)
        report = {
            "completed": sum(w["status"] == WorkflowStatus.COMPLETED for w in workflows),
            "failed": sum(w["status"] != WorkflowStatus.COMPLETED for w in workflows),
            "api": stack.api_url,
            "docs": f"{stack.api_url}/docs",
            "results_dir": str(results_dir),
            "logs_dir": str(stack.logs_dir),
            "workflows": workflows,
        }
        if as_json:
            click.echo(json.dumps(report))
        else:
            _print(report)
    return report


def _print(report: dict[str, Any]) -> None:
    click.echo(
        f"\n{'workflow':<19} {'policy':<9} {'plane':<13} {'input':<16} {'status':<10} "
        f"{'label':<7} {'latency':>8}  result"
    )
    for w in report["workflows"]:
        latency = f"{w['latency_s'] * 1000:.0f} ms" if w["latency_s"] is not None else "-"
        click.echo(
            f"{w['workflow']:<19} {w['policy']:<9} {w['data_plane']:<13} "
            f"{w['input'].rsplit('/', 1)[-1]:<16} "
            f"{w['status']:<10} {w['label'] or '-':<7} {latency:>8}  "
            f"{w['result'] or w['error']}"
        )
    click.echo(f"\n{report['completed']} completed, {report['failed']} failed.")
    click.echo(f"results:       {report['results_dir']}/  (copied out of S3)")
    click.echo(f"logs:          {report['logs_dir']}/")
    click.echo(
        "keep the stack running to explore it: `cdiflow up`, then open "
        f"{report['api']}/docs (REST API)"
    )
