"""A workflow's input and result images, and an uploaded input."""

from __future__ import annotations

from pydantic import Field

from orchestrator.schemas.base import ResponseBody

__all__ = ["ImagePublic", "InputPublic", "WorkflowImagesPublic"]


class ImagePublic(ResponseBody):
    """A workflow's input or result image, and whether it can be shown."""

    role: str = Field(description="'input' or 'result'.")
    uri: str | None
    available: bool
    problem: str | None = Field(description="Why there is no thumbnail, when there is none.")
    format: str | None
    width: int | None
    height: int | None
    bytes: int | None
    thumbnail_url: str | None = Field(description="A downscaled JPEG; only when available.")


class InputPublic(ResponseBody):
    """An uploaded input image, stored in the stack's S3 bucket."""

    uri: str = Field(description="Start a workflow with it: input.image.")
    bytes: int
    format: str = Field(description="As Pillow names it: JPEG, PNG, ...")
    width: int
    height: int
    content_type: str


class WorkflowImagesPublic(ResponseBody):
    input: ImagePublic
    result: ImagePublic
