"""Infrastructure (no points): points markers, the grade command and its Gradescope output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fractions import Fraction

import pytest

from reference.grader.gradebook import gradescope_results, summarize, todos
from reference.grader.results import TestResult
from reference.paths import REPO_ROOT, lab_names

RECORDS = [TestResult.from_json(r) for r in [
    {"nodeid": "labs/lab01_x/test_a.py::test_one", "lab": "lab01_x", "name": "test_one",
     "doc": "Proves one.", "points": 2.0, "outcome": "passed", "when": "", "message": "", "details": ""},
    {"nodeid": "labs/lab01_x/test_a.py::test_two", "lab": "lab01_x", "name": "test_two", "doc": "",
     "points": 1.0, "outcome": "failed", "when": "call",
     "message": "NotImplementedError: TODO(lab1.2): do the thing", "details": "trace"},
    {"nodeid": "labs/lab04_y/test_b.py::test_gpu", "lab": "lab04_y", "name": "test_gpu", "doc": "",
     "points": 3.0, "outcome": "skipped", "when": "setup", "message": "no GPU", "details": ""},
]]


def test_summary_counts_points_per_lab():
    """Passed tests earn their points; failed and skipped ones count only towards the maximum."""
    rows = {r.lab: r for r in summarize(RECORDS)}
    assert (rows["lab01_x"].points, rows["lab01_x"].max_points) == (2.0, 3.0)
    assert (rows["lab04_y"].points, rows["lab04_y"].max_points, rows["lab04_y"].skipped) == (0, 3.0, 1)


def test_gradescope_format():
    """results.json has score, max_score and per-test name/score/max_score/status/output/tags."""
    res = gradescope_results(RECORDS, "LAB_IMPL=starter")
    assert res["score"] == 2.0 and res["max_score"] == 6.0
    for test in res["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output", "tags"}
    failed = res["tests"][1]
    assert failed["status"] == "failed" and "TODO(lab1.2)" in failed["output"]
    assert failed["tags"] == ["lab01_x"]


def test_shared_points_add_up_exactly():
    """A test's points shared by its cases add up to exactly its points, not 0.9999."""
    cases = [TestResult(nodeid=f"labs/lab01_x/test_a.py::test_p[{i}]", lab="lab01_x",
                        points=Fraction(1, 3)) for i in range(3)]
    row, = summarize(cases * 281)
    assert row.max_points == 281 and row.points == 281
    assert gradescope_results(cases, "x")["max_score"] == 1.0
    back = TestResult.from_json(cases[0].to_json())
    assert back.points == Fraction(1, 3) and cases[0].to_json()["points"] == "1/3"


@pytest.mark.parametrize("bad", [{"nodeid": "a", "lab": "l", "outcome": "won"},
                                 {"nodeid": "a", "lab": "l", "points": -1},
                                 {"nodeid": "a", "lab": "l", "hidden": "yes"},
                                 {"nodeid": "a", "lab": "l", "extra": 1},
                                 {"lab": "l"}])
def test_malformed_result_records_are_refused(bad):
    """A result record with an unknown outcome, field or a wrong type is refused, not graded."""
    with pytest.raises(ValueError):
        TestResult.from_json(bad)


def test_todos_are_listed_in_task_order():
    """The grade lists the TODO tags the failing tests reached."""
    assert todos(RECORDS) == [("lab1.2", "do the thing")]


def test_lab_test_without_points_stops_the_run(tmp_path):
    """A lab test with no points marker is a usage error, not a silently ungraded test."""
    lab = tmp_path / "labs" / "lab99_tmp"
    lab.mkdir(parents=True)
    (lab / "test_lab99_unmarked.py").write_text("def test_unmarked():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "reference.grader.grading", "-q",
                           str(lab)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 4
    assert "needs exactly one @pytest.mark.points" in proc.stderr


def test_first_failure_skips_the_later_cases_of_a_failed_test_only(tmp_path):
    """``--pagedlab-first-failure`` (the mutant check's): once a case fails in its body, that
    test function's later cases are skipped, saying why; every other function runs in full."""
    lab = tmp_path / "labs" / "lab99_tmp"
    lab.mkdir(parents=True)
    (lab / "test_lab99_cases.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.points(1)\n@pytest.mark.parametrize('i', range(4))\n"
        "def test_cases(i):\n    assert i not in (1, 3)\n\n"
        "@pytest.mark.points(1)\n@pytest.mark.parametrize('i', range(3))\n"
        "def test_other(i):\n    assert i != 2\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "reference.grader.grading", "-v",
                           "-rs", "-p", "no:cacheprovider", "--pagedlab-first-failure", str(lab)],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    outcomes = {}
    for line in proc.stdout.splitlines():
        words = line.split()
        if words and "::" in words[0] and len(words) > 1:
            outcomes[words[0].split("::")[1]] = words[1]
    assert outcomes == {"test_cases[0]": "PASSED", "test_cases[1]": "FAILED",
                        "test_cases[2]": "SKIPPED", "test_cases[3]": "SKIPPED",
                        "test_other[0]": "PASSED", "test_other[1]": "PASSED",
                        "test_other[2]": "FAILED"}, proc.stdout
    assert "an earlier case of this test failed" in proc.stdout


@pytest.mark.slow
def test_readme_grade_command_scores_every_starter_zero(tmp_path):
    """The README's main job, `LAB_IMPL=starter pagedlab grade`, grades every lab: each one is in
    results.json with tests, the score is 0, and the TODOs to do are listed."""
    env = dict(os.environ, LAB_IMPL="starter")
    env.pop("GITHUB_STEP_SUMMARY", None)
    results, summary = tmp_path / "results.json", tmp_path / "summary.md"
    proc = subprocess.run([sys.executable, "-m", "reference.tools.cli", "grade", "--results",
                           str(results), "--summary", str(summary)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(results.read_text())
    graded = {tag for t in data["tests"] for tag in t["tags"] if tag.startswith("lab")}
    assert graded == set(lab_names()), f"labs missing from the grade: {set(lab_names()) - graded}"
    assert data["score"] == 0 and data["max_score"] > 0
    assert all(t["status"] == "failed" for t in data["tests"] if "skipped" not in t["output"])
    assert "TODO(lab1.1)" in proc.stdout
    assert "Still to do" in summary.read_text()


def test_todos_follow_the_handouts_task_order():
    """grade and status send a student to the task the handout asks for first (Lab 1 starts
    with the free queue, TODO(lab1.2), before the manager of TODO(lab1.1))."""
    recs = [TestResult(nodeid=f"labs/lab01_block_manager/test_x.py::t{i}", lab="lab01_block_manager",
                       outcome="failed", message=f"NotImplementedError: TODO({tag}): x")
            for i, tag in enumerate(["lab1.1", "lab1.3", "lab1.2"])]
    handout = (REPO_ROOT / "labs/lab01_block_manager/README.md").read_text()
    first = min(["lab1.1", "lab1.2", "lab1.3"], key=lambda t: handout.index(f"TODO({t})"))
    assert todos(recs)[0][0] == first
