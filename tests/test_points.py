"""Infrastructure (no points): the points the handouts and the README's lab map state are the
points the tests declare (a new test must not leave a stale total behind)."""

from __future__ import annotations

import re

import pytest

from grading_helpers import lab_points
from reference.paths import LABS_DIR, REPO_ROOT, SOLUTIONS_DIR, lab_names


@pytest.mark.slow
@pytest.mark.parametrize("lab", lab_names())
def test_stated_points_match_the_tests(lab):
    """The handout's **Points:** line and the README's lab-map row give the tests' total (and
    the hidden tests' total where the lab has some)."""
    public = lab_points(lab)
    hidden = lab_points(lab, hidden=True) if (SOLUTIONS_DIR / lab / "hidden").is_dir() else 0
    handout = (LABS_DIR / lab / "README.md").read_text()
    stated = re.search(r"\*\*Points:\*\* (\d+)", handout)
    assert stated and int(stated.group(1)) == public, (
        f"{lab}'s handout states {stated and stated.group(1)} points; its tests declare {public}")
    row = next(line for line in (REPO_ROOT / "README.md").read_text().splitlines()
               if line.startswith(f"| [{int(lab[3:5])}](labs/{lab}/"))
    want = f"| {public} (+{hidden} hidden) |" if hidden else f"| {public} |"
    assert want in row, f"README lab map row for {lab} should say {want!r}: {row}"
