"""orchestrator/scheduler."""
