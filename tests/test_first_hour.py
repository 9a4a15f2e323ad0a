"""Infrastructure (no points): what a newcomer meets first says what it does — `grade` names
the implementation it graded, and a benchmark on an unfinished lab names the TODO it needs."""

from __future__ import annotations

from grading_helpers import grade, make_workbook, pagedlab

STARTER = '''
    def one():
        """Returns 1."""
        raise NotImplementedError("TODO(lab94.1): one")
'''
SOLUTION = '''
    def one():
        """Returns 1."""
        return 1
'''
TESTS = '''
    import pytest

    @pytest.mark.points(2)
    def test_one(impl):
        assert impl.one() == 1
'''


def _workbook(tmp_path, with_solutions: bool):
    labs = {"lab94_numbers": {"starter.py": STARTER, "test_lab94_numbers.py": TESTS,
                              "README.md": "# Lab 94 — Numbers `[CPU-OK]`\n"}}
    solutions = {"lab94_numbers": {"solution.py": SOLUTION}} if with_solutions else None
    return make_workbook(tmp_path, labs, solutions)


def test_grade_in_the_workbook_repository_asks_which_implementation(tmp_path):
    """In a tree with solutions/, `grade` without LAB_IMPL grades nothing (exit 2) and names
    both choices, so a forgotten LAB_IMPL=starter never shows the solutions' full marks."""
    root = _workbook(tmp_path, with_solutions=True)
    proc, res = grade(root, "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "LAB_IMPL=starter pagedlab grade" in proc.stderr
    assert "LAB_IMPL=solution pagedlab grade" in proc.stderr
    assert res == {}, "grade wrote results without knowing what it graded"


def test_grade_names_the_implementation_above_the_table(tmp_path):
    """The table's header line says which code was graded: the solutions or the student's."""
    root = _workbook(tmp_path, with_solutions=True)
    proc, res = grade(root, "--quiet", env={"LAB_IMPL": "solution"})
    assert "graded: LAB_IMPL=solution (the reference solutions" in proc.stdout, proc.stdout
    assert res["score"] == 2
    proc, res = grade(root, "--quiet", env={"LAB_IMPL": "starter"})
    assert "graded: LAB_IMPL=starter (your code" in proc.stdout, proc.stdout
    assert res["score"] == 0


def test_grade_in_a_release_defaults_to_the_starter_and_says_so(tmp_path):
    """Without solutions/ (a student release) `grade` grades the starter and says it chose it."""
    root = _workbook(tmp_path, with_solutions=False)
    proc, res = grade(root, "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "graded: LAB_IMPL=starter (your code" in proc.stdout
    assert "the default in a release" in proc.stdout


def test_bench_on_an_unfinished_lab_names_the_todo(tmp_path):
    """`pagedlab bench blocks` on an untouched Lab 1 starter exits 1 with one line naming the
    TODO it reached, not a traceback."""
    from reference.paths import REPO_ROOT

    proc = pagedlab(REPO_ROOT, "bench", "blocks", "--sizes", "1000", "--reps", "10",
                    "--out", str(tmp_path), env={"LAB_IMPL": "starter"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "needs TODO(lab1." in proc.stderr, proc.stderr


def test_notebook_cells_name_the_todo_they_need(capsys):
    """A notebook cell wrapped in `student_code` prints one line naming the TODO and the file,
    and lets the notebook go on; any other error still propagates."""
    import pytest

    from reference.notebook import student_code

    with student_code("lab04_decode_kernels"):
        raise NotImplementedError("TODO(lab4.3): plan_split_kv — how split-K cuts the contexts")
    out = capsys.readouterr().out
    assert "needs TODO(lab4.3)" in out and "labs/lab04_decode_kernels/starter.py" in out, out
    assert len(out.strip().splitlines()) == 1, out
    with pytest.raises(NotImplementedError, match="not a TODO"):
        with student_code("lab04_decode_kernels"):
            raise NotImplementedError("not a TODO")
