"""Infrastructure (no points): `pagedlab show` draws the implementation's own state per step."""

from __future__ import annotations

import pytest

from grading_helpers import pagedlab
from reference.paths import REPO_ROOT


@pytest.mark.parametrize("lab, needle", [("1", "free queue (head = next to hand out): [3, 4, 5, 2, 1]"),
                                         ("2", "table row [0, 1, 3, -1, -1, -1]")])
def test_show_draws_every_step_of_the_solution(lab, needle):
    """With the solution, every step of the scenario is drawn (free-queue order after
    free_blocks; the copy-on-write block in the child's table row)."""
    proc = pagedlab(REPO_ROOT, "show", lab, env={"LAB_IMPL": "solution"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 7" in proc.stdout and needle in proc.stdout


def test_show_stops_at_the_step_a_starter_raises():
    """An untouched starter stops at step 1 with its TODO and where it was raised; exit 1."""
    proc = pagedlab(REPO_ROOT, "show", "1", env={"LAB_IMPL": "starter"})
    assert proc.returncode == 1
    assert "step 1 raised NotImplementedError: TODO(lab1.1)" in proc.stdout
    assert "starter.py:" in proc.stdout
