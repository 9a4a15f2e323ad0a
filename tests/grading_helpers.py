"""Helpers for the grading infrastructure tests: throwaway workbooks with synthetic labs.

A synthetic workbook is a folder with this checkout's trusted files (``conftest.py``,
``pyproject.toml``, ``reference/``) and made-up labs. Commands run there with ``python -m``
from its root, so they import *its* ``reference`` package and grade *its* labs — never this
checkout's half-written ones.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from reference.grader.results import total_points
from reference.paths import REPO_ROOT

TRUSTED = ("conftest.py", "pyproject.toml", "README.md")


def make_workbook(root: Path, labs: dict[str, dict[str, str]],
                  solutions: dict[str, dict[str, str]] | None = None) -> Path:
    """Writes a workbook with synthetic labs.

    Args:
        root: an empty (or missing) folder.
        labs: lab folder name -> {file name: source}; sources are dedented.
        solutions: the same for ``solutions/`` (omit for a student-style tree).

    Returns:
        ``root``.
    """
    root.mkdir(parents=True, exist_ok=True)
    for name in TRUSTED:
        shutil.copy2(REPO_ROOT / name, root / name)
    shutil.copytree(REPO_ROOT / "reference", root / "reference",
                    ignore=shutil.ignore_patterns("__pycache__", "mutants", "results"))
    for top, tree in (("labs", labs), ("solutions", solutions)):
        if tree is None:
            continue
        (root / top).mkdir(exist_ok=True)
        (root / top / "__init__.py").write_text("")
        for lab, files in tree.items():
            (root / top / lab).mkdir(parents=True, exist_ok=True)
            (root / top / lab / "__init__.py").touch()
            for name, text in files.items():
                path = root / top / lab / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(textwrap.dedent(text).lstrip())
    return root


def pagedlab(root: Path, *args: str, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``python -m reference.tools.cli ARGS`` in a workbook (its own reference package)."""
    full_env = dict(os.environ)
    for var in ("LAB_IMPL", "GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT", "PYTEST_ADDOPTS"):
        full_env.pop(var, None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "reference.tools.cli", *args], cwd=root, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def grade(root: Path, *args: str, env: dict[str, str] | None = None,
          timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    """Runs ``pagedlab grade`` in a workbook; returns the process and its results.json."""
    results = root / "out-results.json"
    proc = pagedlab(root, "grade", "--results", str(results), "--summary",
                    str(root / "out-summary.md"), *args, env=env, timeout=timeout)
    data = json.loads(results.read_text()) if results.exists() else {}
    return proc, data


def by_name(results: dict) -> dict[str, dict]:
    """Maps each results.json test to its function name (``test_x`` or ``test_x[case]``)."""
    out = {}
    for test in results["tests"]:
        name = test["name"].split(" · ")[-1].split(":")[0]
        out[name] = test
    return out


@functools.lru_cache(maxsize=None)
def lab_points(lab: str, hidden: bool = False) -> int:
    """The points a lab's tests (or its hidden tests) declare, as this checkout collects them.

    Expectations in the grading tests use it instead of a number that every new test changes.
    """
    folder = (REPO_ROOT / "solutions" / lab / "hidden") if hidden else (REPO_ROOT / "labs" / lab)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pytest", str(folder), "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-p", "no:nbval", "--pagedlab-report",
                        str(report)], cwd=REPO_ROOT, capture_output=True, check=True)
        points = json.loads(report.read_text())["points"]
    return int(total_points(points.values()))
