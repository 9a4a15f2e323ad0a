"""A child process that imports the implementation under test.

A few tests need student code in a process of its own: Lab 1 hashes in processes started with
other ``PYTHONHASHSEED`` values, Labs 4 and 5 run kernels under compute-sanitizer. Such a child
is a call into student code like any other, so graded isolated (``PAGEDLAB_ISOLATED`` set in the
test's process) it runs as the worker user, with the worker's environment and a fresh home; the
test's process only reads what it printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from reference.paths import REPO_ROOT


def run_with_implementation(argv: list[str], *, env: dict[str, str] | None = None,
                            timeout: float) -> subprocess.CompletedProcess:
    """Runs ``argv`` from the repository root, with the workbook on ``PYTHONPATH``.

    Args:
        argv: the command; its Python loads the implementation (``reference.loader.load_impl``).
        env: variables to add (e.g. ``PYTHONHASHSEED``).
        timeout: seconds before it is killed (``subprocess.TimeoutExpired``).

    Returns:
        The finished process, stdout and stderr as text.
    """
    from reference.grader.sandbox import ISOLATED_ENV, make_worker_home, worker_argv

    how = os.environ.get(ISOLATED_ENV)
    if how in ("root", "sudo"):
        home = make_worker_home()
        try:
            command, extra = worker_argv(argv, how, home, **(env or {}),
                                         PYTHONPATH=str(REPO_ROOT))
            return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True,
                                  timeout=timeout, **extra)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full.get("PYTHONPATH")]))
    return subprocess.run(argv, cwd=REPO_ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)
