"""The OpenAPI fuzzer, schemathesis with every check (`st run --checks all`), against the real
API process: no input may earn a 5xx; every answer, status, header and content type must be the
ones the API publishes; what the schema allows must be accepted and what it forbids refused;
an unsupported method gets 405 naming the supported ones; a resource made can be read, and one
deleted cannot; a route with a key refuses a request without one.

The API runs as it does in a stack (``python -m orchestrator.controller`` under uvicorn) on a
database of its own, with a CDI controller and the session's Redis and S3, so a 5xx can only
be the API's own fault. The fuzzer sends the admin key (from its environment, not a command
line): every route is reached, and every route that changes state is fuzzed too. All four
phases run (the schema's examples, its boundaries, random inputs, and chains of calls that
follow the links between operations), ``EXAMPLES`` cases an operation each, from a fixed seed
so a run is repeatable; the bad inputs it found are kept as plain tests in
``test_api_bad_input.py``.

The schema states every rule a request's fields must meet on their own. It cannot state rules
that depend on what the server holds or runs, or that tie one part of a request to another; for
the operations below, and for that reason alone, a 422 may answer a request the schema allows
(``positive_data_acceptance``), and every other check holds as everywhere else:

* ``POST /api/tasks``, ``PUT /api/tasks/{name}``: the module must be in a package or folder
  the API's configuration allows, be a ``@task`` and have been loaded by a live worker (this
  API has none); for ``PUT``, the body's name must be the path's;
* ``POST /api/workflow-definitions``, ``PUT /api/workflow-definitions/{name}``: the steps must
  form a graph (every ``depends_on`` and input names a step of it, no cycle, a switch's cases
  name its steps) of registered tasks; for ``PUT``, the body's name must be the path's;
* ``POST /api/workflows``: the input image must lie under one of the configured input
  prefixes, and the definition's steps must suit the data plane asked for;
* ``POST /api/inputs``: the file must be of a type the upload policy allows, found from its
  bytes, which no JSON Schema says;
* ``POST /api/schedules``: the cron expression must parse, the time zone must be one this
  server's time zone database names, and the workflow (and version) must exist;
* ``GET /api/workflows``: its ``input`` filter is a JSON object the runs' input contains, and
  a string parameter's schema cannot say "JSON".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import pytest

from cdi.controller.process import ControllerChild
from orchestrator.apikeys import generate_key
from orchestrator.child_process import free_port
from orchestrator.services import RunningServices

EXAMPLES: Final = 20
SEED: Final = 20261204
FUZZ_REDIS_DB: Final = 14
# What may answer a request its schema allows, on the operations whose other rules no schema
# states (the module docstring says which rules): schemathesis' own list, and 422.
STATE_DEPENDENT: Final = (
    "POST /api/tasks",
    "PUT /api/tasks/{name}",
    "POST /api/workflow-definitions",
    "PUT /api/workflow-definitions/{name}",
    "POST /api/workflows",
    "POST /api/inputs",
    "POST /api/schedules",
    "POST /api/webhooks",  # its URL: http(s) with a host, no user, as urlsplit reads it
    "GET /api/workflows",
)
ACCEPTED: Final = '["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]'


class FuzzTarget:
    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the API exited while starting:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/healthz", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    pytest.fail(f"the API did not answer within 60 s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def fuzz_target(
    make_database: Callable[[str], str], redis_url: str, service_stack: RunningServices
) -> Iterator[FuzzTarget]:
    folder = Path(tempfile.mkdtemp(prefix="cdiflow-fuzz-"))
    key = generate_key()
    port = free_port()
    log = folder / "api.log"
    controller = ControllerChild(
        f"grpc://127.0.0.1:{free_port()}", log_path=str(folder / "controller.log")
    )
    controller.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDIFLOW_", "CDI_"))}
    env |= {
        "DATABASE_URL": make_database("fuzz"),
        "REDIS_URL": urlunsplit(urlsplit(redis_url)._replace(path=f"/{FUZZ_REDIS_DB}")),
        "S3_ENDPOINT_URL": service_stack.s3_endpoint_url, "S3_BUCKET": service_stack.s3_bucket,
        "AWS_REGION": service_stack.aws_region,
        "AWS_ACCESS_KEY_ID": service_stack.aws_access_key_id or "",
        "AWS_SECRET_ACCESS_KEY": service_stack.aws_secret_access_key or "",
        "CDIFLOW_DATA_DIR": str(folder), "CDIFLOW_ADMIN_KEY": key,
        "CDI_CONTROLLER_URL": controller.url,
        "CDI_CONTROLLER_TOKEN_FILE": str(controller.credentials.reader_token_file),
    }  # fmt: skip
    command = [sys.executable, "-P", "-m", "orchestrator.controller", "--port", str(port),
               "--log-level", "WARNING"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield FuzzTarget(url, key)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        controller.stop()
        errors = [line for line in log.read_text().splitlines() if " ERROR " in line]
        subprocess.run(["rm", "-rf", str(folder)], check=False)
    assert not errors, "the API logged errors while fuzzed:\n" + "\n".join(errors[:20])


def _config() -> str:
    """schemathesis.toml: the key from the environment, and 422 allowed on the operations
    whose other rules no schema states (and there only for data the schema allows)."""
    lines = ['headers = { Authorization = "Bearer ${CDIFLOW_FUZZ_KEY}" }',
             # A long poll asked to wait holds its request for up to 55 s (no run finishes
             # here): asked not to wait, the fuzzer covers everything else in that time.
             'parameters = { "query.wait_s" = 0 }', ""]  # fmt: skip
    for name in STATE_DEPENDENT:
        lines += [
            "[[operations]]",
            f'include-name = "{name}"',
            f"checks.positive_data_acceptance.expected-statuses = {ACCEPTED}",
            "",
        ]
    # Not ready is what /api/readyz says with a 503 (documented): this API has no scheduler.
    lines += [
        "[[operations]]",
        'include-name = "GET /api/readyz"',
        'checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]',
    ]
    return "\n".join(lines)


def test_the_api_is_what_its_openapi_document_says(fuzz_target: FuzzTarget, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config())
    st = Path(sys.executable).parent / "st"
    command = [str(st), "--config-file", str(config), "--no-color", "run",
               f"{fuzz_target.url}/api/openapi.json", "--checks", "all",
               "--max-examples", str(EXAMPLES), "--seed", str(SEED), "--workers", "1",
               "--generation-database", "none", "--request-timeout", "30",
               "--suppress-health-check", "all"]  # fmt: skip
    env = os.environ | {"CDIFLOW_FUZZ_KEY": fuzz_target.key}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900,
                          cwd=tmp_path, check=False)  # fmt: skip
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[report.find("FAILURES") :][:20000] or report[-5000:]
    # Every operation of the document, each phase passed: nothing was left out.
    selected = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", report)
    assert selected is not None, report[-3000:]
    assert selected[1] == selected[2] == selected[3] and int(selected[3]) >= 30, selected[0]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in report, report[-3000:]
