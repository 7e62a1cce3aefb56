"""``python -m cdi.minion``: run a minion (same options as ``cdiflow cdi minion``)."""

from cdi.minion.cli import minion_command

minion_command()
