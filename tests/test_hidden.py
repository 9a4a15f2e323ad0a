"""Infrastructure (no points): hidden tests are graded with the lab, shown to students only
after the due date and only as a message, counted in every summary, and never released."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from grading_helpers import by_name, grade, make_workbook, pagedlab
from reference.grader.gradebook import gradescope_results, markdown_summary
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
    towards the points, carries visibility after_due_date, shows the failure message but no
    traceback or code, and the summary says how many hidden tests failed in the lab."""
    root = _workbook(tmp_path)
    proc, res = grade(root, "--quiet", env={"LAB_IMPL": "solution"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = by_name(res)
    hidden = tests["test_hidden_large"]
    assert hidden["visibility"] == "after_due_date" and "hidden" in hidden["tags"]
    assert hidden["status"] == "failed" and hidden["max_score"] == 3
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
    assert "TODO(lab93.1)" in by_name(res)["test_hidden_large"]["output"]


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
    res = gradescope_results(recs, "LAB_IMPL=starter")
    assert res["tests"][1]["output"] == "AssertionError: no\nassert 1 == 2"
    assert "0 hidden tests failed in lab01_a" in markdown_summary(recs, "x")
    assert student_message("x" * 2000).endswith("…")
