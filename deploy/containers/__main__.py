"""``python -m deploy.containers``: the same commands as ``cdiflow containers``."""

from deploy.containers.cli import containers_group

containers_group(prog_name="python -m deploy.containers")
