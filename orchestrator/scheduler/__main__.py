"""``python -m orchestrator.scheduler``."""

from orchestrator.scheduler.cli import scheduler_command

if __name__ == "__main__":
    scheduler_command.main(prog_name="python -m orchestrator.scheduler")
