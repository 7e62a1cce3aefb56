"""The ``cdiflow`` commands that talk to a running stack's API through ``cdiflow.client``:
``run``, ``workflows``, ``tasks`` and ``definitions``."""
