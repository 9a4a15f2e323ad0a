"""Infrastructure (no points): points markers, the grade command and its Gradescope output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from reference.grader.gradebook import gradescope_results, summarize, todos
from reference.paths import REPO_ROOT, lab_names

RECORDS = [
    {"nodeid": "labs/lab01_x/test_a.py::test_one", "lab": "lab01_x", "name": "test_one",
     "doc": "Proves one.", "points": 2.0, "outcome": "passed", "when": "", "message": "", "details": ""},
    {"nodeid": "labs/lab01_x/test_a.py::test_two", "lab": "lab01_x", "name": "test_two", "doc": "",
     "points": 1.0, "outcome": "failed", "when": "call",
     "message": "NotImplementedError: TODO(lab1.2): do the thing", "details": "trace"},
    {"nodeid": "labs/lab04_y/test_b.py::test_gpu", "lab": "lab04_y", "name": "test_gpu", "doc": "",
     "points": 3.0, "outcome": "skipped", "when": "setup", "message": "no GPU", "details": ""},
]


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
