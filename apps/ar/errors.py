"""Every error ``apps.ar`` raises, as one tree; messages say what to do.

    ARError
    ├── PartsMissing         PyAV or OpenCV is not installed (the optional ``ar``
    │                        dependencies)                                (also ImportError)
    ├── BackendUnavailable   a backend this application does not run (cdi-rpc: its roles do
    │                        not run on several hosts yet)
    │                        or whose parts are missing                  (also LookupError)
    ├── BadRunConfig         options that cannot make a run (no detectors, a ring too
    │                        shallow, a video too small)                  (also ValueError)
    └── RoleFailed           a role's process raised, died or stopped answering; carries
                             the role and its traceback or exit status

Errors of the parts underneath (``cdi.errors``, ``workflows.errors``) reach the caller
unchanged when they concern its input (a video that cannot be read); inside a role they
become ``RoleFailed``.
"""

from __future__ import annotations

__all__ = ["ARError", "BackendUnavailable", "BadRunConfig", "PartsMissing", "RoleFailed"]


class ARError(Exception):
    """Base of every error raised by ``apps.ar``."""


class PartsMissing(ARError, ImportError):
    """The application's video or detector library is not installed."""


class BackendUnavailable(ARError, LookupError):
    """The backend cannot run here."""


class BadRunConfig(ARError, ValueError):
    """The run's options cannot work together."""


class RoleFailed(ARError):
    """A role's process failed; ``role`` names it, ``detail`` has its traceback or status."""

    def __init__(self, role: str, detail: str) -> None:
        super().__init__(f"the {role} failed: {detail}")
        self.role = role
        self.detail = detail
