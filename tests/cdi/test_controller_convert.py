"""The controller's models and their wire messages have the same fields, and every model
survives the trip to the wire and back (``cdi.controller.convert``)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, get_type_hints

import pytest

from cdi.controller import convert
from cdi.controller.models import Changes, ContainerRecord, ObjectRecord

SAMPLES: dict[type[Any], Any] = {str: "host-a", int: 7, float: 1.5, bool: True}


def _sample(model: type[Any]) -> Any:
    hints = get_type_hints(model)
    return model(**{f.name: SAMPLES[hints[f.name]] for f in fields(model)})


@pytest.mark.parametrize("model", list(convert.WIRE), ids=lambda m: m.__name__)
def test_a_model_has_its_messages_fields(model: type[Any]) -> None:
    message = convert.WIRE[model]
    assert [f.name for f in fields(model)] == [f.name for f in message.DESCRIPTOR.fields]


@pytest.mark.parametrize("model", list(convert.WIRE), ids=lambda m: m.__name__)
def test_a_model_goes_to_the_wire_and_back(model: type[Any]) -> None:
    original = _sample(model)
    wire = convert.to_pb(original, convert.WIRE[model])
    assert convert.from_pb(type(wire).FromString(wire.SerializeToString()), model) == original


def test_a_batch_of_changes_goes_to_the_wire_and_back() -> None:
    changes = Changes(
        upsert_containers=[ContainerRecord("w1", 10, 1000, 2.5)],
        removed_containers=["w0"],
        upsert_objects=[ObjectRecord("k", 4096, "w1", 3, 1.0, 2.0)],
        removed_objects=["gone"],
    )
    back = convert.changes_from_pb(convert.changes_to_pb("h", "e", changes))
    assert back == changes
