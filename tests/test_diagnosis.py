"""Infrastructure (no points): failing tests are matched against the mutants' failure signatures,
each mutant is diagnosed as itself (or a named equivalent), and what ships is student-safe."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from grading_helpers import pagedlab
from reference.context_lost import is_own_failure, lost_context_note
from reference.grader import diagnosis
from reference.grader.diagnosis import (diagnose, diagnosis_lines, groups, jaccard, load_entries,
                                        signatures_path, student_diagnosis)
from reference.grader.results import TestResult
from reference.grader.mutants import build_mutant, load_mutants
from reference.loader import MUTANT_DIR_ENV
from reference.paths import REPO_ROOT, lab_names

SLOW = pytest.mark.skipif(os.environ.get("PAGEDLAB_SKIP_SLOW") == "1",
                          reason="slow end-to-end test (PAGEDLAB_SKIP_SLOW=1)")
SIGNED = [(lab, name) for lab in lab_names() for name in load_entries(lab)]


@pytest.mark.parametrize("lab, name", SIGNED, ids=[f"{lab}/{name}" for lab, name in SIGNED])
def test_every_mutant_is_diagnosed_as_itself_or_a_named_equivalent(lab, name):
    """The failing tests of each mutant (its stored signature) are diagnosed as that mutant's
    mistake — alone, or together with mutants that fail exactly the same tests."""
    entries = load_entries(lab)
    if not entries[name]["failing"]:
        # A mistake only the hidden tests catch fails no public test: there is nothing to
        # diagnose in a student's run (and a diagnosis would point at the hidden test).
        hidden = {p.stem for p in (REPO_ROOT / "solutions" / lab / "hidden").glob("test_*.py")}
        assert entries[name]["caught_by"] and all(
            any(f"def {t}(" in (REPO_ROOT / "solutions" / lab / "hidden" / f"{h}.py").read_text()
                for h in hidden) for t in entries[name]["caught_by"]), (
            f"{lab}/{name} fails no public test, yet names public tests in caught_by")
        return
    found = diagnose(set(entries[name]["failing"]), entries)
    assert found is not None, (
        f"{lab}/{name}: its failures match no mistake clearly — another mutant's signature is "
        f"too close; make a test tell them apart")
    assert name in found.names, f"{lab}/{name} is diagnosed as {found.names}"
    assert entries[name]["mistake"] in found.describe()


def test_every_cpu_mutant_has_a_signature_that_includes_its_caught_by():
    """`pagedlab check --signatures` was run: every mutant this machine can check has a stored
    signature, and it contains the tests the mutant declares it is caught by."""
    for mutant in load_mutants():
        if mutant.requires_gpu:
            continue
        entries = load_entries(mutant.lab)
        assert mutant.name in entries, (f"{mutant.lab}/{mutant.name} has no signature: run "
                                         f"`pagedlab check {mutant.lab[3:5]} --signatures`")
        assert set(mutant.caught_by) <= set(entries[mutant.name]["failing"]), mutant.name


def test_only_a_clear_match_names_a_mistake():
    """A match needs Jaccard >= 0.8 and a unique best; equal signatures form one group."""
    entries = {"a": {"mistake": "A", "see": "s", "failing": ["t1", "t2", "t3", "t4", "t5", "t8"]},
               "b": {"mistake": "B", "see": "s", "failing": ["t6"]},
               "c": {"mistake": "C", "see": "s", "failing": ["t6"]},
               "d": {"mistake": "D", "see": "s", "failing": ["t1", "t2", "t3", "t4", "t5", "t7"]}}
    assert len(groups(entries)) == 3  # b and c are one group
    assert diagnose({"t6"}, entries).names == ("b", "c")
    assert diagnose({"t1", "t2", "t3", "t4", "t5"}, entries) is None  # a vs d: a tie
    assert diagnose({"t1", "t2", "t3", "t4", "t5", "t8"}, entries).names == ("a",)  # exact wins
    assert diagnose({"t1", "t9"}, entries) is None  # nothing near 0.8
    assert diagnose(set(), entries) is None
    assert jaccard({"x"}, {"x", "y"}) == 0.5


def test_failures_after_a_lost_cuda_context_are_not_diagnosed(monkeypatch):
    """A failure the lost-context plugin marks as an earlier test's (its message begins "not
    this test's own failure", with or without "NOTE: ") tells nothing about its own test: that
    test is left out on both sides, so a mistake is still named by the failures before the loss,
    and a failure after it does not pull the match elsewhere."""
    later = lost_context_note("labs/lab90_x/test_x.py::t9", "labs/lab90_x/test_x.py::t1")
    assert not is_own_failure(later) and not is_own_failure(later.removeprefix("NOTE: "))
    assert is_own_failure("AssertionError: wrong output at sequence 0")
    entries = {"a": {"mistake": "A", "see": "s", "failing": ["t1", "t2", "t3", "t4"]},
               "b": {"mistake": "B", "see": "s", "failing": ["t1", "t5"]}}
    monkeypatch.setattr(diagnosis, "load_entries", lambda lab: entries)

    def run(own, cascaded):
        def record(name, message):
            return TestResult(nodeid=f"labs/lab90_x/test_x.py::{name}", lab="lab90_x", name=name,
                              doc="", points=1, outcome="failed", message=message)
        return ([record(t, "AssertionError: wrong output") for t in own]
                + [record(t, later.removeprefix("NOTE: ")) for t in cascaded])

    # t1 lost the context; t3, t4 (a's) and t8, t9 (no mutant's) failed after it.
    [line] = diagnosis_lines(run(["t1", "t2"], ["t3", "t4", "t8", "t9"]))
    assert "look like: A" in line, line
    # Counted as their tests' own failures, t8 and t9 would hide the match (4 of 6 in common).
    assert diagnosis_lines(run(["t1", "t2", "t3", "t4", "t8", "t9"], [])) == []
    assert diagnose({"t1", "t2"}, entries) is None  # without the unknown tests: 2 of 4


@pytest.mark.parametrize("lab", [lab for lab in lab_names() if signatures_path(lab).is_file()])
def test_released_diagnosis_holds_no_solution_code(lab):
    """What a release ships per mutant is its mistake in words, the handout section and the
    failing test names — never the edits (solution code)."""
    data = student_diagnosis(lab)
    for entry in data["mutants"].values():
        assert set(entry) == {"mistake", "see", "failing"}


@SLOW
@pytest.mark.slow
def test_grade_names_the_mistake_of_a_mutant():
    """`pagedlab grade 1` on Lab 1's double-free mutant prints "your failures look like:
    <its mistake> — see handout §..."."""
    mutant = next(m for m in load_mutants("lab01_block_manager") if m.name == "double_free_accepted")
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_mutant(mutant, Path(tmp))
        proc = pagedlab(REPO_ROOT, "grade", "1", "--quiet", "--no-hidden", "--results",
                        str(Path(tmp) / "r.json"), "--summary", str(Path(tmp) / "s.md"),
                        env={MUTANT_DIR_ENV: str(folder), "LAB_IMPL": "solution"})
    assert f"your failures look like: {mutant.mistake} — see handout §" in proc.stdout, proc.stdout
