"""Infrastructure (no points): the LAB_IMPL loader picks, names and refuses implementations."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reference import loader
from reference.paths import REPO_ROOT


def test_default_is_solution_when_solutions_exist(monkeypatch):
    """Unset LAB_IMPL means 'solution' in a checkout that has solutions/."""
    monkeypatch.delenv("LAB_IMPL", raising=False)
    assert loader.impl_name() == "solution"


@pytest.mark.parametrize("value", ["starter", "solution", " starter "])
def test_valid_values(monkeypatch, value):
    """starter and solution are accepted (surrounding blanks ignored)."""
    monkeypatch.setenv("LAB_IMPL", value)
    assert loader.impl_name() == value.strip()


@pytest.mark.parametrize("value", ["Solution", "student", "1", "solutions"])
def test_invalid_values_are_refused_naming_the_valid_ones(monkeypatch, value):
    """Anything else raises, and the message names both valid values."""
    monkeypatch.setenv("LAB_IMPL", value)
    with pytest.raises(loader.LabImplError, match="LAB_IMPL=starter.*LAB_IMPL=solution"):
        loader.impl_name()


def test_invalid_value_stops_a_pytest_run():
    """A pytest run with a bad LAB_IMPL stops before running anything, saying why."""
    env = dict(os.environ, LAB_IMPL="bogus")
    proc = subprocess.run([sys.executable, "-m", "pytest", "labs", "-q"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "LAB_IMPL='bogus' is not valid" in proc.stderr


def test_starter_and_solution_load_under_distinct_names():
    """Each lab's starter and solution import as different modules (no name collisions)."""
    names = set()
    for lab in ("lab01_block_manager",):
        for impl in ("starter", "solution"):
            mod = loader.load_impl(lab, impl)
            assert impl in mod.__name__ and lab in mod.__name__
            names.add(mod.__name__)
    assert len(names) == 2


def test_pytest_header_names_the_implementation():
    """The pytest header says which implementation is under test."""
    env = dict(os.environ, LAB_IMPL="starter")
    proc = subprocess.run([sys.executable, "-m", "pytest", "labs/lab01_block_manager", "--co"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert "implementation under test: LAB_IMPL=starter" in proc.stdout


def test_mutant_dir_overrides_lab_impl(tmp_path, monkeypatch):
    """PAGEDLAB_IMPL_DIR (the mutant check's override) loads solution.py from that folder."""
    folder = tmp_path / "lab01_block_manager"
    folder.mkdir()
    (folder / "solution.py").write_text("MARK = 'mutant'\n")
    monkeypatch.setenv(loader.MUTANT_DIR_ENV, str(folder))
    monkeypatch.delitem(sys.modules, "_pagedlab_mutant_lab01_block_manager", raising=False)
    monkeypatch.delitem(sys.modules, "_pagedlab_mutant_lab01_block_manager.solution", raising=False)
    mod = loader.load_impl("lab01_block_manager")
    assert mod.MARK == "mutant"


def test_unknown_lab_is_refused():
    """Asking for a lab that does not exist is an error naming it."""
    with pytest.raises(loader.LabImplError, match="lab99_nothing"):
        loader.load_impl("lab99_nothing")
