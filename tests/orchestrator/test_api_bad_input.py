"""Bad input gets a 422 that says what to fix, never a 500: NUL bytes, lone surrogates, NaN,
infinities, integers past what Postgres holds, strings past a column's length, deep nesting.
The fuzzer (``test_api_fuzz.py``) looks for more; these are the ones it found, kept."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

NOOP = "noop_pipeline"


def _post_raw(client: TestClient, path: str, text: str) -> Any:
    """POST a body as written (NaN and lone surrogate escapes are not what json.dumps makes)."""
    return client.post(path, content=text, headers={"content-type": "application/json"})


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _assert_422(reply: Any, *says: str) -> None:
    assert reply.status_code == 422, (reply.status_code, reply.text)
    text = reply.text
    for word in says:
        assert word in text, (word, text)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"workflow": "a\\u0000b", "input": {}}', "NUL"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": "a\\u0000b"}}}', "NUL"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"a\\u0000": 1}}}', "NUL"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": "\\ud800"}}}', "surrogate"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": "\\udfff x"}}}', "surrogate"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": NaN}}}', "finite"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": Infinity}}}', "finite"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": [-Infinity]}}}', "finite"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": 1e999}}}', "finite"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": -1e400}}}', "finite"),
        ('{"workflow": "' + NOOP + '", "input": {"data": {"k": ' + str(2**64) + "}}}", "64 bits"),
        ('{"workflow": "\\ud800", "input": {}}', "surrogate"),
        ('{"workflow": "' + "w" * 5000 + '", "input": {}}', "workflow"),
    ],
)
def test_bad_strings_and_numbers_in_a_start_are_422(
    api_client: TestClient, body: str, says: str
) -> None:
    _assert_422(_post_raw(api_client, "/api/workflows", body), says)


def test_deeply_nested_data_is_422(api_client: TestClient) -> None:
    deep = "[" * 70 + "]" * 70
    body = '{"workflow": "' + NOOP + '", "input": {"data": {"k": ' + deep + "}}}"
    _assert_422(_post_raw(api_client, "/api/workflows", body), "deeper than 64")
    too_deep = "[" * 100_000 + "]" * 100_000  # past what the JSON parser recurses into
    body = '{"workflow": "' + NOOP + '", "input": {"data": {"k": ' + too_deep + "}}}"
    _assert_422(_post_raw(api_client, "/api/workflows", body))


def test_huge_integers_and_other_text_are_422(api_client: TestClient) -> None:
    body = '{"workflow": "' + NOOP + '", "input": {"data": {"k": 1' + "0" * 5000 + "}}}"
    _assert_422(_post_raw(api_client, "/api/workflows", body), "64 bits")
    latin1 = '{"workflow": "caf\xe9", "input": {}}'.encode("latin-1")
    reply = api_client.post(
        "/api/workflows", content=latin1, headers={"content-type": "application/json"}
    )
    _assert_422(reply, "not UTF-8")


def test_a_strict_body_still_starts_a_run(api_client: TestClient) -> None:
    """The checks refuse what they must and nothing more."""
    data = {"n": 2**63 - 1, "m": -(2**63), "f": -2.5e-300, "s": "caf\u00e9 \U0001f600",
            "deep": [[[[{"ok": True}]]]]}  # fmt: skip
    reply = api_client.post("/api/workflows", json={"workflow": NOOP, "input": {"data": data}})
    assert reply.status_code == 201, reply.text
    assert reply.json()["input"]["data"] == data


@pytest.mark.parametrize(
    "query",
    [
        {"offset": str(2**63)},
        {"offset": "1" + "0" * 30},
        {"limit": str(2**70)},
        {"workflow": "a\x00b"},
        {"workflow": "w" * 500},
        {"created_after": "0000-01-01T00:00:00"},
        {"status": "\x00"},
    ],
)
def test_bad_query_values_are_422(api_client: TestClient, query: dict[str, str]) -> None:
    _assert_422(api_client.get("/api/workflows", params=query))


@pytest.mark.parametrize(
    "path",
    [
        "/api/tasks/a%00b",
        "/api/workflow-definitions/a%00b",
        "/api/tasks/" + "t" * 500,
        "/api/task-runs/active?worker=a%00b",
        "/api/workflows/7da66a6d-1b7b-4858-a662-dadabb0643d6?events=" + str(2**64),
        "/api/stats?window_minutes=" + str(2**64),
    ],
)
def test_bad_path_and_query_values_are_422(api_client: TestClient, path: str) -> None:
    reply = api_client.get(path)
    assert reply.status_code in (404, 422), (reply.status_code, reply.text)


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/api/tasks", '{"name": "t1", "module": "workflows.image_tasks:noop", '
                       '"description": "a\\u0000"}', "NUL"),
        ("/api/tasks", '{"name": "t2", "module": "workflows.image_tasks:noop", '
                       '"timeout_s": NaN}', "NaN is not a JSON number"),
        ("/api/tasks", '{"name": "t3", "module": "workflows.image_tasks:noop", '
                       '"retry_backoff_s": Infinity}', "Infinity is not a JSON number"),
        ("/api/tasks", '{"name": "t4", "module": "workflows.image_tasks:noop", '
                       '"retries": 1' + "0" * 30 + "}", "does not fit in 64 bits"),
        ("/api/tasks", '{"name": "t5", "module": "workflows.image_tasks:noop", '
                       '"timeout_s": 1e999}', "not a finite number"),
        ("/api/workflow-definitions", '{"name": "d1", "description": "\\ud800", '
                                      '"tasks": [{"ref": "a", "task": "noop"}]}', "surrogate"),
        ("/api/workflow-definitions", '{"name": "d2", "tasks": [{"ref": "a", "task": "noop", '
                                      '"params": {"x": NaN}}]}', "finite"),
        ("/api/workflow-definitions", '{"name": "d3", "tasks": [{"ref": "a", "task": "noop", '
                                      '"params": {"x": "\\u0000"}}]}', "NUL"),
        ("/api/workflow-definitions", '{"name": "d4", "tasks": [{"ref": "a\\u0000", '
                                      '"task": "noop"}]}', "NUL"),
        ("/api/workflow-definitions", '{"name": "d5", "tasks": [{"ref": "a", "task": "noop", '
                                      '"depends_on": ["\\u0000"]}]}', "NUL"),
        ("/api/keys", '{"name": "k\\u0000", "role": "viewer"}', "NUL"),
        ("/api/keys", '{"name": "k", "role": "viewer", "x": [' + "[" * 80 + "]" * 80 + "]}",
         "deeper than 64"),
    ],
)  # fmt: skip
def test_bad_definitions_are_422(api_client: TestClient, path: str, body: str, says: str) -> None:
    _assert_422(_post_raw(api_client, path, body), says)
