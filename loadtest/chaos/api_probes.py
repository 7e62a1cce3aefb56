"""What the API answers, asked while a fault holds: a person's requests, not the workload's.

``s3_routes`` asks the two routes that reach S3 themselves (an upload, a result download) and
returns each answer as ``"<status> <code>"``: while S3 is down each must say so (503 with the
error's code), never fail with a 500.
"""

from __future__ import annotations

import io

import httpx
from PIL import Image

from loadtest.chaos.workload import api_client
from orchestrator.stack import Stack

__all__ = ["s3_routes"]


def s3_routes(stack: Stack) -> dict[str, str]:
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(png, "PNG")
    answers: dict[str, str] = {}
    with api_client(stack) as api:
        upload = api.post("/api/inputs", files={"file": ("probe.png", png.getvalue())})
        answers["POST /api/inputs"] = _described(upload)
        done = api.get("/api/workflows", params={"status": "COMPLETED", "limit": 1})
        items = done.json()["items"] if done.status_code == 200 else []
        if items:
            result = api.get(f"/api/workflows/{items[0]['id']}/result")
            answers["GET /api/workflows/{id}/result"] = _described(result)
    return answers


def _described(reply: httpx.Response) -> str:
    try:
        code = reply.json().get("code", "")
    except ValueError:
        code = "(not JSON)"
    return f"{reply.status_code} {code}".strip()
