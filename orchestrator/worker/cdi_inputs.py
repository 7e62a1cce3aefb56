"""The workflow's image coming in on the ``cdi`` plane (``cdi_plane``): the object made from
the S3 input (the first task; through the host's input cache when it is on,
``input_cache_host``) or the one handed over, mapped read-only over its memory (no
copy), or the image this worker held from the task before; and letting go of that mapping,
which pins the object while it lives.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

from PIL import Image

import cdi
from cdi import ObjectKey
from orchestrator.contract.messages import Instruction
from orchestrator.errors import HeldImageLost, ObjectGone, WorkerError
from orchestrator.objectstore import ObjectStore
from orchestrator.worker.execution import Execution, elapsed_ms
from orchestrator.worker.held import Held
from orchestrator.worker.input_cache_host import Fetched, HostInputCache, InputStats
from orchestrator.worker.input_fetch import decode_into_object
from workflows.errors import InvalidImage
from workflows.imagebuf import map_image, required_size

__all__ = ["ImageInput", "held_input", "read_only", "release_view", "try_release"]

log = logging.getLogger(__name__)


class ImageInput:
    """Gets the image object a ``cdi`` instruction reads, and maps it, through this worker's
    CDI client."""

    def __init__(
        self,
        client: cdi.Client,
        store: Callable[[], ObjectStore],
        access_timeout_s: float,
        *,
        max_input_bytes: int,
        max_pixels: int,
        cache: HostInputCache | None = None,
        stats: InputStats | None = None,
    ) -> None:
        self.client = client
        self.store = store  # the S3 store of the input, made on first use
        self.access_timeout_s = access_timeout_s
        self.max_input_bytes = max_input_bytes
        self.max_pixels = max_pixels
        self.cache = cache  # the host's input cache, if it is on
        self.stats = stats or InputStats()

    def fetch(self, ins: Instruction, exe: Execution) -> cdi.CDIObject:
        """The first task: make the workflow's object ``key`` from ``input_uri``."""
        started = time.perf_counter()
        try:
            obj, fetched = self._fetch(ins.input_uri, ins.key, ins.return_to or None)
        except cdi.KeyExists as exc:
            raise WorkerError(
                f"CDI object {ins.key!r} already exists; the scheduler must name a fresh key "
                "for every attempt that fetches the input"
            ) from exc
        self.stats.count(fetched, cached=self.cache is not None)
        exe.read_ms = elapsed_ms(started)
        return obj

    def _fetch(
        self, uri: str, key: ObjectKey, recovery: str | None
    ) -> tuple[cdi.CDIObject, Fetched]:
        store = self.store()
        if self.cache is not None:
            return self.cache.fetch(self.client, store, uri, key, recovery=recovery,
                                    max_input_bytes=self.max_input_bytes,
                                    max_pixels=self.max_pixels)  # fmt: skip
        data = store.get(uri, self.max_input_bytes)
        obj = decode_into_object(self.client, data, uri, key, recovery=recovery,
                                 max_pixels=self.max_pixels)  # fmt: skip
        return obj, Fetched(False, len(data), len(data))

    def use(self, key: ObjectKey) -> cdi.CDIObject:
        # No round trip to check the key: access() is the next call and reports a missing one.
        return self.client.use(key, check=False)

    def access(self, obj: cdi.CDIObject) -> memoryview:
        try:
            return obj.access(timeout=self.access_timeout_s, populate=True)  # read in full
        except cdi.ObjectNotFound as exc:
            raise ObjectGone(
                f"CDI object {obj.key!r} does not exist (destroyed, or its owner died with no "
                "recovery container); the scheduler must start this task from its input again"
            ) from exc
        except cdi.AccessTimeout as exc:
            raise WorkerError(
                f"CDI object {obj.key!r} did not become ours ({self.client.container_id}) "
                f"within {self.access_timeout_s:g} s; the scheduler must transfer it to the "
                "worker before pushing the instruction"
            ) from exc

    def map(self, obj: cdi.CDIObject, view: memoryview, exe: Execution) -> Image.Image:
        """The image mapped over ``view`` (no copy)."""
        started = time.perf_counter()
        try:
            img = map_image(view)
        except InvalidImage as exc:
            raise InvalidImage(f"CDI object {obj.key!r} holds no readable image: {exc}") from exc
        exe.bytes_in = required_size(img.width, img.height, img.mode)
        exe.read_ms += elapsed_ms(started)  # after the fetch's, for a first task
        return img

    def find(self, key: ObjectKey) -> cdi.CDIObject | None:
        """The input after an early failure, to keep or hand back; None if there is none."""
        try:
            return self.client.use(key)
        except cdi.CDIError as exc:
            log.warning("input %r cannot be handed back: %s", key, exc)
            return None


def held_input(ins: Instruction, entry: Held | None, worker_id: str | None) -> Image.Image:
    """The image held from task run ``ins.held``; ``HeldImageLost`` if this worker has none."""
    if entry is None or entry.token != ins.held or entry.key != ins.key:
        raise HeldImageLost(
            f"worker {worker_id} holds no image from task run {ins.held} of workflow "
            f"{ins.workflow_id} (it restarted, or had to give it up); the scheduler recomputes "
            f"it from {ins.key!r}"
        )
    return entry.image


def read_only(img: Image.Image) -> Image.Image:
    """A read-only image over ``img``'s pixels: a task that changes it in place gets a copy
    (as a mapped input does), so a failed attempt cannot alter the image its retry needs."""
    shared = img._new(img.im)
    shared.readonly = 1
    return shared


def try_release(view: memoryview) -> bool:
    """Release ``view`` if nothing refers to its memory any more."""
    try:
        view.release()
    except BufferError:
        return False
    return True


def release_view(view: memoryview) -> None:
    """Release the view the mapped input came from; a cycle that still holds the image is
    collected first. If the task kept the image, the view stays and the object stays pinned
    (its transfer or destroy then reports ``BufferInUse``)."""
    try:
        view.release()
    except BufferError:
        gc.collect()
        try:
            view.release()
        except BufferError:
            log.warning(
                "the task still holds its input image (it kept it, or it runs on past its "
                "timeout): the object stays pinned until it lets go"
            )
