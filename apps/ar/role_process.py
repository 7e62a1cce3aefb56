"""One role of the AR application as a program: ``python -m apps.ar.role_process FD ROLE INDEX``.

``FD`` is this process's end of a socket pair to the launcher (``apps.ar.launch``), which
sends the run's configuration first; ``ROLE`` and ``INDEX`` say which role to play.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from apps.ar.roles import ROLES, role_main

__all__ = ["main"]


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[0].isdigit() or argv[1] not in ROLES or not argv[2].isdigit():
        print(
            f"usage: python -m apps.ar.role_process FD {{{'|'.join(ROLES)}}} INDEX", file=sys.stderr
        )
        return 2
    control = Connection(int(argv[0]))
    config = control.recv()
    role_main(argv[1], int(argv[2]), config, control)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
