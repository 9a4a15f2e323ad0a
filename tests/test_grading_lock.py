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


def test_the_last_grading_removes_what_the_worker_left_in_shared_folders(tmp_path, monkeypatch):
    """A file or folder the worker user left at the top of a shared temporary folder (for the
    next submission to read) is removed; another user's is kept."""
    import pwd

    import pytest

    from reference.grader import sandbox

    try:
        how = sandbox.ensure_worker_user()
    except sandbox.IsolationError as exc:
        pytest.skip(f"isolation unavailable: {exc}")
    if how != "root":
        pytest.skip("needs root to give a file to the worker user")
    worker = pwd.getpwnam(sandbox.WORKER_USER)
    left, folder, mine = tmp_path / "left.txt", tmp_path / "dir", tmp_path / "mine.txt"
    left.write_text("kernel source")
    folder.mkdir()
    (folder / "x").write_text("x")
    mine.write_text("the grader's")
    for path in (left, folder, folder / "x"):
        os.chown(path, worker.pw_uid, worker.pw_gid)
    monkeypatch.setattr(sandbox, "SHARED_TMP", (str(tmp_path),))
    sandbox.remove_worker_files(how)
    assert not left.exists() and not folder.exists() and mine.exists()
