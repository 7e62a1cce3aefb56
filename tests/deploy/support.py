"""What the container tests check on a running stack, whichever way it was started (the stack
as containers, or the Kubernetes manifests played with podman): ``image_pipeline`` under
``transfer`` on the bundled photo, several runs at once so that tasks go to the workers of both
hosts, each result's pixels against the reference computed here, and hand-offs that crossed
between hosts."""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from loadtest.chaos.workload import pixels_digest
from workflows.image_tasks import reference_pipeline

PHOTO = Path(__file__).resolve().parents[2] / "workflows" / "samples" / "sunset.jpg"


def require_podman_stack() -> None:
    """Skip (saying why) where no podman can run the stack, or fail where ``$CI`` says it
    must: root's podman and the images `make image` builds."""
    import shutil

    from deploy.containers.images import SOURCE_LABEL, images, source_digest
    from deploy.containers.podman import exists, podman

    reason = None
    if shutil.which("podman") is None:
        reason = "podman is not installed (`make test` installs it as root)"
    elif os.geteuid() != 0:
        reason = "the stack as containers needs root's podman"
    else:
        missing = [ref for ref in images().all().values() if not exists("image", ref)]
        if missing:
            reason = f"images {missing} are missing: `make image` builds them"
        else:
            label = '{{index .Labels "' + SOURCE_LABEL + '"}}'
            built_from = podman("image", "inspect", "--format", label, images().product)
            if built_from.strip() != source_digest():
                reason = (f"{images().product} was built from other sources than the working "
                          "tree's: `make image` builds it again")  # fmt: skip
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def run_pipelines(api_url: str, headers: dict[str, str], runs: int = 4) -> list[dict[str, Any]]:
    """``runs`` image_pipeline runs under transfer at once, each waited for; every one must
    complete with the reference's pixels and label. Their details (task runs, hand-offs)."""
    expected_image, expected_label = reference_pipeline(Image.open(PHOTO))
    with httpx.Client(base_url=api_url, headers=headers, timeout=120) as api:
        uploaded = api.post("/api/inputs", files={"file": (PHOTO.name, PHOTO.read_bytes())})
        assert uploaded.status_code == 201, uploaded.text
        body = {"workflow": "image_pipeline", "input": {"image": uploaded.json()["uri"]},
                "policy": "transfer"}  # fmt: skip

        def one(_: int) -> dict[str, Any]:
            started = api.post("/api/workflows", json=body)
            assert started.status_code == 201, started.text
            done = api.get(f"/api/workflows/{started.json()['id']}", params={"wait_s": 55})
            assert done.status_code == 200, done.text
            detail: dict[str, Any] = done.json()
            assert detail["status"] == "COMPLETED", detail
            assert detail["output"]["label"] == expected_label
            result = api.get(f"/api/workflows/{detail['id']}/result")
            assert result.status_code == 200, result.text
            got = Image.open(io.BytesIO(result.content))
            assert pixels_digest(got) == pixels_digest(expected_image), "wrong pixels"
            return detail

        with ThreadPoolExecutor(runs) as pool:
            return list(pool.map(one, range(runs)))


def run_forks(api_url: str, headers: dict[str, str], runs: int = 2) -> list[dict[str, Any]]:
    """``runs`` fork_join_pipeline runs under transfer, one after the other, each completed:
    their two branches start side by side on the two (idle) workers, one a host, and the join
    reads both through the scheduler, so a branch's object crosses between the hosts (a
    chain's goes straight from worker to worker, and only where its next step runs on the
    other host). Their details."""
    with httpx.Client(base_url=api_url, headers=headers, timeout=120) as api:
        uploaded = api.post("/api/inputs", files={"file": (PHOTO.name, PHOTO.read_bytes())})
        assert uploaded.status_code == 201, uploaded.text
        body = {"workflow": "fork_join_pipeline", "input": {"image": uploaded.json()["uri"]},
                "policy": "transfer"}  # fmt: skip
        details = []
        for _ in range(runs):
            started = api.post("/api/workflows", json=body)
            assert started.status_code == 201, started.text
            done = api.get(f"/api/workflows/{started.json()['id']}", params={"wait_s": 55})
            assert done.status_code == 200 and done.json()["status"] == "COMPLETED", done.text
            details.append(done.json())
        return details


def crossings(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hand-offs that crossed between two hosts."""
    return [h for d in details for h in d["handoffs"]
            if h["from_host"] and h["to_host"] and h["from_host"] != h["to_host"]]  # fmt: skip
