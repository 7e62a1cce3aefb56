"""Tests of the orchestrator package."""
