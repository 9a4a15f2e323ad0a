"""Infrastructure (no points): the machine's grading lock decides who may kill every process of
the worker user at the end of a test process (reference.grader.sandbox.grading_lock)."""

from __future__ import annotations

import os
import subprocess
import sys

from reference.grader.sandbox import grading_lock
from reference.paths import REPO_ROOT

HOLDER = ("from reference.grader.sandbox import hold_grading_lock; import sys, time; "
          "hold_grading_lock(); print('held', flush=True); sys.stdin.read()")


def test_the_last_grading_is_the_one_nobody_else_holds_the_lock_beside(tmp_path, monkeypatch):
    """While another process that starts workers holds the lock (shared), a grading is not the
    last: it kills only orphans, never another grading's workers. Once that process is gone
    (its lock goes with it), the grading is the last. (A private lock file: the lock lives in
    the temporary folder, and gradings elsewhere on this machine must not count here.)"""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = dict(os.environ, TMPDIR=str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=REPO_ROOT, text=True, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        with grading_lock() as last:
            assert not last()
    finally:
        holder.communicate("")
    with grading_lock() as last:
        assert last()
