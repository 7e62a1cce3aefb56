"""What the dashboard stands on, over plain HTTP against the real stack: the pages and assets at
``/``, and the API routes added for it (stats, active task runs, CDI directory, images)."""

from __future__ import annotations

import io
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from orchestrator.controller.api.routes.cdi import cdi_directory, workflow_of
from orchestrator.controller.api.routes.images import THUMBNAIL_EDGE
from orchestrator.db import make_engine, make_session_factory
from orchestrator.db import repository as repo
from orchestrator.errors import ServiceError
from tests.dashboard.support import Harness, sample, wait_for

WEB: Path = Path(__file__).resolve().parents[2] / "dashboards" / "web"


def test_the_dashboard_is_served_beside_the_api(harness: Harness) -> None:
    api = harness.api
    page = api.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert api.head("/").status_code == 200
    script = api.get("/assets/js/main.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["cache-control"] == "no-cache"
    assert api.get("/assets/app.css").headers["content-type"].startswith("text/css")
    assert api.get("/assets/nothing.js").status_code == 404
    assert api.get("/assets/../../pyproject.toml").status_code == 404
    assert api.get("/docs").status_code == 200
    paths = api.get("/api/openapi.json").json()["paths"]
    for path in ("/api/stats", "/api/task-runs/active", "/api/cdi/objects",
                 "/api/workflows/{workflow_id}/images"):  # fmt: skip
        assert path in paths
    assert "/" not in paths  # the pages are not part of the API


def test_every_asset_is_local() -> None:
    """No CDN: nothing in the dashboard points off the origin (SVG's namespace is a name)."""
    files = [p for p in WEB.rglob("*") if p.suffix in {".html", ".js", ".css", ".svg"}]
    assert len(files) > 10
    for path in files:
        for url in re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", path.read_text()):
            assert url.startswith("http://www.w3.org/"), f"{path.name} loads {url}"
    index = (WEB / "index.html").read_text()
    for asset in re.findall(r'(?:src|href)="(/assets/[^"]+)"', index):
        assert (WEB / asset.removeprefix("/")).is_file(), asset


def test_stats_count_by_status_and_bucket_by_minute(harness: Harness) -> None:
    image = harness.upload("api/stats.jpg", sample("night.jpg"))
    done = harness.wait(harness.start("image_pipeline", image))
    assert done["status"] == "COMPLETED"
    failed = harness.wait(harness.start("image_pipeline", f"s3://{harness.bucket}/api/none.jpg"))
    assert failed["status"] == "FAILED"

    stats: dict[str, Any] = harness.api.get("/api/stats?window_minutes=5").json()
    for status, count in stats["counts"].items():
        listed = harness.api.get("/api/workflows", params={"status": status, "limit": 1})
        assert listed.json()["total"] == count, status
    minutes = stats["minutes"]
    assert len(minutes) == 5 == stats["window_minutes"]
    # As instants, not strings: "…:00Z" sorts after "…:00.127Z" as text.
    starts = [datetime.fromisoformat(m["minute"]) for m in minutes]
    assert starts == sorted(starts) and starts[-1] <= datetime.fromisoformat(stats["now"])
    assert sum(m["completed"] for m in minutes) >= 1
    assert sum(m["failed"] for m in minutes) >= 1
    assert sum(m["created"] for m in minutes) >= 2
    latency = stats["latency"]
    assert latency["count"] >= 1
    assert 0 < latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert stats["tasks"]["finished"] >= 3 and stats["tasks"]["run_p50_ms"] > 0
    assert harness.api.get("/api/stats?window_minutes=0").status_code == 422
    assert harness.api.get("/api/stats?window_minutes=1441").status_code == 422


def test_active_runs_and_the_cdi_directory_while_a_task_runs(
    harness: Harness, napping: str
) -> None:
    run_id = harness.start(napping, harness.upload("api/nap.jpg", sample("blue_sky.jpg")))

    def napping_run() -> dict[str, Any] | None:
        active = harness.api.get("/api/task-runs/active").json()
        mine = [r for r in active if r["workflow_id"] == run_id and r["status"] == "RUNNING"]
        return mine[0] if mine and mine[0]["ref"] == "nap" else None

    nap = wait_for(napping_run, "the nap to run", timeout=60)
    worker = nap["worker_id"]
    assert worker in harness.stack.worker_ids
    only = harness.api.get("/api/task-runs/active", params={"worker": worker}).json()
    assert nap["id"] in [r["id"] for r in only] and all(r["worker_id"] == worker for r in only)

    def holding() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        # The minions report to the directory asynchronously (a 0.2 s linger): wait for it.
        directory = harness.api.get("/api/cdi/objects").json()
        held = [o for o in directory["objects"] if o["workflow_id"] == run_id]
        return (directory, held) if held and held[0]["owner"] == worker else None

    directory, held = wait_for(holding, "the directory to show the worker's object", timeout=10)
    assert len(held) == 1, directory
    assert held[0]["owner"] == worker and held[0]["size"] > 0 and held[0]["host"]
    assert held[0]["key"].startswith(f"wf-{run_id}-") and held[0]["age_s"] >= 0
    assert directory["total_bytes"] == sum(o["size"] for o in directory["objects"])
    assert [m["alive"] for m in directory["minions"]] == [True]

    assert harness.wait(run_id)["status"] == "COMPLETED"
    assert not [r for r in harness.api.get("/api/task-runs/active").json()
                if r["workflow_id"] == run_id]  # fmt: skip

    def released() -> bool:
        objects = harness.api.get("/api/cdi/objects").json()["objects"]
        return not [o for o in objects if o["workflow_id"] == run_id]

    wait_for(released, "the run's object to leave the directory", timeout=30)


def test_the_cdi_directory_answers_503_when_the_controller_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CDI_CONTROLLER_URL", raising=False)
    with pytest.raises(ServiceError, match="CDI_CONTROLLER_URL is not set"):
        cdi_directory()
    monkeypatch.setenv("CDI_CONTROLLER_URL", "grpc://127.0.0.1:1")
    with pytest.raises(ServiceError, match="did not answer") as caught:
        cdi_directory()
    assert caught.value.service == "cdi-controller"
    monkeypatch.setenv("CDI_CONTROLLER_URL", "http://nope")
    with pytest.raises(ServiceError):
        cdi_directory()


def test_object_keys_name_their_workflow() -> None:
    run_id = "0713b3ce-4d6e-4df7-9993-d54c0a16afd0"
    assert str(workflow_of(f"wf-{run_id}-2")) == run_id
    assert str(workflow_of(f"wf-{run_id}-a1b2c3-2")) == run_id  # a run driven again
    for key in ("frame-1", f"wf-{run_id}", f"wf-{run_id}-x", f"xwf-{run_id}-1"):
        assert workflow_of(key) is None


def test_images_are_described_and_thumbnailed(harness: Harness) -> None:
    data = sample("green_field.jpg")
    with Image.open(io.BytesIO(data)) as original:
        size = original.size
    done = harness.wait(harness.start("image_pipeline", harness.upload("api/img.jpg", data)))
    assert done["status"] == "COMPLETED"
    images = harness.api.get(f"/api/workflows/{done['id']}/images").json()
    for role, fmt in (("input", "JPEG"), ("result", "PNG")):
        image = images[role]
        assert image["available"] and image["problem"] is None, image
        assert (image["width"], image["height"]) == size and image["format"] == fmt
        reply = harness.api.get(image["thumbnail_url"])
        assert reply.status_code == 200 and reply.headers["content-type"] == "image/jpeg"
        assert "max-age" in reply.headers["cache-control"]
        with Image.open(io.BytesIO(reply.content)) as thumb:
            assert max(thumb.size) <= THUMBNAIL_EDGE and thumb.format == "JPEG"
        etag = reply.headers["etag"]
        again = harness.api.get(image["thumbnail_url"], headers={"If-None-Match": etag})
        assert again.status_code == 304 and not again.content


def test_images_say_why_there_is_no_picture(harness: Harness) -> None:
    missing = harness.wait(
        harness.start("image_pipeline", f"s3://{harness.bucket}/api/missing.jpg")
    )
    images = harness.api.get(f"/api/workflows/{missing['id']}/images").json()
    assert not images["input"]["available"] and "does not exist" in images["input"]["problem"]
    assert images["input"]["thumbnail_url"] is None
    assert "FAILED" in images["result"]["problem"]
    for role in ("input", "result"):
        assert harness.api.get(f"/api/workflows/{missing['id']}/images/{role}").status_code == 404

    text = harness.upload("api/text.jpg", b"plain text, not a picture " * 20)
    broken = harness.wait(harness.start("image_pipeline", text))
    images = harness.api.get(f"/api/workflows/{broken['id']}/images").json()
    assert "not a recognised image" in images["input"]["problem"]
    reply = harness.api.get(f"/api/workflows/{broken['id']}/images/input")
    assert reply.status_code == 422 and "not a recognised image" in reply.json()["detail"]

    unknown = "00000000-0000-4000-8000-000000000000"
    assert harness.api.get(f"/api/workflows/{unknown}/images").status_code == 404
    assert harness.api.get(f"/api/workflows/{unknown}/images/sideways").status_code == 422


# --- S3 by policy: what a caller may make cdiflow read ----------------------------------------


def _stored_run(harness: Harness, image: str) -> str:
    """A run whose input no API call would accept now (stored before the policy, or by other
    means): the scheduler picks it up like any other."""
    engine = make_engine(harness.stack.services.database_url, pooled=False)
    try:
        with make_session_factory(engine)() as session:
            row = repo.create_workflow(session, "image_pipeline", {"image": image})
            session.commit()
            return str(row.id)
    finally:
        engine.dispose()


def test_an_input_outside_the_s3_policy_is_refused_and_never_read(harness: Harness) -> None:
    """The confused deputy: a bucket the caller cannot reach, read with cdiflow's keys."""
    harness.s3.create_bucket(Bucket="private-other")
    harness.s3.put_object(Bucket="private-other", Key="secret.jpg", Body=sample("night.jpg"))
    secret = "s3://private-other/secret.jpg"
    body = {"workflow": "image_pipeline", "input": {"image": secret}}
    refused = harness.api.post("/api/workflows", json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "s3_not_allowed"
    assert "CDIFLOW_S3_INPUTS" in refused.json()["detail"]

    stored = _stored_run(harness, secret)
    images = harness.api.get(f"/api/workflows/{stored}/images").json()
    assert not images["input"]["available"] and "outside" in images["input"]["problem"]
    thumbnail = harness.api.get(f"/api/workflows/{stored}/images/input")
    assert thumbnail.status_code == 422 and "outside" in thumbnail.json()["detail"]
    done = harness.wait(stored)  # the worker refuses the read too, and no retry asks again
    assert done["status"] == "FAILED" and "outside" in done["error"], done["error"]
    assert [r["attempt"] for r in done["task_runs"]] == [1]
    retry = harness.api.post(f"/api/workflows/{stored}/retry")
    assert retry.status_code == 422 and retry.json()["code"] == "s3_not_allowed"


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("in/../secret.jpg", "'..' segment"),
        ("./x.jpg", "'.' or '..' segment"),
        ("in//x.jpg", "empty segment"),
        ("in/x\x00.jpg", "NUL character"),  # refused with the body, before the URI
        ("in/x\n.jpg", "control character"),
    ],
)
def test_an_s3_key_no_store_can_hold_is_a_422_not_a_retry(
    harness: Harness, key: str, says: str
) -> None:
    uri = f"s3://{harness.bucket}/{key}"
    body = {"workflow": "image_pipeline", "input": {"image": uri}}
    refused = harness.api.post("/api/workflows", json=body)
    assert refused.status_code == 422, refused.text
    assert says in str(refused.json()["detail"])
    if "\x00" in key:
        return  # Postgres cannot store it at all, so no run can hold it
    done = harness.wait(_stored_run(harness, uri))
    assert done["status"] == "FAILED" and says in done["error"], done["error"]
    assert [r["attempt"] for r in done["task_runs"]] == [1]  # failed for good, not retried
