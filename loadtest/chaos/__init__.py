"""Chaos runs: faults struck at a running stack under load, and how every workflow ends.

``cdiflow bench chaos`` runs the whole catalogue (``faults.FAULTS``) on fresh stacks, embedded
and against external services; ``tests/orchestrator/test_chaos.py`` runs a short version.
"""
