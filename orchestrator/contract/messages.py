"""What the scheduler and the workers say to each other through Redis.

The scheduler LPUSHes an ``Instruction`` (JSON) onto the worker's own queue
(``keys.worker_queue_key``); the worker moves it into its in-flight list, runs it, LPUSHes a
``Report`` onto ``Instruction.reply_to`` and only then removes the instruction from its in-flight
list (a reliable pop: an instruction popped by a worker that dies is still there to requeue).

Data planes (``DataPlane``):

* ``cdi``: the image is a CDI object (``workflows.imagebuf`` layout) under ``key``, owned by the
  worker when it pops the instruction; for the workflow's first task, which names the S3 input
  in ``input_uri``, the worker makes that object itself (recovery container ``return_to``) and a
  report of a fetch that failed names no ``key``. The worker reads the object in place and never
  writes into it: a task that produces a new image writes it into a *fresh* object
  ``output_key`` (created with the scheduler as recovery container) and destroys the input. A
  worker that dies mid-task therefore leaves the input intact, and it returns to the scheduler
  for the retry. When the task is done the worker keeps the current object if ``keep``
  (affinity: the next task comes to it too), transfers it to ``hand_to`` (the worker chosen for
  the next step, ``transfer`` and ``auto``; ``Report.handed_to`` says it did), or to
  ``return_to`` (the scheduler): a failed task's, or when ``hand_to`` is gone. The named outputs
  it wrote (below) go the same way.
  With ``hold`` (affinity, and a step that may run again) the worker may instead keep a new
  image in its own memory, unwritten, and say so with ``Report.held``; the next instruction then
  names that report's task run in ``held``. A worker that lost the image says
  ``Report.held_lost``, and the scheduler recomputes it from ``key``, the last object
  (``orchestrator.worker.held``). The last task's instruction names ``output_uri`` and
  ``output_format``: the worker encodes the result, PUTs it there, destroys the object and says
  ``Report.stored`` (nothing comes back to the scheduler); if it read a held image, its
  ``output_key`` is where a failed attempt writes that image for the retry.
* ``object-store``: like Conductor/Orkes users do, the worker GETs ``input_uri`` from S3, decodes,
  runs the task, encodes (PNG, lossless, so every plane computes the same pixels) and PUTs
  ``output_uri``.
* ``none``: a workflow started without an image: nothing is fetched; steps that name no inputs
  run with ``img=None``. Named data (below) moves as on the ``cdi`` plane.

*Named data* (``cdi`` and ``none`` planes). The fields above describe the step's ``image``: the
single-image chain's datum, with its fast paths (fetched by the first task's worker, held in
memory, stored by the last). Every other input is in ``inputs`` — by parameter name, an object
``{"key", "kind", "mode"}`` (``own``: the worker owns it and destroys it after the task, or
hands it back to ``return_to`` on failure; ``read``: a read-only share it releases), an inline
``{"value"}`` or a list ``{"items": [...]}`` — and so is an ``image`` read through a share.
``outputs`` names, by output name, the key of each object output a later step reads (a list
output's elements are ``<key>.<i>``); what no step reads is not written. A step whose outputs
are the run's results has ``store_prefix``: each object output goes to
``<store_prefix><name><ext>`` (its ``image`` to ``output_uri``). ``chain`` says the step named
no inputs (``workflows.binding``); ``discard_image`` that no step reads its image.

Every instruction carries the workflow's ``input.data`` (``data``), given to the task as
``ctx.input``.

A task run a worker runs is stopped with a ``Stop`` on the worker's control list
(``keys.worker_control_key``): its run was cancelled, failed or passed its time limit. The
worker interrupts the task and reports it as the ``Stop`` says (CANCELLED or TIMED_OUT); a task
that would not stop costs the worker its process (``Report.restarting``,
``orchestrator.worker.stopping``).

All three are ``msgspec`` structs, written and read by one C call each (``dumps``, ``loads``):
JSON with the field names below, a field at its default left out (a reader fills it in, as an
older reader does too). They are read strictly: a field the reader does not know, or a value
of the wrong type (a string where a number goes, an unknown ``data_plane``), makes the message
unreadable (``msgspec.DecodeError``, a ``ValueError``; docs/architecture.md, *Messages*). A
whole number reads as a float where one goes; an enum field reads as its member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast

import msgspec

from orchestrator.contract.vocabulary import DataPlane, TaskRunStatus

if TYPE_CHECKING:
    from cdi import ObjectKey
else:
    # msgspec reads the fields' types at run time, and ``ObjectKey`` is a ``str`` there.
    ObjectKey = str

__all__ = ["MAX_TRACEBACK", "Instruction", "Report", "Stop"]

# The longest traceback a report carries (and a task run keeps): its end, where the exception
# was raised, is kept when it is longer.
MAX_TRACEBACK: Final = 16_384

# No object. A cast, not ``cdi.ObjectKey("")``: the API's clients read this module (through
# ``orchestrator.schemas``) without loading the CDI runtime.
_NO_KEY: Final = cast("ObjectKey", "")


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    def dumps(self) -> bytes:
        return _ENCODER.encode(self)


class Instruction(_Message, frozen=True):
    """One task run for one worker."""

    task_run_id: int
    workflow_id: str
    ref: str
    task: str  # registered task name or "package.module:function"
    attempt: int
    timeout_s: float
    reply_to: str  # Redis list the report goes to
    data_plane: DataPlane
    params: dict[str, Any] = {}
    data: dict[str, Any] = {}  # the workflow's input.data
    # cdi plane
    key: ObjectKey = _NO_KEY
    output_key: ObjectKey = _NO_KEY
    keep: bool = False
    return_to: str = ""  # CDI container id that gets the object back when not keeping it
    hand_to: str = ""  # the next step's worker: a completed task's objects go straight there
    hold: bool = False  # the worker may hold a new image in memory instead of writing it
    held: str = ""  # the input is the image held from this task run (computed from ``key``)
    # object-store plane (and the cdi plane's first task: input_uri; last: output_uri, format)
    input_uri: str = ""
    output_uri: str = ""
    output_format: str = "png"  # key of workflows.imagebuf.RESULT_FORMATS
    queued_at: float = 0.0  # unix seconds when the scheduler pushed it
    # named data (``cdi`` and ``none`` planes)
    chain: bool = True  # the step named no inputs: its first parameter takes the image
    inputs: dict[str, Any] = {}  # name -> object, value or items
    outputs: dict[str, ObjectKey] = {}  # output name -> its object
    store_prefix: str = ""  # the step's outputs are results: stored under this S3 prefix
    discard_image: bool = False  # no step reads its image: destroy it, do not pass it on
    # A streaming step's channels (``Graph.channel_plan``): {"publish": {name: [subscriber
    # refs]}, "subscribe": {name: publisher ref}}; empty for any other step.
    channels: dict[str, Any] = {}

    @classmethod
    def loads(cls, text: str | bytes) -> Instruction:
        return _INSTRUCTION.decode(text)


class Report(_Message, frozen=True):
    """What became of one instruction."""

    task_run_id: int
    workflow_id: str
    worker_id: str
    status: TaskRunStatus  # COMPLETED, FAILED, TIMED_OUT or CANCELLED (stopped)
    started_at: float  # unix seconds
    finished_at: float
    output: dict[str, Any] = {}  # the task's JSON output
    error: str = ""  # a reason a person can act on
    # Where the task was when it failed or was stopped (its traceback, at most
    # ``MAX_TRACEBACK`` characters); "" when the failure was not the task code's.
    traceback: str = ""
    retryable: bool = True  # False for failures a retry cannot fix (e.g. not an image)
    key: ObjectKey = _NO_KEY  # cdi plane: the object holding the image (input or output_key)
    kept: bool = False  # cdi plane: the worker still owns ``key`` and the outputs it wrote
    # cdi plane: ``key`` and the outputs it wrote went to this container (``hand_to``), but for
    # those among ``returned``
    handed_to: str = ""
    held: bool = False  # cdi plane: the new image is in the worker's memory, newer than ``key``
    held_lost: bool = False  # cdi plane: the instruction's held input is gone; ``key`` is older
    objects_gone: bool = False  # cdi plane: an object it named does not exist (minion restarted)
    outage: bool = False  # S3 did not answer (``StorageUnavailable``): not the task's failure
    stored: bool = False  # cdi plane: the result is at ``output_uri``, the object destroyed
    bytes_in: int = 0
    bytes_out: int = 0
    read_ms: float = 0.0
    compute_ms: float = 0.0
    cpu_ms: float | None = None  # the task function's own CPU (its thread); None: it never ran
    write_ms: float = 0.0
    return_us: float = 0.0  # cdi plane: how long handing the object back (or on) took
    # named data
    objects: dict[str, Any] = {}  # output -> {key, kind, nbytes}|items
    results: dict[str, Any] = {}  # output -> S3 URI(s) it was stored at
    released: list[ObjectKey] = []  # shared objects it gave up reading
    # owned inputs it handed back, and what it made that did not go on to ``handed_to``
    returned: list[ObjectKey] = []
    # The task would not stop, so its worker ends the process it ran in and starts afresh:
    # whatever else that process held (other tasks, held images) is gone with it.
    restarting: bool = False

    @classmethod
    def loads(cls, text: str | bytes) -> Report:
        return _REPORT.decode(text)


class Stop(_Message, frozen=True):
    """Stop a task run a worker runs (on ``keys.worker_control_key``): its run was cancelled,
    failed or timed out. The worker reports the task run with ``status``, and ``reason`` as
    its error."""

    task_run_id: int
    workflow_id: str
    status: TaskRunStatus  # CANCELLED or TIMED_OUT
    reason: str

    @classmethod
    def loads(cls, text: str | bytes) -> Stop:
        return _STOP.decode(text)


_ENCODER: Final = msgspec.json.Encoder()
_INSTRUCTION: Final = msgspec.json.Decoder(Instruction)
_REPORT: Final = msgspec.json.Decoder(Report)
_STOP: Final = msgspec.json.Decoder(Stop)
