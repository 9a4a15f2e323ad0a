"""compute-sanitizer's racecheck over a script that runs the implementation under test.

Labs 4 and 5 prove on a GPU that no kernel races in shared memory by running a short script
under ``compute-sanitizer --tool racecheck``. That script imports the student's code, so graded
isolated it runs as the worker user (:mod:`reference.child`), and the test's process only reads
what the sanitizer printed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from reference.child import run_with_implementation

#: The sanitizer's own summary line: "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?")


def find_compute_sanitizer() -> str | None:
    """Returns the compute-sanitizer executable (PATH, then ``$CUDA_HOME`` or
    /usr/local/cuda), or None."""
    found = shutil.which("compute-sanitizer")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if not found and home and Path(home, "bin", "compute-sanitizer").exists():
            found = str(Path(home, "bin", "compute-sanitizer"))
    return found


def run_racecheck(tool: str, script: str, *, tool_args: tuple[str, ...] = (),
                  timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs ``python -c script`` under ``tool --tool racecheck``, from the repository root
    (graded isolated: as the worker user, :mod:`reference.child`).

    Args:
        tool: the compute-sanitizer executable (:func:`find_compute_sanitizer`).
        script: Python source that loads the implementation and launches its kernels.
        tool_args: more sanitizer options (``--error-exitcode``, ``--print-limit``, ...).
        timeout: seconds before the run is killed (``subprocess.TimeoutExpired``).

    Returns:
        The finished process, stdout and stderr as text.
    """
    argv = [tool, "--tool", "racecheck", *tool_args, sys.executable, "-s", "-c", script]
    return run_with_implementation(argv, timeout=timeout)


def racecheck_summary(output: str) -> tuple[int, int] | None:
    """Returns (hazards displayed, errors) from the sanitizer's summary in ``output``, or None
    unless there is exactly one summary line.

    NOTE: the script shares the sanitizer's stdout, so student code could print a summary of
    its own; it cannot remove the real one, so a second line means the output is not trusted.
    """
    found = SUMMARY.findall(output)
    return (int(found[0][0]), int(found[0][1])) if len(found) == 1 else None
