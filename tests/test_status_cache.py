"""Infrastructure (no points): `pagedlab status` reuses the last run's results for a lab whose
files did not change, and re-runs only a lab whose files did."""

from __future__ import annotations

from grading_helpers import make_workbook, pagedlab

LAB = {
    "README.md": "# Lab 1: demo [CPU-OK]\n",
    "starter.py": '''
        def add(a, b):
            """Adds."""
            raise NotImplementedError("TODO(lab1.1): add")
    ''',
    "hints.toml": '''
        ["lab1.1"]
        title = "add"
        level1 = "idea"
        level2 = "formula"
        level3 = "shape"
    ''',
    "test_lab01_demo.py": '''
        import pytest

        @pytest.mark.points(1)
        def test_add(impl):
            """add adds."""
            assert impl.add(1, 2) == 3
    ''',
}


def test_status_reuses_unchanged_labs_and_reruns_changed_ones(tmp_path):
    """The second `status` reuses the stored results (says so, same table); after the starter
    changes, the lab runs again and the new result shows; the TODO line offers the hint."""
    root = make_workbook(tmp_path / "wb", {"lab01_demo": LAB})
    first = pagedlab(root, "status", "--quiet")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "0/1" in first.stdout and "results reused" not in first.stdout
    assert "[pagedlab hint lab1.1]" in first.stdout
    second = pagedlab(root, "status", "--quiet")
    assert "results reused: lab01_demo" in second.stdout and "0/1" in second.stdout
    (root / "labs/lab01_demo/starter.py").write_text(
        'def add(a, b):\n    """Adds."""\n    return a + b\n')
    third = pagedlab(root, "status", "--quiet")
    assert "results reused" not in third.stdout and "1/1" in third.stdout, third.stdout
