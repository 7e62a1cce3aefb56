"""The OpenAPI fuzzer (schemathesis) against the real API process: no input may earn a 5xx,
and every answer must match the schema the API publishes.

The API runs as it does in a stack (``python -m orchestrator.controller`` under uvicorn) on a
database of its own, with a CDI controller and the session's Redis and S3, so a 5xx can only
be the API's own fault. The fuzzer sends the admin key: every route is reached, and every
route that changes state is fuzzed too. Bounded: ``EXAMPLES`` cases an operation, with
Hypothesis derandomized so a run is repeatable (the bad inputs it found once are kept as
plain tests in ``test_api_bad_input.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from cdi.controller.process import ControllerChild
from orchestrator.apikeys import generate_key
from orchestrator.child_process import free_port
from orchestrator.controller import create_app
from orchestrator.services import RunningServices
from orchestrator.settings import load_settings

Operation = APIOperation[Any, Any, Any, Any]

EXAMPLES: Final = 40
FUZZ_REDIS_DB: Final = 14
CHECKS: Final = [not_a_server_error, response_schema_conformance, status_code_conformance]


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
    command = [sys.executable, "-m", "orchestrator.controller", "--port", str(port),
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


def _cases() -> list[Any]:
    """Every operation of the API's schema (as the code under test publishes it: made here,
    without a server), with valid inputs (``positive``) and, where it takes any input at all,
    inputs the schema forbids (``negative``)."""
    return [
        pytest.param(operation, mode, id=f"{operation.label}-{mode.value}")
        for operation in _operations()
        if operation.label not in NOT_FUZZED
        for mode in GenerationMode
        if mode == GenerationMode.POSITIVE or _takes_input(operation)
    ]


# Not fuzzed: it takes no input, and answers 503 by design while a part is missing (the fuzzed
# API has no minion and no scheduler); tests/orchestrator/test_api.py covers it.
NOT_FUZZED: Final = {"GET /api/readyz"}


def _takes_input(operation: Operation) -> bool:
    raw = operation.definition.raw
    return bool(raw.get("parameters") or raw.get("requestBody") or raw.get("security"))


def _operations() -> list[Operation]:
    settings = load_settings(
        database_url="postgresql://nobody@localhost/none",
        redis_url="redis://localhost:1/0",
        admin_key=generate_key(),
    )
    api = schemathesis.openapi.from_dict(create_app(settings).openapi())
    operations = []
    for result in api.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # the API's own schema must be valid
        operations.append(result.ok())
    return operations


@pytest.mark.parametrize(("operation", "mode"), _cases())
def test_no_input_earns_a_server_error_or_breaks_the_schema(
    operation: Operation, mode: GenerationMode, fuzz_target: FuzzTarget
) -> None:

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: Any) -> None:
        case.call_and_validate(
            base_url=fuzz_target.url,
            headers={"Authorization": f"Bearer {fuzz_target.key}"},
            checks=CHECKS,
            timeout=30,
        )

    call()
