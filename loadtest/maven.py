"""Jars from Maven Central for the peers the benchmarks run (Conductor's server, s3proxy)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["fetch_jar"]


def fetch_jar(artifact: str, jar_name: str, folder: Path, *, what: str, size: str) -> Path:
    """``folder/jar_name``, fetched with ``mvn dependency:copy`` of ``artifact`` on first use
    (Maven's own cache is reused); ``RuntimeError`` saying why when it cannot be had."""
    jar = folder / jar_name
    if jar.exists():
        return jar
    if shutil.which("mvn") is None:
        raise RuntimeError(f"{what} needs Maven (mvn) to fetch {artifact}")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"fetching {artifact} ({size}) with mvn into {folder}", file=sys.stderr, flush=True)
    partial = Path(tempfile.mkdtemp(prefix="fetch-", dir=folder))
    try:  # into a folder of its own first: an interrupted copy never passes for the jar
        argv = ["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={artifact}",
                f"-DoutputDirectory={partial}"]  # fmt: skip
        done = subprocess.run(
            argv, cwd=partial, capture_output=True, text=True, timeout=1200, check=False
        )
        if done.returncode != 0 or not (partial / jar_name).exists():
            tail = (done.stdout + done.stderr).strip()[-800:]
            raise RuntimeError(f"mvn could not fetch {artifact}: {tail}")
        (partial / jar_name).replace(jar)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return jar
