"""``pagedlab release OUTDIR``: write the student repository, then prove it works.

What a release holds: this workbook minus ``solutions/`` (and with it every hidden test and
mutant), the infrastructure ``tests/``, ``.ci/``, ``.git`` and build or cache
folders. Without ``solutions/`` the default is ``LAB_IMPL=starter``. Notebooks keep their
markdown and code but lose their outputs (they were executed with the solutions). It adds the
GitHub Classroom workflow (``.github/workflows/classroom.yml``, one step per lab) and the
manifest (``.pagedlab-manifest.json``: hashes of every protected file and the tests to expect).
Each lab with mutant signatures gets ``labs/<lab>/_diagnosis.json`` (mistakes in words and the
tests they fail, for ``grade``/``status`` feedback; protected like every ``_*`` helper).
Its ``README.md`` is the student README (``templates/student_README.md``), not the instructors'
one, and it holds no cache folders. Its ``reference/`` may resemble a TODO's solution only in the
overlaps :mod:`reference.grader.answers` decides; any other is reported as a problem.

Before writing it checks that every starter matches its solution's public API, signatures and
docstrings (:mod:`reference.grader.parity`). After writing it verifies the release: a copy is installed
into a fresh virtual environment (``--no-venv``: this interpreter), ``pagedlab grade`` runs
there, and every test must be collected, none may crash, and the score must be 0.

Exit codes: 0 written and verified; 1 written but a check failed; 2 nothing written.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from reference import colab
from reference.grader.answers import KNOWN_OVERLAPS, overlaps
from reference.grader.classroom import render_workflow
from reference.grader.diagnosis import DIAGNOSIS, student_diagnosis
from reference.grader.manifest import (MANIFEST_NAME, SKIP_DIRS, build_manifest, digest, sha256_file,
                                walk_files, write_manifest)
from reference.grader.notebook_strip import has_outputs, strip_outputs
from reference.grader.parity import check_lab
from reference.grader.results import points_float, total_points
from reference.grader.student_readme import render_student_readme
from reference.paths import LABS_DIR, REPO_ROOT, SOLUTIONS_DIR, lab_names

#: Top-level folders a student never gets.
INSTRUCTOR_ONLY = {"solutions", "tests", ".ci", ".github", "hidden", ".whl", "out"}
#: Files grading leaves at the root (never released).
GRADING_OUTPUTS = {"results.json", "grade-summary.md"}
WORKFLOW = ".github/workflows/classroom.yml"
_LAB_DIR = re.compile(r"lab\d\d_")
#: Problems listed per kind before "... and N more".
MAX_LISTED = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("outdir", help="folder to write the student repository into (new or empty)")
    parser.add_argument("labs", nargs="*", help="labs to release (default: all)")
    parser.add_argument("--force", action="store_true", help="replace OUTDIR if it is not empty")
    parser.add_argument("--no-verify", action="store_true", help="skip grading the release")
    parser.add_argument("--no-venv", action="store_true",
                        help="verify with this interpreter instead of a fresh virtual environment")


def torch_pin() -> str:
    """Returns the torch requirement to install (this environment's version, e.g. ``torch==2.13.0``)."""
    try:
        return "torch==" + importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "torch"


def source_files() -> list[str]:
    """Returns the workbook's files: tracked and untracked-but-not-ignored when this is a git
    checkout, otherwise every file outside caches and environments."""
    if (REPO_ROOT / ".git").exists() and shutil.which("git"):
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard",
                              "-z"], capture_output=True, check=True).stdout.decode()
        return sorted(f for f in set(out.split("\0")) if f and (REPO_ROOT / f).is_file())
    return walk_files(REPO_ROOT)


def is_released(rel: str, labs: list[str]) -> bool:
    """Returns True when a source file belongs in a release of ``labs``."""
    parts = rel.split("/")
    if parts[0] in INSTRUCTOR_ONLY or rel in GRADING_OUTPUTS or rel == MANIFEST_NAME:
        return False
    if rel.endswith((".pyc", ".pyo")):
        return False
    if any(p in SKIP_DIRS or p.endswith(".egg-info") or p == "bench_results" for p in parts):
        return False
    if parts[0] == "labs" and len(parts) > 2 and parts[1] not in labs:
        return False
    if parts[0] == "notebooks" and rel.endswith(".ipynb"):
        stem = Path(rel).stem
        return stem in labs or stem not in lab_names()
    return True


def collect_tests(root: Path, paths: list[str]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Collects (without running) the lab tests of a tree, with its own code.

    Args:
        root: a workbook tree (release or bundle).
        paths: folders to collect, relative to ``root``.

    Returns:
        (lab -> {node id: points}, problems such as collection errors).
    """
    with tempfile.TemporaryDirectory(prefix="pagedlab-collect-") as tmp:
        report = Path(tmp) / "report.json"
        env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "PYTEST_ADDOPTS")}
        env.update(LAB_IMPL="starter", PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "-p", "no:nbval", "--pagedlab-report", str(report), "--rootdir", str(root),
             "-c", str(root / "pyproject.toml"), *paths],
            cwd=root, env=env, capture_output=True, text=True)
        if not report.exists():
            return {}, [f"collecting the tests failed (exit {proc.returncode}):\n"
                        f"{(proc.stdout + proc.stderr)[-3000:]}"]
        data = json.loads(report.read_text())
    tests: dict[str, dict[str, float]] = {}
    for nodeid in data["collected"]:
        lab = next((p for p in nodeid.split("::")[0].split("/") if _LAB_DIR.match(p)), None)
        tests.setdefault(lab, {})[nodeid] = data["points"][nodeid]
    problems = [] if proc.returncode == 0 else [
        f"collecting the tests reported errors (exit {proc.returncode}):\n"
        f"{(proc.stdout + proc.stderr)[-3000:]}"]
    return tests, problems


def leaks(out: Path, allowed: set[str] = frozenset()) -> list[str]:
    """Returns problems: instructor material found in a release folder.

    Args:
        out: the release folder.
        allowed: relative paths put there on purpose (a grading bundle's hidden tests).
    """
    problems = []
    for bad in ("solutions", "hidden", "tests", ".ci"):
        if (out / bad).exists() and not any(a.startswith(bad + "/") for a in allowed):
            problems.append(f"release contains {bad}/")
    # A solution file's content anywhere in the release is a leak — except a file the lab hands
    # out under the same name (a shared header, a provided example kernel): that one is meant.
    solution_files: dict[str, list[str]] = {}
    if SOLUTIONS_DIR.is_dir():
        for path in SOLUTIONS_DIR.rglob("*"):
            if path.is_file() and path.stat().st_size > 0 and path.name != "__init__.py" \
                    and "__pycache__" not in path.parts:
                rel = path.relative_to(SOLUTIONS_DIR).as_posix()
                solution_files.setdefault(sha256_file(path), []).append(rel)
    caches = {".pytest_cache", "__pycache__", ".hypothesis", ".ipynb_checkpoints"}
    problems += [f"release contains a cache folder: {p.relative_to(out)}"
                 for p in out.rglob("*") if p.is_dir() and p.name in caches]
    for rel in walk_files(out):
        if rel in allowed:
            continue
        path = out / rel
        copies = solution_files.get(sha256_file(path), []) if path.stat().st_size else []
        meant = rel.startswith("labs/") and rel.removeprefix("labs/") in copies
        if copies and not meant:
            problems.append(f"release file {rel} is a copy of solutions/{copies[0]}")
        if rel.endswith(".ipynb") and has_outputs(path):
            problems.append(f"notebook {rel} still has outputs (solution outputs would leak)")
    return problems


def build_release(out: Path, labs: list[str], *, extra: dict[str, Path] | None = None,
                  log=print) -> tuple[dict, list[str]]:
    """Writes a release of ``labs`` into ``out`` (which must be empty or missing).

    Args:
        out: destination folder.
        labs: lab folder names to include.
        extra: more files to add, destination path (relative) -> source path (a bundle's
            hidden tests); they are collected and hashed like the rest.
        log: where progress lines go.

    Returns:
        (manifest, problems). Problems do not stop the build; the caller decides.
    """
    problems = []
    for lab in labs:
        problems += check_lab(LABS_DIR / lab, SOLUTIONS_DIR / lab)
    files = [f for f in source_files() if is_released(f, labs)]
    out.mkdir(parents=True, exist_ok=True)
    for rel in files:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / rel, out / rel)
    for rel, src in (extra or {}).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out / rel)
    for lab in labs:
        # Student-safe failure signatures (mistake in words + failing tests; no solution code).
        diagnosis = student_diagnosis(lab)
        if diagnosis is not None:
            (out / "labs" / lab / DIAGNOSIS).write_text(json.dumps(diagnosis, indent=1) + "\n")
    stripped = sum(strip_outputs(out / f) for f in files if f.endswith(".ipynb"))
    log(f"  copied {len(files) + len(extra or {})} files; cleared {stripped} notebook cell outputs")
    paths = [f"labs/{lab}" for lab in labs]
    paths += sorted({str(Path(rel).parent) for rel in extra or {} if rel.endswith(".py")})
    tests, collect_problems = collect_tests(out, paths)
    problems += collect_problems
    lab_max = {lab: points_float(total_points(tests.get(lab, {}).values())) for lab in labs}
    for lab in labs:
        if not tests.get(lab):
            problems.append(f"{lab}: no test collected")
    log(f"  collected {sum(len(t) for t in tests.values())} tests: "
        + ", ".join(f"{lab} {m:g} points" for lab, m in lab_max.items()))
    # The student reads this README first: it replaces the instructors' one.
    (out / "README.md").write_text(render_student_readme(labs, lab_max, torch_pin()))
    problems += remove_caches(out)
    info = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source_commit": _git_head(), "labs": labs, "torch": torch_pin()}
    # The workflow pins the manifest's digest (which leaves .github/ out), and the manifest
    # then hashes the final workflow like any protected file.
    pinned = digest(build_manifest(out, tests, **info))
    (out / WORKFLOW).parent.mkdir(parents=True, exist_ok=True)
    (out / WORKFLOW).write_text(render_workflow(
        lab_max, python=f"{sys.version_info.major}.{sys.version_info.minor}",
        torch_pin=torch_pin(), manifest_digest=pinned))
    manifest = build_manifest(out, tests, **info)
    assert digest(manifest) == pinned
    write_manifest(out, manifest)
    problems += leaks(out, set(extra or {}))
    # Trusted code close to a TODO's solution hands out the answer, unless decided (answers.py).
    problems += [f"release {ref} is close ({ratio:.2f}) to the solution of TODO function {todo} "
                 "(undecided overlap: see reference/grader/answers.py)"
                 for ratio, ref, todo in overlaps(out) if (ref, todo) not in KNOWN_OVERLAPS]
    return manifest, problems


def remove_caches(out: Path) -> list[str]:
    """Deletes cache folders that collecting the tests may leave in a release.

    Returns:
        Problems: caches that could not be removed.
    """
    problems = []
    for path in sorted(out.rglob("*"), reverse=True):
        if path.is_dir() and (path.name in SKIP_DIRS - {"build", "dist"}) and path.name != ".github":
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                problems.append(f"release holds a cache folder it could not remove: {path}")
    return problems


def _git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def verify_release(out: Path, manifest: dict, *, fresh_venv: bool = True, log=print) -> list[str]:
    """Grades a copy of a release as a student would and checks the result.

    Args:
        out: the release folder (left untouched: a copy is graded).
        manifest: its manifest (the tests that must all be graded).
        fresh_venv: install the copy into a new virtual environment (as the README says)
            instead of grading with this interpreter.
        log: where progress lines go.

    Returns:
        Problems (empty when every test was collected, nothing crashed and the score is 0).
    """
    with tempfile.TemporaryDirectory(prefix="pagedlab-verify-") as tmp:
        student = Path(tmp) / "student"
        shutil.copytree(out, student)
        env = {k: v for k, v in os.environ.items()
               if k not in ("LAB_IMPL", "PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT",
                            "VIRTUAL_ENV", "PYTHONPATH")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if fresh_venv:
            venv = Path(tmp) / "venv"
            log(f"  installing the release into a fresh virtual environment ({torch_pin()}) ...")
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True, env=env)
            pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", torch_pin(), "-e",
                                  f"{student}[dev]"], env=env, capture_output=True, text=True)
            if pip.returncode != 0:
                return [f"the release does not install:\n{pip.stderr[-3000:]}"]
            cmd = [str(venv / "bin" / "pagedlab")]
        else:
            cmd = [sys.executable, "-m", "reference.tools.cli"]
        results = Path(tmp) / "results.json"
        log("  grading the release as a student would (LAB_IMPL unset) ...")
        proc = subprocess.run([*cmd, "grade", "--quiet", "--results", str(results), "--summary",
                               str(Path(tmp) / "summary.md")], cwd=student, env=env,
                              capture_output=True, text=True)
        output = proc.stdout + proc.stderr
        if proc.returncode != 0 or not results.exists():
            return [f"pagedlab grade exited {proc.returncode} in the release:\n{output[-3000:]}"]
        data = json.loads(results.read_text())
    return check_release_grade(data, manifest, output)


def check_release_grade(results: dict, manifest: dict, output: str = "") -> list[str]:
    """Returns problems with a release's grade: missing tests, crashes, a non-zero score."""
    problems: list[str] = []
    if "LAB_IMPL=starter" not in results.get("output", ""):
        problems.append(f"the release did not grade the starters by default: {results.get('output')}")
    graded = {t["extra_data"]["nodeid"]: t for t in results["tests"]}
    want = {nid for tests in manifest["tests"].values() for nid in tests}
    missing = sorted(want - set(graded))
    problems += [f"test not graded in the release: {nid}" for nid in missing[:MAX_LISTED]]
    if results["score"] != 0:
        passed = [n for n, t in graded.items() if t["status"] == "passed"]
        problems.append(f"the untouched release scores {results['score']} (must be 0): {passed[:5]}")
    crashed = [f"{nid} fails without the starter's TODO (a crash?): "
               f"{test['output'].splitlines()[0] if test['output'] else ''}"
               for nid, test in graded.items() if test["status"] == "failed"
               and not test["output"].startswith("skipped:") and "TODO(" not in test["output"]]
    problems += crashed[:MAX_LISTED]
    more = max(0, len(missing) - MAX_LISTED) + max(0, len(crashed) - MAX_LISTED)
    if more:
        problems.append(f"... and {more} more like these")
    return problems


def main(args: argparse.Namespace) -> int:
    from reference.paths import resolve_labs

    if not SOLUTIONS_DIR.is_dir():
        print("pagedlab release: needs solutions/ (run it from the instructors' workbook)",
              file=sys.stderr)
        return 2
    out = Path(args.outdir).resolve()
    if out.exists() and any(out.iterdir()):
        if not args.force:
            print(f"pagedlab release: {out} is not empty (use --force to replace it)",
                  file=sys.stderr)
            return 2
        shutil.rmtree(out)
    if out == REPO_ROOT or REPO_ROOT in out.parents:
        print("pagedlab release: OUTDIR must lie outside the workbook", file=sys.stderr)
        return 2
    labs = resolve_labs(args.labs) if args.labs else lab_names()
    print(f"pagedlab release: writing {', '.join(labs)} to {out}")
    manifest, problems = build_release(out, labs)
    # The notebooks' setup cells and the badges carry the repository URL: they must agree with
    # pyproject.toml's [tool.pagedlab], where an instructor changes it.
    problems += colab.check()
    if colab.is_placeholder():
        print("  note: [tool.pagedlab] repository in pyproject.toml is still the placeholder: the "
              "Colab badges and the notebooks' clone work once it names the hosted repository")
    print(f"  manifest {MANIFEST_NAME}: {len(manifest['files'])} protected files, "
          f"digest {digest(manifest)}")
    if not args.no_verify:
        problems += verify_release(out, manifest, fresh_venv=not args.no_venv)
    if problems:
        print(f"\npagedlab release: {len(problems)} problem(s)")
        for p in problems:
            print(f"  - {p}")
        return 1
    checked = "" if args.no_verify else ", verified: every test collected, none crashed, score 0"
    print(f"\npagedlab release: {out} written{checked}")
    return 0
