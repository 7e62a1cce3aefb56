"""The CDI controller: a per-cluster, soft-state directory of minions, containers and objects.

Modules: ``state`` (the in-memory registry), ``server`` (its gRPC service), ``client`` (typed
client), ``reporter`` (what a minion uses to keep the directory current), ``cli``, and the shared
``models`` (plain dataclasses), ``validation`` and ``convert`` (wire <-> models).
"""
