"""``python -m cdi.controller --listen host:port``."""

from cdi.controller.cli import controller_command

if __name__ == "__main__":
    controller_command.main(prog_name="python -m cdi.controller")
