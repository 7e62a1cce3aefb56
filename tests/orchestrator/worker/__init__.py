"""Tests of the worker process."""
