"""Infrastructure (no points): the CI templates grade a release to its known score when their
commands are run locally — the GitHub Classroom workflow step by step, and the Gradescope
bundle's run_autograder (and, once, its setup.sh) in a fake /autograder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from grading_helpers import pagedlab, lab_points
from reference.grader.classroom import reporter_total
from reference.grader.mutants import build_mutant, load_mutants
from reference.grader.results import total_points
from reference.paths import REPO_ROOT

# Minutes on 2 cores (builds, subprocess grading runs): CI runs them with `pytest -m slow`.
pytestmark = pytest.mark.slow

# NOTE: building a second fresh environment costs another minute; CI runs this one on purpose
# (PAGEDLAB_SLOW_TESTS=1, see the lead's .ci/run), a plain `pytest` skips it.
SLOW = pytest.mark.skipif(os.environ.get("PAGEDLAB_SLOW_TESTS") != "1",
                          reason="slow end-to-end test: PAGEDLAB_SLOW_TESTS=1 runs it")
LAB1 = "lab01_block_manager"
#: Lab 1's public points, and with its hidden tests (as this checkout declares them).
LAB1_PUBLIC_POINTS = lab_points(LAB1)
LAB1_ALL_POINTS = LAB1_PUBLIC_POINTS + lab_points(LAB1, hidden=True)
SOLUTION = REPO_ROOT / "solutions" / LAB1 / "solution.py"


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("classroom") / "student"
    proc = pagedlab(REPO_ROOT, "release", str(out), "1", "--no-verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """Lab 1's autograder zip."""
    path = tmp_path_factory.mktemp("gradescope") / "lab1-autograder.zip"
    proc = pagedlab(REPO_ROOT, "gradescope-bundle", str(path), "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return path


def _student(release: Path, dest: Path, starter: str | None = None) -> Path:
    shutil.copytree(release, dest)
    if starter is not None:
        (dest / "labs" / LAB1 / "starter.py").write_text(starter)
    # NOTE: the Classroom step grades isolated: the worker's user must reach and read the tree
    # (pytest's own temporary folders are private to root).
    for parent in dest.parents:
        if str(parent).startswith(tempfile.gettempdir() + "/"):
            parent.chmod(parent.stat().st_mode | 0o005)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o005 if path.is_dir() else 0o004))
    return dest


def _half_solution() -> str:
    """The solution with hashing left undone: earns partial credit."""
    text = SOLUTION.read_text()
    return text.replace('    payload = f"{parent}',
                        '    raise NotImplementedError("TODO(lab1.5): not done")\n'
                        '    payload = f"{parent}', 1)


def _run_classroom_workflow(root: Path, tmp: Path) -> tuple[float, float]:
    """Runs every lab step of the release's workflow like Actions would, then totals the
    step results the way Classroom's reporter does."""
    import yaml  # the dev extra installs PyYAML: this test never skips for want of it
    workflow = yaml.safe_load((root / ".github/workflows/classroom.yml").read_text())
    steps = workflow["jobs"]["run-autograding-tests"]["steps"]
    outputs: dict[str, str] = {}
    for step in steps:
        if not str(step.get("run", "")).startswith("python -m reference.tools.cli grade"):
            continue
        out_file = tmp / f"github_output_{step['id']}"
        # `python` here is this interpreter, on the release's own code (from its root).
        cmd = step["run"].replace("python", sys.executable, 1)
        env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "GITHUB_STEP_SUMMARY")}
        env["GITHUB_OUTPUT"] = str(out_file)
        subprocess.run(cmd, shell=True, cwd=root, env=env, capture_output=True, text=True)
        line = [ln for ln in out_file.read_text().splitlines() if ln.startswith("result=")][-1]
        outputs[step["id"]] = line.removeprefix("result=")
    reporter = next(s for s in steps if "autograding-grading-reporter" in str(s.get("uses")))
    runners = reporter["with"]["runners"].split(",")
    encoded = {}
    for rid in runners:
        expr = reporter["env"][f"{rid.upper()}_RESULTS"]
        step_id = re.search(r"steps\.([\w-]+)\.outputs\.result", expr).group(1)
        encoded[rid] = outputs[step_id]
    return reporter_total(encoded)


# NOTE: the Classroom step grades isolated; graded code that passes makes thousands of calls
# into the worker (minutes on 2 cores), so those cases are slow (CI: pytest -m slow).
@pytest.mark.parametrize("starter, expect", [
    (None, 0),
    pytest.param("solution", LAB1_PUBLIC_POINTS, marks=pytest.mark.slow),
    pytest.param("half", "partial", marks=pytest.mark.slow),
])
def test_classroom_workflow_steps_grade_the_release(release, tmp_path, starter, expect):
    """The workflow's per-lab step gives Classroom 0/N for the untouched release, N/N with
    the solution, and partial credit (exactly what `pagedlab grade` scores) in between."""
    text = {"solution": SOLUTION.read_text(), "half": _half_solution(), None: None}[starter]
    root = _student(release, tmp_path / "s", text)
    total, maximum = _run_classroom_workflow(root, tmp_path)
    assert maximum == LAB1_PUBLIC_POINTS
    if expect == "partial":
        assert 0 < total < LAB1_PUBLIC_POINTS
        res = json.loads((root / "results-lab01.json").read_text())
        assert total == pytest.approx(res["score"], abs=0.05)
    else:
        assert total == pytest.approx(expect)


def _autograder(bundle: Path, tmp: Path, submission: Path | None) -> Path:
    """Lays out a fake /autograder (source = the unpacked zip, submission) and returns it."""
    root = tmp / "autograder"
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    for script in ("run_autograder", "setup.sh"):
        os.chmod(root / "source" / script, 0o755)
    if submission is not None:
        shutil.copytree(submission, root / "submission")
    else:
        (root / "submission").mkdir()
    return root


def _run_autograder(root: Path, python: str | None = sys.executable) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "PYTEST_ADDOPTS")}
    env["PAGEDLAB_AUTOGRADER_ROOT"] = str(root)
    if python:
        env["PAGEDLAB_PYTHON"] = python
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_bundle_holds_the_scripts_hidden_tests_and_no_solutions(bundle):
    """setup.sh and run_autograder sit at the zip's root (executable); hidden tests ride in
    hidden/<lab>/; no solution file is in the zip; the manifest expects the hidden tests."""
    with zipfile.ZipFile(bundle) as zf:
        names = zf.namelist()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        manifest = json.loads(zf.read(".pagedlab-manifest.json"))
    assert modes["setup.sh"] & 0o100 and modes["run_autograder"] & 0o100
    assert any(n.startswith(f"hidden/{LAB1}/test_lab01_hidden") for n in names)
    assert not any(n.startswith("solutions/") or n.endswith("solution.py") for n in names)
    assert total_points(manifest["tests"][LAB1].values()) == LAB1_PUBLIC_POINTS + 4  # + hidden
    assert subprocess.run(["bash", "-n", "-c", zipfile.ZipFile(bundle).read("setup.sh").decode()]).returncode == 0


@pytest.mark.parametrize("case, score", [("untouched", 0), ("solution", LAB1_ALL_POINTS), ("bare_file", LAB1_ALL_POINTS)])
def test_run_autograder_scores_a_submission(bundle, release, tmp_path, case, score):
    """run_autograder writes results.json with the known score: 0 for the untouched release,
    full points (hidden tests included) with the solution — as a repository or as a bare starter.py."""
    if case == "bare_file":
        sub = tmp_path / "upload"
        sub.mkdir()
        shutil.copy2(SOLUTION, sub / "starter.py")
    else:
        sub = _student(release, tmp_path / "repo", SOLUTION.read_text() if case == "solution" else None)
    res = _run_autograder(_autograder(bundle, tmp_path, sub))
    assert (res["score"], res["max_score"]) == (score, LAB1_ALL_POINTS)
    assert "hidden tests failed in lab01_block_manager" in res["output"] or \
        "hidden test failed in lab01_block_manager" in res["output"]
    assert f"labs/{LAB1}/starter.py" in res["output"]


def test_submitted_test_edits_are_ignored_and_reported(bundle, release, tmp_path):
    """A submission whose test file was gutted and which adds a conftest.py is graded with the
    bundle's originals (the untouched starter still scores 0) and both files are named."""
    sub = _student(release, tmp_path / "repo")
    test = sub / "labs" / LAB1 / "test_lab01_free_queue.py"
    test.write_text("import pytest\n\n@pytest.mark.points(100)\ndef test_free():\n    pass\n")
    (sub / "labs" / LAB1 / "conftest.py").write_text("def pytest_runtest_makereport(): pass\n")
    res = _run_autograder(_autograder(bundle, tmp_path, sub))
    assert (res["score"], res["max_score"]) == (0, LAB1_ALL_POINTS)
    assert f"labs/{LAB1}/test_lab01_free_queue.py was edited" in res["output"]
    assert f"labs/{LAB1}/conftest.py was added" in res["output"]


def test_hidden_failures_are_withheld_and_counted(bundle, release, tmp_path):
    """A solution with a stale-hash bug fails a hidden test: Gradescope gets it with
    visibility after_due_date and, by default, a fixed "withheld" text in place of its message
    (no traceback, no test code, nothing it probed); the summary counts it."""
    mutant = next(m for m in load_mutants(LAB1) if m.name == "stale_hash_after_reuse")
    broken = (build_mutant(mutant, tmp_path / "mutant") / "solution.py").read_text()
    sub = _student(release, tmp_path / "repo", broken)
    res = _run_autograder(_autograder(bundle, tmp_path, sub))
    hidden = [t for t in res["tests"] if "hidden" in t["tags"]]
    assert hidden and all(t["visibility"] == "after_due_date" for t in hidden)
    failed = [t for t in hidden if t["status"] == "failed"]
    assert failed, "the stale-hash bug should fail a hidden test"
    from reference.grader.gradebook import HIDDEN_WITHHELD

    for t in failed:
        assert t["output"] == HIDDEN_WITHHELD, t["output"]
    assert re.search(rf"{len(failed)} hidden tests? failed in {LAB1}", res["output"])
    public = [t for t in res["tests"] if "hidden" not in t["tags"]]
    assert all("visibility" not in t for t in public)


def test_an_empty_submission_scores_zero_with_a_reason(bundle, tmp_path):
    """Nothing recognisable in the submission: score 0 and a message saying what to upload."""
    res = _run_autograder(_autograder(bundle, tmp_path, None))
    assert res["score"] == 0 and "No lab files found" in res["output"]


@SLOW
def test_setup_sh_builds_the_environment_run_autograder_uses(bundle, release, tmp_path):
    """End to end, like Gradescope: setup.sh makes the virtual environment (torch + the
    workbook's test dependencies, here from pip's configured index), then run_autograder,
    with that environment, grades the solution with full points. (~1 minute.)"""
    if shutil.which("python3") is None:
        pytest.skip("python3 is not on PATH")
    root = _autograder(bundle, tmp_path, _student(release, tmp_path / "repo", SOLUTION.read_text()))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PAGEDLAB_AUTOGRADER_ROOT=str(root), PAGEDLAB_TORCH_INDEX="")
    proc = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source",
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "setup ok" in proc.stdout
    res = _run_autograder(root, python=None)  # the venv setup.sh made
    assert (res["score"], res["max_score"]) == (LAB1_PUBLIC_POINTS,) * 2


def test_the_classroom_workflow_never_builds_the_checkout():
    """The workflow installs the dependencies, never the student's checkout (`pip install .`
    runs a setup.py there before any check: a red team's installed a pytest plugin into
    site-packages and deleted itself), and every grading step runs the checkout's code with
    `python -m` from its root. Every dependency of the project and its dev extra is installed."""
    import yaml

    from reference.grader.classroom import grading_dependencies, render_workflow

    text = render_workflow({"lab01_block_manager": 63, "lab03_paged_attention_oracle": 75},
                           python="3.11", torch_pin="torch==2.13.0", manifest_digest="0" * 16)
    steps = yaml.safe_load(text)["jobs"]["run-autograding-tests"]["steps"]
    runs = [str(s.get("run", "")) for s in steps]
    install = "\n".join(r for r in runs if "pip install" in r)
    assert not re.search(r"pip install[^\n]*(-e\b|\s\.(\s|$|\[)|\s\"\.)", install), install
    for dep in grading_dependencies():
        assert dep in install, f"{dep} is not installed by the workflow"
    grading = [r for r in runs if " grade " in r]
    assert len(grading) == 2 and all(r.startswith("python -m reference.tools.cli grade ")
                                     for r in grading), grading
