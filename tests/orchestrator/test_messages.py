"""The messages between the scheduler and the workers as they are on the wire (pure, no
services): what an earlier release wrote still reads the same, what is written leaves out the
fields at their defaults and is read back equal, and what is not a message is refused."""

from __future__ import annotations

import json

import pytest

from cdi import ObjectKey
from orchestrator.contract.messages import Instruction, Report, Stop
from orchestrator.contract.vocabulary import DataPlane, TaskRunStatus

# As the release before these structs wrote them (every field, a whole number for a float).
_OLD_INSTRUCTION = (
    '{"task_run_id":7,"workflow_id":"0b1c","ref":"a","task":"workflows.image_tasks:noop",'
    '"attempt":1,"timeout_s":30,"reply_to":"replies:s1","data_plane":"cdi","params":{"ms":5},'
    '"data":{},"key":"k1","output_key":"k1.image","keep":false,"return_to":"scheduler-1",'
    '"hand_to":"worker-2","hold":false,"held":"","input_uri":"","output_uri":"",'
    '"output_format":"png","queued_at":1764950000.25,"chain":true,"inputs":{},"outputs":{},'
    '"store_prefix":"","discard_image":false,"channels":{}}'
)
_OLD_REPORT = (
    '{"task_run_id":7,"workflow_id":"0b1c","worker_id":"worker-1","status":"COMPLETED",'
    '"started_at":1764950000.5,"finished_at":1764950000.75,"output":{"label":"cat"},"error":"",'
    '"traceback":"","retryable":true,"key":"k1.image","kept":false,"handed_to":"worker-2",'
    '"held":false,"held_lost":false,"objects_gone":false,"outage":false,"stored":false,'
    '"bytes_in":0,"bytes_out":0,"read_ms":0.0,"compute_ms":0.0,"cpu_ms":1.25,"write_ms":0.0,'
    '"return_us":0.0,"objects":{},"results":{},"released":[],"returned":["k0"],'
    '"restarting":false}'
)


def test_messages_an_earlier_release_wrote_read_the_same() -> None:
    ins = Instruction.loads(_OLD_INSTRUCTION)
    assert ins == Instruction(
        task_run_id=7, workflow_id="0b1c", ref="a", task="workflows.image_tasks:noop",
        attempt=1, timeout_s=30.0, reply_to="replies:s1", data_plane=DataPlane.CDI,
        params={"ms": 5}, key=ObjectKey("k1"), output_key=ObjectKey("k1.image"),
        return_to="scheduler-1", hand_to="worker-2", queued_at=1764950000.25,
    )  # fmt: skip
    assert ins.data_plane is DataPlane.CDI and isinstance(ins.timeout_s, float)
    report = Report.loads(_OLD_REPORT.encode())
    assert report.status is TaskRunStatus.COMPLETED
    assert (report.output, report.cpu_ms, report.returned) == ({"label": "cat"}, 1.25, ["k0"])


def test_a_message_leaves_out_its_defaults_and_reads_back_equal() -> None:
    ins = Instruction.loads(_OLD_INSTRUCTION)
    text = ins.dumps()
    written, old = json.loads(text), json.loads(_OLD_INSTRUCTION)
    assert written.items() <= old.items()
    assert not {"keep", "hold", "data", "inputs", "outputs", "channels"} & set(written)
    assert Instruction.loads(text) == ins and ins.dumps() == text
    report = Report.loads(_OLD_REPORT)
    assert Report.loads(report.dumps()) == report
    stop = Stop(7, "0b1c", TaskRunStatus.CANCELLED, "cancelled")
    assert Stop.loads(stop.dumps()) == stop


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (_OLD_INSTRUCTION.replace('"cdi"', '"ftp"'), "$.data_plane"),
        (_OLD_INSTRUCTION.replace('"attempt":1', '"attempt":"1"'), "$.attempt"),
        (_OLD_INSTRUCTION.replace('"keep":false', '"keep":0'), "$.keep"),
        (_OLD_INSTRUCTION.replace('"chain":true', '"chain":true,"later":1'), "later"),
        (_OLD_INSTRUCTION.replace('"task_run_id":7,', ""), "task_run_id"),
        ("not json", "JSON"),
    ],
)
def test_an_instruction_of_unknown_or_mistyped_fields_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("$", r"\$")):
        Instruction.loads(text)
