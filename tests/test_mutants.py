"""Infrastructure (no points): mutant specs are well-formed and apply to the current solutions."""

from __future__ import annotations

import pytest

from reference.grader.mutants import Edit, Mutant, MutantSpecError, build_mutant, load_mutants


def test_every_mutant_spec_loads_and_applies(tmp_path):
    """Each mutant file parses, and each of its edits matches its solution exactly once."""
    mutants = load_mutants()
    assert mutants, "no mutants found under solutions/<lab>/mutants/"
    for i, mutant in enumerate(mutants):
        folder = build_mutant(mutant, tmp_path / str(i))
        assert (folder / "solution.py").exists()


def test_stale_mutant_is_reported(tmp_path):
    """A mutant whose 'old' text no longer occurs in the solution is an error, not a pass."""
    stale = Mutant(lab="lab01_block_manager", name="stale", mistake="x", caught_by=["t"],
                   edits=[Edit("solution.py", "this text is not in the solution", "")])
    with pytest.raises(MutantSpecError, match="occurs 0 times"):
        build_mutant(stale, tmp_path)
