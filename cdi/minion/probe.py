"""``python -m cdi.minion.probe [SOCKET]``: does this host's minion answer? For a liveness
probe (``deploy/k8s/cdi-minion.yaml``): exit status 0 when the minion at SOCKET (default
``$CDI_URL``, else the default socket) answers ``stat`` within ``--timeout`` seconds, else 1
with the reason on standard error. A minion whose loop is stuck does not answer, so it fails
as a dead one does.

*Why a module of its own, not a ``cdiflow`` command:* it runs every few seconds on every node,
and importing the CDI client alone costs a fraction of what the whole command line does.
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

from cdi.client import Client
from cdi.errors import CDIError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdi.minion.probe", description=__doc__)
    parser.add_argument("socket", nargs="?", default=None, help="unix:///path or /path")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    args = parser.parse_args(argv)
    # The client waits for a reply as long as it takes; a stuck minion never sends one.
    signal.signal(signal.SIGALRM, _too_late)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    try:
        with Client(args.socket, timeout=args.timeout) as client:
            objects = client.stat()["objects"]
    except TimeoutError:
        print(f"the minion does not answer: no reply within {args.timeout:g} s", file=sys.stderr)
        return 1
    except (CDIError, OSError) as exc:
        print(f"the minion does not answer: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(f"ok ({objects} objects)")
    return 0


def _too_late(_signum: int, _frame: FrameType | None) -> None:
    raise TimeoutError


if __name__ == "__main__":
    sys.exit(main())
