"""Grades one submission inside a grading bundle (Gradescope's ``run_autograder`` calls it).

It runs in a scratch copy of the bundle, whose tests, ``conftest.py`` and ``reference/`` are the
trusted ones, and:

1. finds the student's repository in the submission (a ``labs/`` folder, at most 3 levels down;
   or, for a one-lab bundle, a folder holding ``starter.py``);
2. copies in only the student's own files (:func:`reference.grader.manifest.is_student_file`:
   ``starter.py``, ``.cu`` files, helper modules — never tests, ``_*`` helpers, ``conftest.py``
   or ``.pth`` files), skipping symbolic links;
3. compares the submission's protected files with the manifest and reports each edited or added
   one (graded with the originals anyway; ``on_tamper`` can also zero or refuse);
4. runs ``pagedlab grade`` with ``LAB_IMPL=starter``, hidden tests included, and writes
   ``results.json`` — with score 0 and the reason when anything above fails.

Usage: ``python -m reference.grader.autograder --submission DIR --results PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from reference.grader.manifest import MANIFEST_NAME, Tamper, is_student_file, load_manifest, verify_manifest
from reference.paths import REPO_ROOT

#: The bundle's settings, written by ``pagedlab gradescope-bundle`` and read here.
CONFIG_NAME = "pagedlab-autograder.json"
MAX_DEPTH = 3
#: Student files that never affect a grade (handout copies, notebooks): not copied.
NOT_GRADED = {".md", ".ipynb"}


def find_submission_root(submission: Path, labs: list[str]) -> tuple[Path | None, str | None]:
    """Locates the student's files.

    Args:
        submission: what the student handed in.
        labs: the labs this bundle grades.

    Returns:
        (folder holding ``labs/``, None) for a repository; (folder holding ``starter.py``, lab)
        for a one-lab upload of bare files; (None, None) when nothing fits.
    """
    candidates = [submission]
    for depth in range(MAX_DEPTH + 1):
        for folder in candidates:
            if (folder / "labs").is_dir() and not (folder / "labs").is_symlink():
                return folder, None
        candidates = [c for f in candidates for c in sorted(f.iterdir())
                      if c.is_dir() and not c.is_symlink() and not c.name.startswith(".")]
    if len(labs) == 1:
        for folder in [submission, *sorted(p.parent for p in submission.rglob("starter.py"))]:
            if (folder / "starter.py").is_file():
                return folder, labs[0]
    return None, None


def import_student_files(root: Path, labs: list[str], single_lab: str | None = None) -> list[str]:
    """Copies a submission's student files into this (scratch) workbook.

    Args:
        root: from :func:`find_submission_root`.
        labs: the labs graded.
        single_lab: set when ``root`` is one lab's folder of bare files.

    Returns:
        The workbook-relative paths copied.
    """
    copied = []
    sources = {single_lab: root} if single_lab else {lab: root / "labs" / lab for lab in labs}
    for lab, folder in sources.items():
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            rel = f"labs/{lab}/{path.relative_to(folder).as_posix()}"
            if path.is_symlink() or not path.is_file() or not is_student_file(rel):
                continue
            if any(part.startswith(".") for part in Path(rel).parts) or path.suffix in NOT_GRADED:
                continue
            dest = REPO_ROOT / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            copied.append(rel)
    return copied


def submission_tamper(root: Path, manifest: dict, labs: list[str]) -> Tamper:
    """Returns the protected files a repository-style submission edited or added.

    Deleted files are not reported: a submission may hold only part of the repository. The
    Classroom workflow (``.github/``) and the bundle's hidden tests are not compared: grading
    here uses neither the submission's workflow nor any hidden test it could hold.
    """
    scoped = {rel: h for rel, h in manifest["files"].items()
              if not rel.startswith((".github/", "hidden/"))
              and (not rel.startswith("labs/") or rel.split("/")[1] in labs
                   or rel == "labs/__init__.py")}
    found = verify_manifest(root, {"files": scoped})
    added = [rel for rel in found.added if not rel.startswith((".github/", "hidden/"))
             and (not rel.startswith("labs/") or (len(rel.split("/")) > 2
                                                  and rel.split("/")[1] in labs))]
    return Tamper(edited=found.edited, added=added)


def _fail(results: Path, message: str) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"score": 0, "output": message, "tests": [],
                                   "stdout_visibility": "hidden"}, indent=1))


def grade_submission(submission: Path, results: Path) -> int:
    """Grades ``submission`` into ``results``; returns ``pagedlab grade``'s exit code."""
    from reference.grader import grade

    config = json.loads((REPO_ROOT / CONFIG_NAME).read_text())
    labs = config["labs"]
    manifest = load_manifest(REPO_ROOT / MANIFEST_NAME)
    root, single_lab = find_submission_root(submission, labs)
    if root is None:
        _fail(results, "No lab files found in the submission: upload your repository (with its "
                       "labs/ folder)" + (", or the lab's starter.py" if len(labs) == 1 else "") + ".")
        return 0
    copied = import_student_files(root, labs, single_lab)
    notes = [f"graded your files: {', '.join(copied) or 'none (untouched starters)'}"]
    tamper = Tamper()
    if single_lab is None and manifest is not None:
        tamper = submission_tamper(root, manifest, labs)
        notes += [f"submission: {note} — ignored, graded with the original"
                  for note in tamper.notes()]
    os.environ["LAB_IMPL"] = "starter"
    hidden = REPO_ROOT / "hidden"
    if hidden.is_dir():
        hidden.chmod(0o700)  # NOTE: the worker's user may not read the hidden tests' source
    parser = argparse.ArgumentParser()
    grade.add_arguments(parser)
    with tempfile.TemporaryDirectory(prefix="pagedlab-autograder-") as tmp:
        args = parser.parse_args([*labs, "--results", str(results), "--summary",
                                  str(Path(tmp) / "summary.md"), "--timeout",
                                  str(config.get("timeout_s", 60)), "--on-tamper",
                                  config.get("on_tamper", "zero"), "--manifest-digest",
                                  config["manifest_digest"], "--isolated", "--quiet",
                                  *(["--hidden-messages"] if config.get("hidden_messages")
                                    else [])])
        return grade.main(args, extra_notes=notes, extra_tamper=tamper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submission", required=True, type=Path)
    parser.add_argument("--results", required=True, type=Path)
    args = parser.parse_args(argv)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    try:
        code = grade_submission(args.submission, args.results)
    except Exception:  # noqa: BLE001 — whatever happens, Gradescope must get a results.json
        traceback.print_exc()
        _fail(args.results, "The autograder failed; please tell your instructor (the "
                            "traceback is in the autograder's log).")
        return 2
    if not args.results.exists():
        _fail(args.results, f"The autograder could not grade this submission (exit {code}).")
    return code


if __name__ == "__main__":
    sys.exit(main())
