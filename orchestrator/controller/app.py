"""The controller's FastAPI application.

    app = create_app(load_settings())     # settings with DATABASE_URL and REDIS_URL resolved
    uvicorn.run(app, host="0.0.0.0", port=8000)

The REST API is under ``/api``, its docs at ``/docs`` (Swagger UI) and ``/redoc``, the web
dashboard (static files from ``dashboards/web``) at ``/`` with its assets under ``/assets``,
and Prometheus metrics at ``/metrics``.

Start-up migrates the database to the newest revision (under an advisory lock, so several
controllers may start together), seeds the bundled task and workflow definitions that are
absent, installs the configured admin key (``CDIFLOW_ADMIN_KEY``), opens the Postgres pool
and the Redis client and starts the housekeeping (``housekeeping``: the kept figures folded,
retention passes); shutdown stops and closes them.

Every request must name an allowed host (``hosts.AllowedHosts``); every ``/api`` route but
``/api/healthz`` needs an API key (``auth``). Browsers on other origins may call the API only
when ``CDIFLOW_CORS_ORIGINS`` names them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from functools import cache, partial
from importlib import metadata
from pathlib import Path
from typing import Final

import redis
import redis.asyncio
from anyio import to_thread
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from orchestrator.contract import wake_for_starts
from orchestrator.controller.api.deps import Resources
from orchestrator.controller.api.main import api_router
from orchestrator.controller.api.routes.cdi import check_reader_token
from orchestrator.controller.api.routes.files import UPLOAD_ADVICE, upload_limit
from orchestrator.controller.auth import KeyCache, Viewer
from orchestrator.controller.finish_watch import FinishWatch
from orchestrator.controller.hosts import AllowedHosts
from orchestrator.controller.housekeeping import Housekeeping
from orchestrator.controller.http_errors import install_error_handler
from orchestrator.controller.limits import MAX_BODY_BYTES, BodySizeLimit, PathLimit
from orchestrator.controller.metrics import LongPollCollector, StackCollector, metrics_registry
from orchestrator.db import make_engine, make_session_factory, migrate
from orchestrator.db.async_run_store import AsyncRunStore
from orchestrator.db.repository import (
    ended_among,
    install_configured_key,
    seed_bundled_definitions,
)
from orchestrator.errors import ConfigError, ServiceError
from orchestrator.s3policy import S3Policy
from orchestrator.settings import Settings

__all__ = ["create_app", "dashboard_dir", "open_resources"]

log = logging.getLogger(__name__)

# The dashboard talks only to this origin: no CDN, nothing inline but styles set from scripts.
# blob: images are the thumbnails it fetches with its key (an <img src> cannot send one).
_DASHBOARD_CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def _version() -> str:
    try:
        return metadata.version("cdiflow")
    except metadata.PackageNotFoundError:
        return "0+unknown"


# The API docs load nothing from elsewhere (ReDoc's script is served with its footer logo
# inlined, ``_redoc_script``); both pages run an inline script that starts them, and ReDoc's
# search runs in a worker made from a blob.
_DOCS_CSP: Final = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


# ReDoc's footer draws its maker's logo from a CDN, which a page on a machine without internet
# access (and this policy) cannot load; the same small mark is drawn inline instead.
_REDOC_LOGO_URL: Final = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
_REDOC_LOGO: Final = (
    b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E"
    b"%3Crect x='2' y='2' width='12' height='12' rx='3' fill='%23888'/%3E%3C/svg%3E"
)


@cache
def _redoc_script(assets: Path) -> bytes:
    """ReDoc's standalone script with its footer logo inlined (read once, ~1 MB)."""
    script = (assets / "redoc.standalone.js").read_bytes()
    if _REDOC_LOGO_URL not in script:
        log.warning("ReDoc's script names no CDN logo to inline; serving it as it is")
    return script.replace(_REDOC_LOGO_URL, _REDOC_LOGO)


def dashboard_dir() -> Path | None:
    """The dashboard's folder (``index.html`` and ``assets/``), or ``None`` when absent.

    The installed ``dashboards`` package when there is one, else the source tree beside this
    package (an editable install maps only the packages it lists).
    """
    try:
        from dashboards import WEB_ROOT
    except ImportError:
        root = Path(__file__).resolve().parents[2] / "dashboards" / "web"
    else:
        root = WEB_ROOT
    return root if (root / "index.html").is_file() else None


class _Assets(StaticFiles):
    """Static files a browser revalidates on each load, so an upgrade is never half-seen."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def _mount_dashboard(app: FastAPI) -> None:
    root = dashboard_dir()
    if root is None:
        log.warning("dashboard files not found; serving the API only")
        return
    index = root / "index.html"
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": _DASHBOARD_CSP}

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers=headers)

    app.mount("/assets", _Assets(directory=root / "assets"), name="assets")


def _mount_docs(app: FastAPI) -> None:
    """Swagger UI at ``/docs`` and ReDoc at ``/redoc``, their scripts and styles served from
    the ``fastapi-offline`` package: FastAPI's own pages load them from a CDN, and were blank
    on a machine without internet access."""
    import fastapi_offline

    assets = Path(fastapi_offline.__file__).resolve().parent / "static"
    openapi_url = app.openapi_url or "/api/openapi.json"

    @app.get("/docs-assets/redoc.offline.js", include_in_schema=False)
    def redoc_script() -> Response:
        headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
        return Response(_redoc_script(assets), media_type="text/javascript", headers=headers)

    app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon.png",
            # No badge from validator.swagger.io: the spec is ours, and the page stays local.
            swagger_ui_parameters={"validatorUrl": None},
        )
        page.headers["Content-Security-Policy"] = _DOCS_CSP
        return page

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url="/docs-assets/redoc.offline.js",
            redoc_favicon_url="/docs-assets/favicon.png",
            with_google_fonts=False,
        )
        page.headers["Content-Security-Policy"] = _DOCS_CSP
        return page


def _mount_metrics(app: FastAPI) -> None:
    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request, principal: Viewer) -> Response:
        """Prometheus's text format (``orchestrator.controller.metrics``), for a key of any
        role (Prometheus sends one: ``authorization: {credentials: <key>}``)."""
        registry: CollectorRegistry = request.app.state.metrics
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def open_resources(
    database_url: str, redis_url: str, admin_key: str, *, migrate_on_start: bool = True
) -> Resources:
    """Migrate, seed, install ``admin_key`` and connect: everything the app needs before its
    first request.

    Raises ``ServiceError`` when Postgres cannot be migrated or seeded.
    """
    if migrate_on_start:
        migrate(database_url)
    engine = make_engine(database_url)
    sessions = make_session_factory(engine)
    try:
        with sessions() as session:
            added = seed_bundled_definitions(session)
            install_configured_key(session, admin_key)
            session.commit()
    except SQLAlchemyError as exc:
        engine.dispose()
        raise ServiceError(
            f"could not seed the bundled definitions: {type(exc).__name__}: {exc}",
            service="postgres",
        ) from exc
    if added:
        log.info("seeded bundled definitions: %s", ", ".join(added))
    client = redis.Redis.from_url(
        redis_url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5
    )
    return Resources(engine=engine, sessions=sessions, redis=client)


def _ended_among(resources: Resources, workflow_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    with resources.autocommit() as connection:
        return ended_among(connection, workflow_ids)


def create_app(
    settings: Settings,
    *,
    migrate_on_start: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
    extra_hosts: Sequence[str] = (),
) -> FastAPI:
    """The REST API under ``/api``, with OpenAPI docs at ``/docs`` and the dashboard at ``/``.

    ``settings`` must name the database and Redis (``cdiflow up`` fills them in after starting
    the embedded services) and an admin key; ``ConfigError`` otherwise. Nothing connects until
    start-up. ``extra_hosts`` are allowed besides ``settings.allowed_hosts`` (the address the
    server listens on).
    """
    if not settings.database_url or not settings.redis_url:
        missing = [
            name
            for name, value in (
                ("DATABASE_URL", settings.database_url),
                ("REDIS_URL", settings.redis_url),
            )
            if not value
        ]
        raise ConfigError(
            f"the controller needs {' and '.join(missing)}; set it, or start the stack with "
            "`cdiflow up`, which starts embedded services"
        )
    database_url, redis_url = settings.database_url, settings.redis_url
    admin_key = settings.resolved_admin_key()
    if admin_key is None:
        raise ConfigError(
            "the API needs an admin key: set CDIFLOW_ADMIN_KEY (or CDIFLOW_ADMIN_KEY_FILE, a "
            "file of mode 0600) to a random string of 32 characters or more; `cdiflow up` makes "
            "one in <data>/api-key"
        )
    check_reader_token()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Migrations and seeding block: keep them off the event loop.
        resources = await to_thread.run_sync(
            partial(
                open_resources,
                database_url,
                redis_url,
                admin_key,
                migrate_on_start=migrate_on_start,
            )
        )
        app.state.resources = resources
        loop_redis = redis.asyncio.Redis.from_url(
            redis_url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5
        )
        app.state.run_store = runs = AsyncRunStore(
            resources.engine.url, started=partial(wake_for_starts, loop_redis)
        )
        await runs.open()
        app.state.finish_watch = watch = FinishWatch(
            resources.redis, partial(_ended_among, resources)
        )
        watch.start()
        app.state.metrics = metrics_registry(
            StackCollector(resources), LongPollCollector(watch.waiting)
        )
        app.state.housekeeping = housekeeping = Housekeeping(resources.engine, settings)
        housekeeping.start()
        try:
            yield
        finally:
            housekeeping.close()
            watch.close()
            await runs.close()
            await loop_redis.aclose()
            resources.close()

    app = FastAPI(
        title="cdiflow",
        version=_version(),
        summary="Workflow orchestrator whose tasks hand data over as Container Data Items.",
        lifespan=lifespan,
        docs_url=None,  # served by _mount_docs, without a CDN
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.settings = settings  # for routes that need more than the database and Redis
    app.state.key_cache = KeyCache()
    app.state.s3_policy = S3Policy.from_settings(settings)
    app.include_router(api_router, prefix="/api")
    _mount_docs(app)
    _mount_metrics(app)
    _mount_dashboard(app)
    install_error_handler(app)
    upload = PathLimit(upload_limit(settings), what="an upload", advice=UPLOAD_ADVICE)
    # The last added runs first: the host check, then CORS, then the body limit.
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes, paths={"/api/inputs": upload})
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )
    app.add_middleware(AllowedHosts, hosts=[*settings.allowed_hosts, *extra_hosts])
    return app
