"""``reference.child`` and ``reference.sanitizer``: a child process that imports student code
(Lab 1's other-hash-seed processes, Labs 4-5's racecheck script) runs as the worker user when
grading is isolated, and a racecheck summary the script prints itself is not trusted. A
stand-in for compute-sanitizer runs the script, so this needs no GPU."""

from __future__ import annotations

import os
import pwd
import sys

import pytest

from reference.grader.sandbox import (ISOLATED_ENV, WORKER_USER, IsolationError, ensure_worker_user,
                                      grant_traverse)
from reference.child import run_with_implementation
from reference.sanitizer import racecheck_summary, run_racecheck

try:
    HOW = ensure_worker_user()
    CANNOT = None
except IsolationError as exc:  # not root, no sudo
    HOW, CANNOT = None, str(exc)

REAL = "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"

#: Runs the interpreter command it is given (everything from the interpreter on), then prints
#: a summary line the way compute-sanitizer does after the application exits.
FAKE_TOOL = f"""#!{sys.executable}
import subprocess, sys
args = sys.argv[1:]
start = args.index({sys.executable!r})
code = subprocess.run(args[start:]).returncode
print({REAL!r}, flush=True)
sys.exit(code)
"""

SCRIPT = """
import os
import reference  # the workbook is importable, as for the real script
print("uid", os.getuid(), "secret" if "PAGEDLAB_TEST_SECRET" in os.environ else "no-secret")
"""


@pytest.fixture
def fake_tool(tmp_path):
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(FAKE_TOOL)
    tool.chmod(0o755)
    tmp_path.chmod(0o755)
    if os.geteuid() == 0:
        grant_traverse([tool])
    return str(tool)


def test_in_one_process_the_script_runs_as_this_user(fake_tool, monkeypatch):
    """Not isolated, the script runs as this process's user, with its environment."""
    monkeypatch.delenv(ISOLATED_ENV, raising=False)
    monkeypatch.setenv("PAGEDLAB_TEST_SECRET", "1")
    proc = run_racecheck(fake_tool, SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"uid {os.getuid()} secret" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(CANNOT is not None, reason=f"isolation unavailable: {CANNOT}")
def test_isolated_the_script_runs_as_the_worker_without_the_graders_environment(fake_tool,
                                                                               monkeypatch):
    """Graded isolated, the script (student code) runs as the worker user and sees none of the
    grader's own variables: it could otherwise rewrite the verdict's files."""
    monkeypatch.setenv(ISOLATED_ENV, HOW)
    monkeypatch.setenv("PAGEDLAB_TEST_SECRET", "1")
    proc = run_racecheck(fake_tool, SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    worker_uid = pwd.getpwnam(WORKER_USER).pw_uid
    assert f"uid {worker_uid} no-secret" in proc.stdout, proc.stdout + proc.stderr
    assert racecheck_summary(proc.stdout) == (0, 0)


def test_a_summary_the_script_prints_itself_is_not_trusted():
    """Exactly one summary line counts: a forged one beside the sanitizer's makes two."""
    assert racecheck_summary(f"app output\n{REAL}\n") == (0, 0)
    assert racecheck_summary("RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)") == (3, 2)
    assert racecheck_summary(f"{REAL}\nRACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 "
                             "warnings)") is None
    assert racecheck_summary("no summary") is None


@pytest.mark.slow
@pytest.mark.skipif(CANNOT is not None, reason=f"isolation unavailable: {CANNOT}")
def test_isolated_a_child_gets_its_variables_and_the_workbook_as_the_worker(monkeypatch):
    """Graded isolated, ``run_with_implementation`` runs the child as the worker user, with the
    variables it asks for (Lab 1's ``PYTHONHASHSEED``) and the workbook importable."""
    monkeypatch.setenv(ISOLATED_ENV, HOW)
    probe = "import os, reference; print(os.getuid(), os.environ['PYTHONHASHSEED'])"
    proc = run_with_implementation([sys.executable, "-s", "-c", probe],
                                   env={"PYTHONHASHSEED": "7"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(pwd.getpwnam(WORKER_USER).pw_uid), "7"]
