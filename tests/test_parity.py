"""Infrastructure (no points): the starter/solution parity check sees drift in what the two files
keep in pairs — constants, private helpers' signatures, shared headers — and the workbook keeps
given files once."""

from __future__ import annotations

import textwrap

import pytest

import reference.grader.parity as parity
from reference.grader.parity import check_lab, module_constants, private_helpers
from reference.paths import LABS_DIR, SOLUTIONS_DIR, lab_names

LABS_WITH_SOLUTIONS = [lab for lab in lab_names() if (SOLUTIONS_DIR / lab).is_dir()]


def make_lab(tmp_path, starter: str, solution: str, files: dict[str, tuple[str, str]] = {}):
    """A lab99 pair under tmp_path; ``files`` maps a name to (labs/ text, solutions/ text)."""
    lab, sol = tmp_path / "labs" / "lab99_x", tmp_path / "solutions" / "lab99_x"
    lab.mkdir(parents=True)
    sol.mkdir(parents=True)
    (lab / "starter.py").write_text(textwrap.dedent(starter))
    (sol / "solution.py").write_text(textwrap.dedent(solution))
    for name, (given, solved) in files.items():
        (lab / name).write_text(given)
        (sol / name).write_text(solved)
    return lab, sol


@pytest.mark.parametrize("lab", LABS_WITH_SOLUTIONS)
def test_every_lab_is_in_parity(lab):
    """Each lab's starter and solution agree on public API, paired constants, private helper
    signatures and shared headers (what `pagedlab release` requires)."""
    problems = check_lab(LABS_DIR / lab, SOLUTIONS_DIR / lab)
    assert problems == [], "starter/solution drift:\n" + "\n".join(problems)


@pytest.mark.parametrize("lab", LABS_WITH_SOLUTIONS)
def test_no_given_file_is_kept_twice(lab):
    """No file of solutions/<lab>/ is a byte-for-byte copy of its namesake in labs/<lab>/: a
    given file (a header, a provided kernel) lives once, in labs/, and the solution uses it
    from there (issue #16: copies drift and nothing noticed)."""
    twins = [p.relative_to(SOLUTIONS_DIR).as_posix() for p in sorted((SOLUTIONS_DIR / lab).rglob("*"))
             if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts
             and (LABS_DIR / p.relative_to(SOLUTIONS_DIR)).is_file()
             and (LABS_DIR / p.relative_to(SOLUTIONS_DIR)).read_bytes() == p.read_bytes()]
    assert twins == [], (f"{twins} are identical in labs/ and solutions/: delete the solutions/ "
                         "copy (kernels find labs/<lab>/ headers through "
                         "reference.cuda.kernel_include_dirs)")


def test_constants_are_compared(tmp_path):
    """A module constant with another value, or a public one on one side only, is reported;
    a private constant on one side only is not."""
    lab, sol = make_lab(tmp_path, """
        BLOCK = 16
        NAMES, SIZES = ("a", "b"), (1, 2)
        _ONLY_HERE = 1
    """, """
        BLOCK = 32
        NAMES, SIZES = ("a", "b"), (1, 3)
        EXTRA: int = 4
    """)
    problems = "\n".join(check_lab(lab, sol))
    assert "constant BLOCK differs" in problems
    assert "constant SIZES differs" in problems and "NAMES" not in problems
    assert "constant EXTRA is in the solution but not the starter" in problems
    assert "_ONLY_HERE" not in problems
    assert module_constants("A, B = 1, 2\nC: int = 3\n") == {"A": "1", "B": "2", "C": "int = 3"}


def test_private_helper_signatures_are_compared(tmp_path):
    """A private helper both files define must keep one signature (bodies may differ); one
    defined on one side only is free."""
    lab, sol = make_lab(tmp_path, """
        def _launch(kernel, *, debug=None):
            raise NotImplementedError("TODO(lab99.1)")

        def _same(x):
            return x

        def _mine():
            pass
    """, """
        def _launch(kernel, *, debug=None, tuning=None):
            return kernel

        def _same(x):
            return x + 1
    """)
    problems = check_lab(lab, sol)
    assert len(problems) == 1 and "private helper _launch differs" in problems[0], problems
    assert set(private_helpers("def _a(x): pass\ndef __b__(): pass\ndef c(): pass\n")) == {"_a"}


def test_paired_headers_must_be_identical(tmp_path):
    """A .cuh header present in both folders must be byte-identical: it is given code."""
    same = "#pragma once\n"
    lab, sol = make_lab(tmp_path, "X = 1\n", "X = 1\n",
                        {"a.cuh": (same, same), "b.cuh": (same, same + "// edited\n")})
    problems = check_lab(lab, sol)
    assert len(problems) == 1 and "b.cuh: header differs" in problems[0], problems


def test_private_methods_and_given_bases(tmp_path):
    """A private method both classes define keeps one signature; a class that inherits given
    methods from a base kept once (``labs/<lab>/_*.py``) is in parity when both sides name the
    same base, and reported when they do not."""
    lab, sol = make_lab(tmp_path, """
        from labs.lab99_x._given import PoolBase

        class Pool(PoolBase):
            def _copy(self, seq, new_block_id):
                raise NotImplementedError("TODO(lab99.1)")
    """, """
        from labs.lab99_x._given import PoolBase

        class Pool(PoolBase):
            def _copy(self, seq, new_block_id, *, fast=False):
                pass

            def _only_here(self):
                pass
    """)
    problems = check_lab(lab, sol)
    assert len(problems) == 1 and "private helper Pool._copy differs" in problems[0], problems
    lab, sol = make_lab(tmp_path / "b", "class Pool(PoolBase):\n    pass\n",
                        "class Pool:\n    pass\n")
    assert any("Pool signature differs" in p for p in check_lab(lab, sol))


def test_given_code_reexported_by_both_files_is_paired_by_origin(tmp_path):
    """A given function kept once and re-exported by both files is in parity when both import it
    from the same module; imported from two places, or imported on one side and defined on the
    other, it is reported (the second with a hint that given code is imported by both)."""
    lab, sol = make_lab(tmp_path, """
        from labs.lab99_x._numerics import round_to
        from labs.lab99_x._numerics import helper
        from labs.lab99_x._numerics import scale
    """, """
        from labs.lab99_x._numerics import round_to
        from labs.lab99_x._other import helper

        def scale(x):
            return x
    """)
    problems = check_lab(lab, sol)
    assert len(problems) == 2, problems
    text = "\n".join(problems)
    assert "helper is imported from different places" in text
    assert ("function scale is in the solution but not the starter (the starter imports it from "
            "labs.lab99_x._numerics") in text
    assert "round_to" not in text


def test_code_kept_twice_is_reported_except_short_launch_glue(tmp_path):
    """A function whose body is the same in starter and solution (not a TODO) is given code kept
    twice and is reported; a TODO stub is not, and neither is an allow-listed launcher's glue of
    at most a few statements."""
    lab, sol = make_lab(tmp_path, """
        def helper(x):
            return x + 1

        def task(x):
            raise NotImplementedError("TODO(lab99.1)")
    """, """
        def helper(x):
            return x + 1

        def task(x):
            return helper(x)
    """)
    problems = check_lab(lab, sol)
    assert len(problems) == 1 and "helper is the same in starter and solution" in problems[0], problems
    monkey = dict(parity.SHARED_GLUE)
    try:
        parity.SHARED_GLUE[lab.name] = {"helper"}
        assert check_lab(lab, sol) == []
    finally:
        parity.SHARED_GLUE.clear()
        parity.SHARED_GLUE.update(monkey)
