"""``python -m loadtest``: the same command as ``cdiflow bench workflows``."""

from loadtest.cli import bench_workflows_command

if __name__ == "__main__":
    bench_workflows_command.main(prog_name="python -m loadtest")
