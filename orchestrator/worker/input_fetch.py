"""The first task of a CDI workflow: GET the input from S3 and decode it into a new CDI object.

The worker that runs the first task makes the workflow's object itself, on its own host, with
the scheduler as recovery container, and then runs the task on it as if it had been handed
over. *Why here, not in the scheduler:* the decode is the largest CPU cost a 2 MB workflow has
outside its tasks (~38 ms), and in one scheduler process it bounds every worker's throughput;
an object made on the scheduler's host must also cross to a worker on another host as 26 MB of
pixels where the JPEG is 2 MB.

An upright JPEG in ``L`` or ``RGB`` (every photo the benchmark uses) is decoded straight into
the object's memory (``imagebuf.decode_into``: no 26 MB copy); anything else (PNG, CMYK,
EXIF-rotated) is decoded first and then copied in. A decode that fails destroys the object, so
a failed fetch leaves nothing behind; a worker that dies mid-decode leaves a half-written one,
which comes back to the scheduler by the recovery rule, and the scheduler destroys it.
"""

from __future__ import annotations

import contextlib

import cdi
from cdi import ObjectKey
from workflows import imagebuf
from workflows.errors import InvalidImage

__all__ = ["decode_into_object"]


def decode_into_object(
    client: cdi.Client,
    data: bytes,
    uri: str,
    key: ObjectKey,
    *,
    recovery: str | None,
    max_pixels: int,
) -> cdi.CDIObject:
    """Decode ``data`` (the input read from ``uri``) into a new object ``key`` owned by
    ``client``; ``InvalidImage`` (naming ``uri``) or ``cdi.CDIError``."""
    try:
        image = imagebuf.open_image(data, max_pixels)
        in_place = imagebuf.decodes_in_place(image)
        if not in_place:
            image = imagebuf.finish_decode(image)
    except InvalidImage as exc:
        raise InvalidImage(f"input {uri} is not a usable image: {exc}") from exc
    size = imagebuf.required_size(image.width, image.height, image.mode)
    obj = client.create(key, size, recovery=recovery, zeroed=False)  # the decoder fills it
    try:
        with obj.view() as buffer:
            if in_place:
                imagebuf.decode_into(buffer, image)
            else:
                imagebuf.write_image(buffer, image)
    except BaseException as exc:
        with contextlib.suppress(cdi.CDIError):
            obj.destroy()
        if isinstance(exc, InvalidImage):
            raise InvalidImage(f"input {uri} is not a usable image: {exc}") from exc
        raise
    return obj
