"""``python -m orchestrator.stack``: up, down, status (and the internal supervise)."""

from orchestrator.stack.cli import stack_cli

if __name__ == "__main__":
    stack_cli.main(prog_name="python -m orchestrator.stack")
