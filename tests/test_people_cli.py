"""Infrastructure (no points): the commands people type — status, doctor, progress lines and
exit codes CI can rely on."""

from __future__ import annotations

import io
import json

import pytest

from grading_helpers import grade, make_workbook, pagedlab
from reference.grader.results import TestResult
from reference.grader.progress import Progress

STARTER = '''
    def one():
        """Returns 1."""
        raise NotImplementedError("TODO(lab94.1): one")


    def two():
        """Returns 2."""
        # TODO(lab94.2): return 2
        raise NotImplementedError("TODO(lab94.2): two")
'''
DONE = '''
    def one():
        """Returns 1."""
        return 1


    def two():
        """Returns 2."""
        return 2
'''
TESTS = '''
    import pytest

    @pytest.mark.points(1)
    def test_one(impl):
        assert impl.one() == 1

    @pytest.mark.points(3)
    def test_two(impl):
        assert impl.two() == 2
'''
HANDOUT = "# Lab 94 — Numbers `[CPU-OK]`\n"


def _workbook(tmp_path, starter=STARTER):
    return make_workbook(tmp_path, {
        "lab94_numbers": {"starter.py": starter, "test_lab94_numbers.py": TESTS,
                          "README.md": HANDOUT},
        "lab95_more": {"starter.py": DONE, "test_lab95_more.py": TESTS,
                       "README.md": "# Lab 95 — Kernels `[GPU-REQ]`\n"},
    })


def test_status_shows_points_and_where_the_next_todo_is(tmp_path):
    """status prints each lab's points and needs, and the next TODO with its file and line."""
    root = _workbook(tmp_path)
    proc = pagedlab(root, "status", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if ln.startswith("lab9")}
    assert "0/4" in lines["lab94_numbers"] and "CPU-OK" in lines["lab94_numbers"]
    assert "TODO(lab94.1) one" in lines["lab94_numbers"]
    assert "labs/lab94_numbers/starter.py:3" in lines["lab94_numbers"]
    assert "4/4" in lines["lab95_more"] and "GPU-REQ" in lines["lab95_more"]
    assert "done" in lines["lab95_more"]
    assert "next: lab94_numbers: TODO(lab94.1)" in proc.stdout
    assert not (root / "results.json").exists()  # status writes nothing


def test_doctor_reports_checks_and_lab_verdicts():
    """doctor lists Python/numpy/torch/CuPy/driver/nvcc checks with a fix for each miss, and
    says per lab whether it runs here."""
    from reference.paths import REPO_ROOT

    proc = pagedlab(REPO_ROOT, "doctor", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    names = {c["name"] for c in data["checks"]}
    assert {"Python", "numpy", "torch", "GPU", "CuPy", "NVRTC", "NVIDIA driver", "nvcc"} <= names
    assert all(c["fix"] for c in data["checks"] if not c["ok"])
    labs = {v["lab"]: v for v in data["labs"]}
    assert labs["lab01_block_manager"]["needs"] == "CPU-OK"
    assert labs["lab01_block_manager"]["verdict"] == "runs fully" or proc.returncode == 1


def test_progress_lines():
    """On a terminal one line is redrawn per lab; elsewhere each lab prints start and end."""
    live, plain = io.StringIO(), io.StringIO()
    records = [TestResult(nodeid="t::a", lab="lab01_x"),
               TestResult(nodeid="t::b", lab="lab01_x", outcome="failed")]
    for stream, is_live in ((live, True), (plain, False)):
        p = Progress(stream, live=is_live)
        p.start("lab01_x")
        p.update("lab01_x", 1, 2)
        p.end("lab01_x", records)
    assert "\r" in live.getvalue() and "1/2" in live.getvalue()
    assert plain.getvalue().splitlines()[0] == "grading lab01_x ..."
    assert "1/2 passed" in plain.getvalue() and "\r" not in plain.getvalue()


@pytest.mark.slow
def test_grade_exit_codes(tmp_path):
    """0 graded; 1 below --fail-under; 2 could not grade (bad LAB_IMPL, unknown lab)."""
    root = _workbook(tmp_path)
    proc, res = grade(root, "--quiet")
    assert proc.returncode == 0 and res["score"] == 4 and res["max_score"] == 8
    proc, _ = grade(root, "--quiet", "--fail-under", "60")
    assert proc.returncode == 1
    proc, _ = grade(root, "--quiet", "--fail-under", "50")
    assert proc.returncode == 0
    proc, _ = grade(root, "--quiet", env={"LAB_IMPL": "bogus"})
    assert proc.returncode == 2 and "LAB_IMPL='bogus' is not valid" in proc.stderr
    proc = pagedlab(root, "grade", "7")
    assert proc.returncode == 2 and "no lab matches" in proc.stderr


def test_broken_test_file_is_reported_and_the_rest_graded(tmp_path):
    """A test file that fails to import costs its own tests (reported, exit 3), not the lab."""
    root = _workbook(tmp_path)
    (root / "labs/lab94_numbers/test_lab94_broken.py").write_text("import not_a_module\n")
    proc, res = grade(root, "--quiet")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "collection error in labs/lab94_numbers/test_lab94_broken.py" in res["output"]
    assert res["max_score"] == 8
