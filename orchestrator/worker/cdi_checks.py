"""What a ``cdi`` instruction must hold before the ``cdi`` plane runs it (``cdi_plane``)."""

from __future__ import annotations

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.errors import InvalidInstruction
from orchestrator.worker.execution import check_common
from orchestrator.worker.store_plane import check_output, check_uri

__all__ = ["check_cdi_instruction"]


def check_cdi_instruction(ins: Instruction) -> None:
    """Raise ``InvalidInstruction`` unless ``ins`` is one the ``cdi`` plane can run."""
    check_common(ins)
    if not isinstance(ins.key, str) or ((ins.input_uri or ins.held) and not ins.key):
        raise InvalidInstruction(f"instruction {ins.task_run_id} (cdi plane) names no key")
    if not isinstance(ins.outputs, dict) or not isinstance(ins.store_prefix, str):
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: outputs must be an object, store_prefix a string"
        )
    if ins.store_prefix:
        check_uri(ins, "store_prefix", ins.store_prefix, DataPlane.CDI)
    if not isinstance(ins.held, str) or not isinstance(ins.hold, bool):
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: held must be a string and hold a boolean"
        )
    if not isinstance(ins.hand_to, str) or (ins.hand_to and ins.keep):
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: hand_to must be a string, and not beside keep "
            "(the object either stays with this worker or goes on to the next one)"
        )
    if ins.hold and not ins.keep:
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: hold without keep; a worker can hold a new image "
            "only while it keeps the object it was computed from"
        )
    if ins.output_uri:
        if ins.keep:
            raise InvalidInstruction(
                f"instruction {ins.task_run_id}: output_uri with keep; the last task stores "
                "the result and destroys the object, so there is nothing to keep"
            )
        check_output(ins, DataPlane.CDI)
    if ins.input_uri:
        if ins.held:
            raise InvalidInstruction(
                f"instruction {ins.task_run_id}: input_uri with held; a task reads either the "
                "input from S3 (the first) or an image held from the one before"
            )
        check_uri(ins, "input_uri", ins.input_uri, DataPlane.CDI)
    if ins.output_key and ins.output_key == ins.key:
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: output_key equals key ({ins.key!r}); the output "
            "must be a fresh object so the input survives a failed attempt"
        )
