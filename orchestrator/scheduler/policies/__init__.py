"""Placement policies: where a run's steps go, one module per ``Policy``, chosen from
``POLICIES`` by the run's policy (``policy_of``).

A policy answers three questions (``base.PlacementPolicy``): which worker takes a step
(``choose``, from a ``Choice``: the live workers' loads, where the step's data is, what moving
it costs), whether that worker keeps what the step makes for the next one (``keeps``), and
what to remember of a placement (``placed``). The dispatcher asks them and does the rest:
what is capable, late binding, leases, moving the objects (``dispatch``).

* ``affinity`` (``affinity.py``): a chain's steps all on one worker, which keeps the object;
* ``transfer`` (``transfer.py``): every step to the best worker with room;
* ``auto`` (``auto.py``): stay with the data unless moving beats waiting.

A step that reads an object a worker kept runs on that worker whatever the policy
(``base.pinned``). Adding a policy: its ``Policy`` member (and a migration adding its label
to the ``workflow_policy`` type), a module here, its row in ``POLICIES``, its tests.
"""

from __future__ import annotations

from typing import Final

from orchestrator.contract.vocabulary import Policy
from orchestrator.scheduler.policies.affinity import Affinity
from orchestrator.scheduler.policies.auto import Auto
from orchestrator.scheduler.policies.base import Ahead, Choice, NextStep, PlacementPolicy, pinned
from orchestrator.scheduler.policies.transfer import Transfer
from orchestrator.scheduler.runs import RunState

__all__ = [
    "POLICIES",
    "Ahead",
    "Choice",
    "NextStep",
    "PlacementPolicy",
    "pinned",
    "policy_of",
]

POLICIES: Final[dict[Policy, PlacementPolicy]] = {
    Policy.AFFINITY: Affinity(),
    Policy.TRANSFER: Transfer(),
    Policy.AUTO: Auto(),
}


def policy_of(run: RunState) -> PlacementPolicy:
    """The policy ``run``'s steps are placed by."""
    return POLICIES[run.policy]
