"""Infrastructure (no points): every TODO of every lab has graded hints, and `pagedlab hint`
prints them without handing out the solution's code."""

from __future__ import annotations

import pytest

from grading_helpers import pagedlab
from reference.paths import REPO_ROOT, SOLUTIONS_DIR, lab_names
from reference.tools.hint import load_hints, todo_tags


@pytest.mark.parametrize("lab", lab_names())
def test_every_todo_tag_has_three_levels_of_hints(lab):
    """Each TODO(labN.k) tag in a lab's starter files has a hint with a title and three
    non-empty levels in labs/<lab>/hints.toml, and no hint names a tag the starter lacks."""
    hints = load_hints(lab)
    tags = todo_tags(lab)
    assert tags, f"{lab}: no TODO tags found"
    missing = [t for t in tags if t not in hints]
    assert not missing, f"{lab}/hints.toml has no hint for {missing}: write one per TODO tag"
    for tag in tags:
        for key in ("title", "level1", "level2", "level3"):
            assert hints[tag].get(key, "").strip(), f"{lab}/hints.toml [{tag}] lacks {key}"
    stale = sorted(set(hints) - set(tags))
    assert not stale, f"{lab}/hints.toml has hints for tags no starter file has: {stale}"


@pytest.mark.parametrize("lab", lab_names())
def test_hints_never_hand_out_solution_lines(lab):
    """No line of a hint is a line of the lab's solution code (level 3 gives the shape of the
    code, never the code)."""
    solution_lines = set()
    for path in (SOLUTIONS_DIR / lab).glob("*"):
        if path.suffix in (".py", ".cu"):
            solution_lines |= {ln.strip() for ln in path.read_text().splitlines()
                               if len(ln.strip()) > 30 and not ln.strip().startswith(("#", "//"))}
    for tag, hint in load_hints(lab).items():
        for level in ("level1", "level2", "level3"):
            copied = [ln.strip() for ln in hint[level].splitlines() if ln.strip() in solution_lines]
            assert not copied, f"{lab} [{tag}] {level} copies solution code: {copied}"


def test_hint_command_prints_levels_and_lists_a_lab():
    """`pagedlab hint lab1.2 --level 2` prints levels 1 and 2 (not 3); `pagedlab hint 1` lists
    every tag of Lab 1; an unknown tag exits 2 naming the known ones."""
    proc = pagedlab(REPO_ROOT, "hint", "lab1.2", "--level", "2")
    assert proc.returncode == 0, proc.stderr
    assert "[level 1" in proc.stdout and "[level 2" in proc.stdout and "[level 3" not in proc.stdout
    listing = pagedlab(REPO_ROOT, "hint", "1")
    assert listing.returncode == 0 and all(t in listing.stdout for t in todo_tags(lab_names()[0]))
    unknown = pagedlab(REPO_ROOT, "hint", "lab1.9")
    assert unknown.returncode == 2 and "lab1.1" in unknown.stderr
