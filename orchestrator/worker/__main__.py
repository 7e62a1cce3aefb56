"""``python -m orchestrator.worker --id worker-1``."""

from orchestrator.worker.cli import worker_command

if __name__ == "__main__":
    worker_command(prog_name="python -m orchestrator.worker")
