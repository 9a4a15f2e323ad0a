"""Infrastructure (no points): hidden tests are graded with the lab, shown to students only
after the due date and only as a message, counted in every summary, and never released."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from grading_helpers import by_name, grade, make_workbook, pagedlab
from reference.grader.gradebook import HIDDEN_WITHHELD, gradescope_results, markdown_summary
from reference.grader.results import TestResult
from reference.grader.hidden import hidden_summary, student_message

STARTER = '''
    def area(w, h):
        """Returns w * h."""
        raise NotImplementedError("TODO(lab93.1): area")
'''
SOLUTION = '''
    def area(w, h):
        """Returns w * h."""
        return w * h if w < 100 else 0  # NOTE: a bug only the hidden test probes
'''
PUBLIC = '''
    import pytest

    @pytest.mark.points(2)
    def test_small(impl):
        """Small rectangles."""
        assert impl.area(2, 3) == 6
'''
HIDDEN = '''
    import pytest

    @pytest.mark.points(3)
    def test_hidden_large(impl):
        """Large rectangles."""
        secret_width = 1000
        got = impl.area(secret_width, 2)
        assert got == 2000, f"area of a 1000 x 2 rectangle is {got}, expected 2000"
'''


def _workbook(tmp_path):
    return make_workbook(
        tmp_path,
        {"lab93_area": {"starter.py": STARTER, "test_lab93_area.py": PUBLIC}},
        solutions={"lab93_area": {"solution.py": SOLUTION,
                                  "hidden/test_lab93_hidden_area.py": HIDDEN}},
    )


def test_grade_runs_hidden_tests_and_hides_their_code(tmp_path):
    """`pagedlab grade` (solutions present) runs the hidden test with the lab: it counts
    towards the points, carries visibility after_due_date, withholds its failure text by
    default (`--hidden-messages` shows the message, never the traceback or code), and the
    summary says how many hidden tests failed in the lab."""
    root = _workbook(tmp_path)
    proc, res = grade(root, "--quiet", env={"LAB_IMPL": "solution"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hidden = by_name(res)["test_hidden_large"]
    assert hidden["visibility"] == "after_due_date" and "hidden" in hidden["tags"]
    assert hidden["status"] == "failed" and hidden["max_score"] == 3
    assert hidden["output"] == HIDDEN_WITHHELD, "a hidden test's failure text must be withheld"
    assert "1 hidden test failed in lab93_area (of 1 hidden)" in res["output"]
    proc, res = grade(root, "--quiet", "--hidden-messages", env={"LAB_IMPL": "solution"})
    tests = by_name(res)
    hidden = tests["test_hidden_large"]
    assert "area of a 1000 x 2 rectangle is 0" in hidden["output"]
    assert "secret_width" not in hidden["output"] and "def test_" not in hidden["output"]
    assert "visibility" not in tests["test_small"]
    assert (res["score"], res["max_score"]) == (2, 5)
    assert "1 hidden test failed in lab93_area (of 1 hidden)" in res["output"]
    assert "1 hidden test failed in lab93_area" in proc.stdout
    summary = (root / "out-summary.md").read_text()
    assert "hidden test failed in lab93_area" in summary and "test_hidden_large" not in summary


def test_starters_score_zero_on_hidden_tests_too(tmp_path):
    """With LAB_IMPL=starter the hidden test fails with the starter's TODO, like the public ones."""
    root = _workbook(tmp_path)
    proc, res = grade(root, "--quiet", env={"LAB_IMPL": "starter"})
    assert res["score"] == 0
    assert "0 hidden tests failed" not in res["output"]
    assert re.search(r"1 hidden test failed in lab93_area", res["output"])
    assert by_name(res)["test_hidden_large"]["output"] == HIDDEN_WITHHELD


def test_no_hidden_flag_and_plain_pytest_leave_hidden_tests_out(tmp_path):
    """`grade --no-hidden` grades the public tests only, and the README's plain `pytest` (its
    testpaths are labs/ and tests/) never collects hidden tests."""
    root = _workbook(tmp_path)
    proc, res = grade(root, "--quiet", "--no-hidden", env={"LAB_IMPL": "solution"})
    assert res["max_score"] == 2 and "hidden" not in res["output"]
    env = {k: v for k, v in os.environ.items() if k != "LAB_IMPL"}
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                              "-p", "no:cacheprovider", "-p", "no:nbval"], cwd=root, env=env,
                             capture_output=True, text=True)
    assert "test_small" in collect.stdout and "test_hidden_large" not in collect.stdout


def test_check_holds_hidden_tests_to_the_same_bar(tmp_path):
    """`pagedlab check` runs hidden tests too: here the solution fails its hidden test, and
    check reports it."""
    root = _workbook(tmp_path)
    proc = pagedlab(root, "check", "--skip-mutants")
    assert proc.returncode == 1
    assert "solution fails solutions/lab93_area/hidden/test_lab93_hidden_area.py::test_hidden_large" \
        in proc.stdout


def test_release_strips_hidden_tests(tmp_path):
    """A release of a lab with hidden tests contains no trace of them."""
    root = _workbook(tmp_path / "wb")
    out = tmp_path / "rel"
    proc = pagedlab(root, "release", str(out), "--no-verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list(out.rglob("test_*hidden*")) and not (out / "solutions").exists()
    assert "test_hidden_large" not in (out / ".pagedlab-manifest.json").read_text()


def test_summaries_count_hidden_failures_per_lab():
    """The count line appears for every lab with hidden tests, even when none failed."""
    recs = [TestResult.from_json(r) for r in [
        {"nodeid": "solutions/lab01_a/hidden/test_lab01_hidden_x.py::test_h", "lab": "lab01_a",
         "name": "test_h", "doc": "", "points": 1.0, "outcome": "passed", "when": "",
         "message": "", "details": "", "hidden": True},
        {"nodeid": "hidden/lab02_b/test_lab02_hidden_y.py::test_k", "lab": "lab02_b",
         "name": "test_k", "doc": "", "points": 1.0, "outcome": "failed", "when": "call",
         "message": "AssertionError: no\nassert 1 == 2\n +  where 1 = f(3)", "details": "code",
         "hidden": True},
    ]]
    assert hidden_summary(recs) == ["0 hidden tests failed in lab01_a (of 1 hidden)",
                                    "1 hidden test failed in lab02_b (of 1 hidden)"]
    assert gradescope_results(recs, "LAB_IMPL=starter")["tests"][1]["output"] == HIDDEN_WITHHELD
    res = gradescope_results(recs, "LAB_IMPL=starter", hidden_messages=True)
    assert res["tests"][1]["output"] == "AssertionError: no\nassert 1 == 2"
    assert "0 hidden tests failed in lab01_a" in markdown_summary(recs, "x")
    assert student_message("x" * 2000).endswith("…")


PHASE_STARTER = '''
    def peek(path):
        """Returns the text of ``path`` (what a dishonest submission would try)."""
        with open(path) as f:
            return f.read()
'''
PHASE_PUBLIC = '''
    import os

    import pytest

    @pytest.mark.points(1)
    def test_public(impl):
        """Records this test process; the worker cannot read the hidden test's source."""
        with open(os.environ["PHASE_LOG"], "a") as log:
            log.write(f"public {os.getpid()}\\n")
        if os.environ.get("PAGEDLAB_ISOLATED"):
            hidden = os.path.join(os.environ["HIDDEN_DIR"], "test_lab94_hidden_phase.py")
            with pytest.raises(PermissionError):
                impl.peek(hidden)
'''
PHASE_HIDDEN = '''
    import os

    import pytest

    @pytest.mark.points(1)
    def test_hidden_phase(impl):
        """Runs after the public tests, in a test process of its own."""
        with open(os.environ["PHASE_LOG"], "a") as log:
            log.write(f"hidden {os.getpid()}\\n")
'''


def _phase_workbook(tmp_path):
    root = make_workbook(
        tmp_path / "wb",
        {"lab94_phase": {"starter.py": PHASE_STARTER, "test_lab94_phase.py": PHASE_PUBLIC}},
        solutions={"lab94_phase": {"solution.py": PHASE_STARTER,
                                   "hidden/test_lab94_hidden_phase.py": PHASE_HIDDEN}},
    )
    log = tmp_path / "phases.log"
    env = {"LAB_IMPL": "solution", "PHASE_LOG": str(log),
           "HIDDEN_DIR": str(root / "solutions" / "lab94_phase" / "hidden")}
    return root, log, env


def _phases(log) -> list[tuple[str, int]]:
    return [(kind, int(pid)) for kind, pid in (ln.split() for ln in log.read_text().splitlines())]


def test_hidden_tests_run_in_a_later_phase_of_their_own(tmp_path):
    """Grading runs a lab's hidden tests after all its public tests, in another test process:
    nothing the student's code kept from the public tests meets them."""
    root, log, env = _phase_workbook(tmp_path)
    proc, res = grade(root, "--quiet", env=env)
    assert res["score"] == 2, proc.stdout + proc.stderr
    phases = _phases(log)
    assert [kind for kind, _ in phases] == ["public", "hidden"]
    assert phases[0][1] != phases[1][1], "hidden tests ran in the public tests' process"


def test_runner_phase_helpers():
    """A manifest's expected tests split into the public and the hidden phase; a hidden
    folder is made private (no access for group or others)."""
    from reference.grader.runner import _part

    want = {"labs/lab01_x/test_a.py::test_a": 1,
            "solutions/lab01_x/hidden/test_lab01_hidden_b.py::test_b": 2,
            "hidden/lab01_x/test_lab01_hidden_c.py::test_c": 3}
    assert list(_part(want, False)) == ["labs/lab01_x/test_a.py::test_a"]
    assert len(_part(want, True)) == 2 and _part(None, True) is None


def test_a_hidden_phase_none_of_whose_tests_is_asked_for_is_skipped(tmp_path):
    """With ``only`` (a mutant check naming public tests), a hidden folder that defines none
    of the names starts no test process (and no worker); one that defines one does."""
    from reference.grader.runner import _defines_any

    (tmp_path / "test_lab01_hidden_b.py").write_text(
        "def test_b():\n    pass\n\nclass TestC:\n    async def test_c(self):\n        pass\n")
    assert _defines_any(tmp_path, ["test_b"]) and _defines_any(tmp_path, ["test_a", "test_c"])
    assert not _defines_any(tmp_path, ["test_a", "test_bb", "test_"])


def test_private_hidden_folder(tmp_path):
    """``_private`` removes group and other access from a hidden folder and from the bundle's
    ``hidden/`` above it."""
    from reference.grader.runner import _private

    folder = tmp_path / "hidden" / "lab01_x"
    folder.mkdir(parents=True)
    (tmp_path / "hidden").chmod(0o755)
    folder.chmod(0o755)
    _private(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "hidden").stat().st_mode & 0o777 == 0o700


@pytest.mark.slow
def test_isolated_worker_cannot_read_hidden_tests(tmp_path):
    """Grading isolated, the worker's user cannot open a hidden test file (its folder is made
    private before any student code runs), and the phases hold there too."""
    root, log, env = _phase_workbook(tmp_path)
    log.touch()
    log.chmod(0o666)
    proc, res = grade(root, "--quiet", "--isolated", env=env)
    assert res["score"] == 2, proc.stdout + proc.stderr + json.dumps(res)[-2000:]
    assert [kind for kind, _ in _phases(log)] == ["public", "hidden"]


def test_a_hidden_folder_and_its_files_belong_to_their_lab():
    """``lab_of_path`` names the lab of a hidden folder itself (the runner's hidden phase passes
    the folder: its isolated worker is started from that name) and of the files in it."""
    from reference.paths import lab_of_path

    lab = "lab02_kv_cache_pool"
    assert lab_of_path(f"solutions/{lab}/hidden") == lab
    assert lab_of_path(f"solutions/{lab}/hidden/test_x.py") == lab
    assert lab_of_path(f"hidden/{lab}") == lab
    assert lab_of_path(f"solutions/{lab}/solution.py") is None
