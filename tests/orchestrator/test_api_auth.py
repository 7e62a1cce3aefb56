"""The API as an attacker meets it: no key, a wrong key, a viewer's key, a wrong Host, another
origin. Real app on real Postgres and Redis; keys issued through the API itself."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.controller import create_app
from orchestrator.settings import Settings
from tests.orchestrator.api_support import KeyedCalls, admin_key_of, api_test_settings, keyed_client

IMAGE = {"image": "s3://cdiflow/images/cat.png"}
OPEN_PATHS = {"/api/healthz", "/api/readyz", "/api/openapi.json", "/docs", "/",
              "/docs/oauth2-redirect"}  # fmt: skip
READINESS_PARTS = {"postgres", "redis", "minion", "scheduler", "s3", "workers"}


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def issue(api_client: TestClient) -> Callable[[str], tuple[str, str]]:
    """Issues a key of a role through the API (as the admin): ``(name, key)``."""

    def make(role: str) -> tuple[str, str]:
        name = _unique(role)
        reply = api_client.post("/api/keys", json={"name": name, "role": role})
        assert reply.status_code == 201, reply.text
        return name, reply.json()["key"]

    return make


@pytest.fixture(scope="module")
def as_role(
    api_client: TestClient, issue: Callable[[str], tuple[str, str]]
) -> Callable[[str], KeyedCalls]:
    """Calls to the running app with a fresh key of the given role."""

    def make(role: str) -> KeyedCalls:
        _, key = issue(role)
        return KeyedCalls(api_client, key)

    return make


def _concrete(path: str) -> str:
    """A route path with every parameter filled in."""
    values = {"workflow_id": str(uuid.uuid4()), "key_id": str(uuid.uuid4()), "role": "input"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], "noop"), path)


def _routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every documented route of the API (method, path), the open ones left out."""
    return sorted(
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        for method in operations
        if path not in OPEN_PATHS
    )


# --- no key, a wrong key -----------------------------------------------------------------


def test_every_api_route_but_health_refuses_a_client_without_a_key(
    api_app: FastAPI, api_client: TestClient
) -> None:
    routes = _routes(api_app)
    assert len(routes) >= 20, routes  # the walk covers the API, not an empty list
    anonymous = KeyedCalls(api_client, None)
    for method, path in routes:
        reply = anonymous.request(method, _concrete(path), json={})
        assert reply.status_code == 401, (method, path, reply.status_code, reply.text)
        assert reply.headers["www-authenticate"] == "Bearer"
        assert reply.json()["code"] == "unauthenticated"
        assert "Authorization: Bearer" in reply.json()["detail"]
    assert anonymous.get("/api/healthz").status_code == 200  # probes need no key


def test_readyz_tells_an_anonymous_caller_ready_or_not_and_nothing_more(
    api_client: TestClient, as_role: Callable[[str], KeyedCalls]
) -> None:
    """Probes need no key, so ``/api/readyz`` answers without one, but only its status code
    and ``ok``/``unavailable``: which part is missing and what it said (an object count, a
    scheduler's id) needs a key of any role. A key that is sent must be valid."""
    anonymous = KeyedCalls(api_client, None).get("/api/readyz")
    viewer = as_role("viewer").get("/api/readyz")
    assert anonymous.status_code in (200, 503) and viewer.status_code in (200, 503)
    status = "ok" if anonymous.status_code == 200 else "unavailable"
    assert anonymous.json() == {"status": status}
    assert set(viewer.json()["checks"]) == READINESS_PARTS
    forged = api_client.get("/api/readyz", headers={"Authorization": "Bearer cdf_" + "A" * 43})
    assert forged.status_code == 401


@pytest.mark.parametrize(
    "header",
    [
        "Bearer cdf_" + "A" * 43,  # the right shape, never issued
        "Bearer short",
        "Basic YWRtaW46YWRtaW4=",
        "Bearer " + "x" * 300,
        "cdf_" + "A" * 43,  # no scheme
    ],
)
def test_a_wrong_or_malformed_key_is_refused(api_client: TestClient, header: str) -> None:
    reply = api_client.get("/api/workflows", headers={"Authorization": header})
    assert reply.status_code == 401, reply.text
    assert reply.json()["code"] == "unauthenticated"


# --- roles ----------------------------------------------------------------------------------


def test_a_viewer_reads_but_changes_nothing(
    api_client: TestClient, as_role: Callable[[str], KeyedCalls]
) -> None:
    viewer = as_role("viewer")
    for path in ("/api/workflows", "/api/tasks", "/api/workflow-definitions", "/api/workers",
                 "/api/stats", "/api/task-runs/active", "/api/whoami"):  # fmt: skip
        assert viewer.get(path).status_code == 200, path
    started = api_client.post("/api/workflows", json={"workflow": "noop_pipeline", "input": {}})
    run = started.json()["id"]
    attempts = [
        ("POST", "/api/workflows", {"workflow": "noop_pipeline", "input": {}}),
        ("POST", f"/api/workflows/{run}/cancel", None),
        ("POST", f"/api/workflows/{run}/retry", None),
        ("POST", "/api/tasks", {"name": _unique("t"), "module": "workflows.image_tasks:noop"}),
        ("DELETE", "/api/tasks/noop", None),
        ("POST", "/api/workflow-definitions", {"name": _unique("w"), "tasks": []}),
        ("POST", "/api/keys", {"name": _unique("k"), "role": "admin"}),
        ("GET", "/api/keys", None),
    ]
    for method, path, body in attempts:
        reply = viewer.request(method, path, json=body)
        assert reply.status_code == 403, (method, path, reply.text)
        assert reply.json()["code"] == "forbidden"
        assert "role viewer" in reply.json()["detail"]
    assert api_client.get(f"/api/workflows/{run}").json()["status"] == "PENDING"  # not cancelled


def test_an_operator_runs_workflows_but_defines_nothing(
    as_role: Callable[[str], KeyedCalls],
) -> None:
    operator = as_role("operator")
    started = operator.post("/api/workflows", json={"workflow": "noop_pipeline", "input": {}})
    assert started.status_code == 201, started.text
    run = started.json()["id"]
    assert operator.post(f"/api/workflows/{run}/cancel").status_code == 200
    assert operator.post(f"/api/workflows/{run}/retry").status_code == 201
    task = {"name": _unique("t"), "module": "workflows.image_tasks:noop"}
    assert operator.post("/api/tasks", json=task).status_code == 403
    flow = {"name": _unique("w"), "tasks": [{"ref": "a", "task": "noop"}]}
    assert operator.post("/api/workflow-definitions", json=flow).status_code == 403
    assert operator.get("/api/keys").status_code == 403


def test_workflows_record_who_started_cancelled_and_retried_them(
    as_role: Callable[[str], KeyedCalls], api_client: TestClient
) -> None:
    alice, bob = as_role("operator"), as_role("operator")
    alice_name = alice.get("/api/whoami").json()["name"]
    bob_name = bob.get("/api/whoami").json()["name"]
    started = alice.post("/api/workflows", json={"workflow": "noop_pipeline", "input": IMAGE})
    run = started.json()
    assert run["started_by"] == alice_name
    assert alice.post(f"/api/workflows/{run['id']}/cancel").json()["error"] == (
        f"cancelled by {alice_name}"
    )
    retried = bob.post(f"/api/workflows/{run['id']}/retry").json()
    assert retried["started_by"] == bob_name and retried["retry_of"] == run["id"]
    listed = api_client.get("/api/workflows", params={"limit": 200}).json()["items"]
    by_id = {w["id"]: w["started_by"] for w in listed}
    assert by_id[run["id"]] == alice_name and by_id[retried["id"]] == bob_name
    detail = api_client.get(f"/api/workflows/{run['id']}").json()
    assert detail["started_by"] == alice_name
    created = [e for e in detail["events"] if e["kind"] == "workflow.created"]
    assert created[0]["data"]["by"] == alice_name


# --- keys -----------------------------------------------------------------------------------


def test_keys_are_issued_listed_and_revoked_by_an_admin(
    api_client: TestClient,
    api_sessions: sessionmaker[Session],
    issue: Callable[[str], tuple[str, str]],
) -> None:
    name, key = issue("viewer")
    assert key.startswith("cdf_") and len(key) >= 40
    holder = KeyedCalls(api_client, key)
    me = holder.get("/api/whoami").json()
    assert (me["name"], me["role"]) == (name, "viewer")
    listed = {k["name"]: k for k in api_client.get("/api/keys").json()}
    assert listed[name]["created_by"] == "admin" and listed["admin"]["configured"] is True
    assert not any("key" in k or "key_hash" in k for k in listed.values())  # no secret listed
    with api_sessions() as session:  # at rest: the SHA-256 digest, never the key
        stored = session.execute(
            text("SELECT key_hash FROM api_keys WHERE name = :name"), {"name": name}
        ).scalar_one()
        assert stored == hashlib.sha256(key.encode()).hexdigest()
        everything = session.execute(text("SELECT row_to_json(k)::text FROM api_keys k")).all()
        assert not any(key in row[0] for row in everything)
    assert api_client.delete(f"/api/keys/{me['id']}").status_code == 204
    assert holder.get("/api/whoami").status_code == 401  # at once, in this process
    assert api_client.delete(f"/api/keys/{me['id']}").status_code == 404


def test_key_names_are_unique_and_the_configured_admin_key_stays(
    api_client: TestClient, issue: Callable[[str], tuple[str, str]]
) -> None:
    name, _ = issue("viewer")
    again = api_client.post("/api/keys", json={"name": name})
    assert again.status_code == 409 and "exists already" in again.json()["detail"]
    reserved = api_client.post("/api/keys", json={"name": "admin", "role": "admin"})
    assert reserved.status_code == 422
    bad_role = api_client.post("/api/keys", json={"name": _unique("k"), "role": "root"})
    assert bad_role.status_code == 422
    admin = next(k for k in api_client.get("/api/keys").json() if k["name"] == "admin")
    refused = api_client.delete(f"/api/keys/{admin['id']}")
    assert refused.status_code == 409 and "CDIFLOW_ADMIN_KEY" in refused.json()["detail"]
    assert api_client.get("/api/whoami").json()["role"] == "admin"


def test_the_api_does_not_start_without_an_admin_key(api_settings: Settings) -> None:
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError, match="CDIFLOW_ADMIN_KEY"):
        create_app(api_settings.model_copy(update={"admin_key": None}))


def test_an_admin_key_file_must_be_private(
    api_settings: Settings, tmp_path: Path, api_redis: redis.Redis
) -> None:
    from orchestrator.errors import ConfigError

    path = tmp_path / "api-key"
    path.write_text(admin_key_of(api_settings) + "\n")
    path.chmod(0o644)
    shared = api_settings.model_copy(update={"admin_key": None, "admin_key_file": path})
    with pytest.raises(ConfigError, match="chmod 600"):
        create_app(shared)
    path.chmod(0o600)
    with keyed_client(create_app(shared), admin_key_of(api_settings)) as client:
        assert client.get("/api/whoami").json()["name"] == "admin"


def _manifest_admin_key() -> str:
    """The example admin key the Kubernetes manifests ship with (deploy/k8s/config.yaml)."""
    config = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "config.yaml"
    [secret] = [d for d in yaml.safe_load_all(config.read_text())
                if d and d["metadata"]["name"] == "cdiflow-api-key"]  # fmt: skip
    return str(secret["stringData"]["CDIFLOW_ADMIN_KEY"])


PLACEHOLDERS = [_manifest_admin_key(), "your-admin-key-here-0123456789-abcdefgh", "x" * 40]


@pytest.mark.parametrize("key", PLACEHOLDERS)
def test_the_api_refuses_to_start_with_a_placeholder_admin_key(
    api_settings: Settings, tmp_path: Path, key: str
) -> None:
    """A forgotten edit must not deploy a published key: the manifests' example key, or one
    that reads like an example, stops the API at its start, given directly or in a file."""
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError, match="CDIFLOW_ADMIN_KEY is not a secret"):
        create_app(api_settings.model_copy(update={"admin_key": SecretStr(key)}))
    path = tmp_path / "api-key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    in_file = api_settings.model_copy(update={"admin_key": None, "admin_key_file": path})
    with pytest.raises(ConfigError, match=r"CDIFLOW_ADMIN_KEY_FILE: .* is not a secret"):
        create_app(in_file)


def test_the_api_process_exits_saying_its_admin_key_is_a_placeholder(tmp_path: Path) -> None:
    """As a pod would start it: the process ends at once with the reason, before it connects
    to anything (the URLs point nowhere)."""
    env = {
        "PATH": os.environ["PATH"],
        "CDIFLOW_ADMIN_KEY": _manifest_admin_key(),
        "DATABASE_URL": "postgresql+psycopg://cdiflow:x@127.0.0.1:9/cdiflow",
        "REDIS_URL": "redis://127.0.0.1:9/0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.controller", "--port", "9"],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "CDIFLOW_ADMIN_KEY: not a secret: it is a placeholder" in done.stderr
    assert _manifest_admin_key() not in done.stderr + done.stdout


def test_the_api_refuses_a_controller_token_that_is_no_readers(
    api_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a CDI controller to read, the token it was given must be a reader's: a placeholder
    left in a Secret, or a minion's token, stops the API at its start, never repeated."""
    from cdi.auth import ANY_HOST, Role, mint_token, new_key
    from orchestrator.errors import ConfigError

    monkeypatch.setenv("CDI_CONTROLLER_URL", "grpc://127.0.0.1:9")
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN_FILE", raising=False)
    placeholder = "CHANGE-ME: the reader.token file of cdiflow cdi credentials"
    monkeypatch.setenv("CDI_CONTROLLER_TOKEN", placeholder)
    with pytest.raises(ConfigError, match=r"CDI_CONTROLLER_TOKEN .*not a CDI token") as refused:
        create_app(api_settings)
    assert placeholder not in str(refused.value)
    monkeypatch.setenv("CDI_CONTROLLER_TOKEN", mint_token(new_key(), Role.MINION, ANY_HOST))
    with pytest.raises(ConfigError, match="this process needs a reader token"):
        create_app(api_settings)
    monkeypatch.setenv("CDI_CONTROLLER_TOKEN", mint_token(new_key(), Role.READER, "api"))
    create_app(api_settings)  # a reader's: the controller alone can tell if its key signed it


# --- hosts and origins -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/healthz", "/api/workflows", "/", "/docs"])
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.2", ""])
def test_a_request_for_another_host_gets_400(api_client: TestClient, path: str, host: str) -> None:
    """DNS rebinding: a page on evil.example pointed at 127.0.0.1 sends its own Host."""
    reply = api_client.get(path, headers={"Host": host})
    assert reply.status_code == 400, reply.text
    assert reply.json()["code"] == "bad_host"
    assert "CDIFLOW_ALLOWED_HOSTS" in reply.json()["detail"]


def test_allowed_hosts_take_ports_and_wildcards(
    tmp_path: Path, api_database_url: str, api_redis_url: str, api_redis: redis.Redis
) -> None:
    settings = api_test_settings(
        tmp_path, api_database_url, api_redis_url, allowed_hosts="api.example.com,*.corp.example"
    )
    with keyed_client(create_app(settings), admin_key_of(settings)) as client:
        for host, status in [("api.example.com:443", 200), ("a.b.corp.example", 200),
                             ("corp.example", 400), ("api.example.com.evil", 400),
                             ("testserver", 400)]:  # fmt: skip
            assert client.get("/api/whoami", headers={"Host": host}).status_code == status, host


def test_cross_origin_calls_get_no_cors_headers_unless_configured(
    api_client: TestClient,
    tmp_path: Path,
    api_database_url: str,
    api_redis_url: str,
    api_redis: redis.Redis,
) -> None:
    preflight = {
        "Origin": "https://evil.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    refused = api_client.options("/api/workflows", headers=preflight)
    assert "access-control-allow-origin" not in refused.headers
    plain = api_client.get("/api/workflows", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in plain.headers
    settings = api_test_settings(
        tmp_path, api_database_url, api_redis_url, cors_origins="https://app.example.com"
    )
    with keyed_client(create_app(settings), admin_key_of(settings)) as client:
        allowed = client.options(
            "/api/workflows", headers=preflight | {"Origin": "https://app.example.com"}
        )
        assert allowed.headers["access-control-allow-origin"] == "https://app.example.com"
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
        other = client.options("/api/workflows", headers=preflight)
        assert "access-control-allow-origin" not in other.headers
