"""The orchestrator controller: the REST API over the workflow state in Postgres."""

from orchestrator.controller.app import create_app

__all__ = ["create_app"]
