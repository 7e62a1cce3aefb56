"""orchestrator/controller."""
