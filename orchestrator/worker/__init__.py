"""orchestrator/worker."""
