"""The one error tree of ``deploy.containers``: every failure it raises says what to do."""

from __future__ import annotations

__all__ = ["ContainerError", "PodmanMissing"]


class ContainerError(Exception):
    """Something the container stack could not do, and why (podman's own words included)."""


class PodmanMissing(ContainerError):
    """podman (or debootstrap) is not installed here."""
