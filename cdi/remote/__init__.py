"""Cross-host CDI: a per-host gateway that moves objects between minions, and carries channels
to readers on other hosts (CDI-RPC; channels: ``cdi.remote.channels``).

The gateway runs beside its host's minion (in the ``cdiflow cdi minion`` process, started with
``--rpc-listen``). To the minion it is a few ordinary containers (``cdi-gateway.<host>.*``);
to other hosts it is a TCP service (``cdi.remote.transport``); to local containers it is a
Unix socket next to the minion's, over which the client library asks it to forward an object
it has just transferred to it. The sequence and its failure cases: docs/architecture.md
(*Cross-host transfers*) and ``cdi/remote/PROTOCOL.md``.
"""
