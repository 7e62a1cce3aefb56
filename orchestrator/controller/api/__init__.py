"""The REST API under ``/api``: one router module per resource in ``routes``."""
