"""A workflow's input and result images, an uploaded input and a stored result."""

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
    """An uploaded input file, stored in the stack's S3 bucket."""

    uri: str = Field(
        description="Start a workflow with it: input.image for an image, or a field of "
        "input.data that a task reads (e.g. input.data.video)."
    )
    bytes: int
    content_type: str = Field(description="As detected from the file's bytes: image/png, ...")
    format: str | None = Field(description="An image's format as Pillow names it: JPEG, PNG, ...")
    width: int | None = Field(description="An image's width in pixels.")
    height: int | None = Field(description="An image's height in pixels.")


class WorkflowImagesPublic(ResponseBody):
    input: ImagePublic
    result: ImagePublic
