"""Chaos runs: faults struck at a running stack under load, and how every workflow ends.

``cdiflow bench chaos`` runs the whole catalogue (``faults.FAULTS``: kills and freezes, a
partition between two hosts, S3 down and slow, a full disk; with chains, graphs or both in
flight: ``workload``; a join's input held ahead of the join struck at: ``join_faults``) on
fresh stacks, embedded and against external services, then a burst of starts at once
(``burst``) and an hour's soak (``soak``). ``tests/orchestrator/test_chaos.py``,
``test_chaos_held.py`` and ``tests/multihost/test_chaos_hosts.py`` run short versions.
"""
