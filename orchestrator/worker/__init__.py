"""The worker process: registers with its CDI minion, heartbeats, pops its own Redis queue and
runs task functions on CDI objects (or S3 objects in the object-store plane).

``python -m orchestrator.worker --id worker-1`` (``cdiflow worker``); see ``worker.py`` for the
loop and ``orchestrator.contract.messages`` for the protocol it follows.
"""

from orchestrator.worker.worker import Worker, parse_instruction

__all__ = ["Worker", "parse_instruction"]
