"""``python -m orchestrator.controller``: migrate the database, then serve the REST API.

Reads DATABASE_URL and REDIS_URL from the environment (``cdiflow up`` sets them). Migrating
before uvicorn binds its port means a database problem ends the process with a clear message
instead of a half-started server; the app then skips its own start-up migration.

``--metrics-port`` serves ``/metrics`` on a port of its own, without a key, for a scraper
(Prometheus has no API key to send); the API's own port keeps ``/metrics`` for keys. *Why a
port, not a role of key:* a scraper then holds no secret, and who may reach the figures is a
network rule (the Kubernetes manifests' NetworkPolicy), as for the workers' port.
"""

from __future__ import annotations

import click

from orchestrator.controller.api_server import serve
from orchestrator.controller.app import create_app
from orchestrator.db.migrate import migrate
from orchestrator.errors import OrchestratorError
from orchestrator.listen import LOOPBACK, BindAddress
from orchestrator.logs import log_format_option, setup_logging
from orchestrator.metrics_http import serve_metrics
from orchestrator.pid_one import stop_on_sigterm
from orchestrator.settings import load_settings

__all__ = ["controller_command"]

_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


@click.command("controller")
@click.option(
    "--host",
    type=BindAddress(),
    default=LOOPBACK,
    show_default=True,
    help="Address to listen on: this machine only unless another is configured.",
)
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    envvar="CDIFLOW_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port too, at /metrics and without a key (for a "
    "scraper: restrict who reaches it on your network); 0: none.",
)
@click.option(
    "--metrics-host",
    type=BindAddress(),
    default=None,
    envvar="CDIFLOW_METRICS_HOST",
    show_envvar=True,
    help="Address the metrics port listens on (default: --host's).",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
@log_format_option
def controller_command(
    host: str,
    port: int,
    metrics_port: int,
    metrics_host: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the cdiflow REST API (and the dashboard) over HTTP."""
    stop_on_sigterm()  # in a container, before uvicorn's own handlers (migrations may wait)
    setup_logging(
        log_level,
        log_format,
        process="api",
        text="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = load_settings()
        # A server bound to one address answers to it; a wildcard adds nothing.
        listen = [] if host in _WILDCARDS else [host.strip("[]").lower()]
        app = create_app(settings, migrate_on_start=False, extra_hosts=listen)  # checks first
        assert settings.database_url is not None  # create_app checked it
        migrate(settings.database_url)
    except OrchestratorError as exc:
        raise click.ClickException(str(exc)) from exc
    if metrics_port:
        try:  # the registry exists once the app has started (it reads the app's resources)
            serve_metrics(lambda: getattr(app.state, "metrics", None), metrics_host or host,
                          metrics_port)  # fmt: skip
        except OSError as exc:
            raise click.ClickException(
                f"--metrics-port {metrics_port}: cannot listen there ({exc}); choose another port"
            ) from exc
    # A bounded graceful shutdown: an idle keep-alive client must not hold up `cdiflow down`.
    # log_config=None: uvicorn's loggers go through the handler set up above (text or JSON).
    serve(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        log_config=None,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    controller_command.main(prog_name="python -m orchestrator.controller")
