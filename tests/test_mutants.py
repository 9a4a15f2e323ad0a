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


def test_a_gpu_escape_is_checked_only_emulated(monkeypatch, capsys):
    """A mutant with gpu_escape (no test can see it on real hardware: a read one element past an
    array that changes nothing) is left out on a real GPU, with its reason printed, and is run
    where kernels are emulated."""
    from reference.grader import strength

    lab, name = "lab04_decode_kernels", "v4_stage_one_block_too_many"
    assert next(m for m in load_mutants(lab) if m.name == name).gpu_escape
    ran = []
    monkeypatch.setattr(strength, "_check_one", lambda m, isolated=False: (ran.append(m.name), (m, None))[1])
    monkeypatch.setattr(strength, "gpu_available", lambda: True)
    monkeypatch.setattr(strength, "emulation_requested", lambda: False)
    assert strength.check_mutants([lab], jobs=1, only=[name]) == []
    assert ran == [] and f"{name}: caught only emulated (on a GPU: " in capsys.readouterr().out
    monkeypatch.setattr(strength, "gpu_available", lambda: False)
    monkeypatch.setattr(strength, "emulation_requested", lambda: True)
    assert strength.check_mutants([lab], jobs=1, only=[name]) == []
    assert ran == [name]
