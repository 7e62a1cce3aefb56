"""Where the orchestrator's processes listen: loopback unless configured, and an address is
checked before anything binds it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orchestrator.controller.__main__ import controller_command
from orchestrator.listen import LOOPBACK, check_bind_address
from orchestrator.worker.cli import worker_command


@pytest.mark.parametrize(
    ("given", "bound"),
    [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "0.0.0.0"), ("::1", "::1"), ("[::]", "::"),
     ("localhost", "localhost"), (" 10.1.2.3 ", "10.1.2.3")],
)  # fmt: skip
def test_an_address_to_listen_on(given: str, bound: str) -> None:
    assert check_bind_address(given) == bound


@pytest.mark.parametrize("given", ["", "evil.example", "127.0.0.1:80", "300.1.1.1", "*"])
def test_anything_else_is_refused_saying_what_to_write(given: str) -> None:
    with pytest.raises(ValueError, match="write an IP address such as"):
        check_bind_address(given)


def test_the_worker_and_the_api_listen_on_loopback_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CDIFLOW_WORKER_METRICS_HOST", raising=False)
    assert _default(worker_command, "metrics_host") == LOOPBACK
    assert _default(controller_command, "host") == LOOPBACK
    refused = CliRunner().invoke(
        worker_command, ["--id", "w", "--metrics-port", "9", "--metrics-host", "a.b"]
    )
    assert refused.exit_code == 2 and "not an address to listen on" in refused.output
    monkeypatch.setenv("CDIFLOW_WORKER_METRICS_HOST", "nowhere")
    refused = CliRunner().invoke(worker_command, ["--id", "w", "--metrics-port", "9"])
    assert refused.exit_code == 2 and "CDIFLOW_WORKER_METRICS_HOST" in refused.output


def test_the_apis_scrape_port_listens_where_its_port_does_unless_told() -> None:
    """The API's ``--metrics-port`` binds ``--host``'s address unless ``--metrics-host`` says
    another, which is checked like every address before anything binds."""
    assert _default(controller_command, "metrics_host") is None  # then --host's
    refused = CliRunner().invoke(
        controller_command, ["--metrics-port", "9", "--metrics-host", "scraper.example"]
    )
    assert refused.exit_code == 2 and "not an address to listen on" in refused.output


def _default(command: object, name: str) -> object:
    params = getattr(command, "params", [])
    return next(p.default for p in params if p.name == name)
