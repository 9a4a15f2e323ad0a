"""``pagedlab grade``: run the lab tests, print the grade table, write results.json and Markdown.

Each lab runs in its own test process (:mod:`reference.grader.runner`); results come back through a
signed log and are checked for completeness. Where the tree has a release manifest
(``.pagedlab-manifest.json``), it is verified first and its test list is what must be
accounted for (:mod:`reference.grader.manifest`).

What is graded is said above the table. In the workbook repository (it has ``solutions/``)
``LAB_IMPL`` must be set; in a student release it defaults to ``starter``.

Exit codes (for CI):
  0  graded (whatever the score);
  1  graded, but the score is below ``--fail-under``;
  2  could not grade: bad or (in the workbook repository) missing ``LAB_IMPL``, unknown lab, a lab whose tests could not be collected,
     or grading refused because protected files changed (``--on-tamper refuse``);
  3  graded, but the grade is not trustworthy as it stands: protected files edited, deleted or
     added, tests missing from the run, test files that failed to import, forged log lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from reference.grader.classroom import classroom_result, write_step_output
from reference.grader import last_run
from reference.grader.diagnosis import diagnosis_lines
from reference.grader.gradebook import format_table, gradescope_results, markdown_summary, summarize, todos
from reference.grader.hidden import hidden_summary
from reference.loader import LabImplError, impl_name
from reference.grader.manifest import MANIFEST_NAME, Tamper, digest, load_manifest, verify_manifest
from reference.paths import LABS_DIR, REPO_ROOT, SOLUTIONS_DIR, lab_names, resolve_labs
from reference.grader.progress import Progress
from reference.grader.results import TestResult, points_float, total_points
from reference.grader.runner import DEFAULT_TEST_TIMEOUT_S, GradingRunError, run_lab_tests
from reference.grader.sandbox import IsolationError

EXIT_OK, EXIT_BELOW, EXIT_CANNOT_GRADE, EXIT_UNTRUSTED = 0, 1, 2, 3
#: The default per-test limit is this many times longer for kernel tests run emulated (a CPU
#: thread runs every CUDA thread of the grid; a 2-core runner takes up to a minute per test).
EMULATED_TIMEOUT_FACTOR = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("labs", nargs="*", help="lab folders or numbers (default: all), e.g. 1 lab02")
    parser.add_argument("--results", default="results.json", help="Gradescope results.json path")
    parser.add_argument("--summary", default="grade-summary.md", help="Markdown summary path")
    parser.add_argument("--fail-under", type=float, default=None,
                        help="exit 1 if the score (in %% of the maximum) is below this")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TEST_TIMEOUT_S,
                        help="per-test time limit in seconds (default %(default)g; 0 = none)")
    parser.add_argument("--no-hidden", action="store_true",
                        help="leave out the instructor-only hidden tests")
    parser.add_argument("--hidden-messages", action="store_true",
                        help="show a failed hidden test's message in results.json (after the "
                             "due date, never its code); by default it is withheld and only "
                             "the count of failed hidden tests is shown")
    parser.add_argument("--manifest", default=None,
                        help=f"release manifest to verify (default: ./{MANIFEST_NAME} if present)")
    parser.add_argument("--manifest-digest", default=None,
                        help="expected digest of the manifest (as printed by pagedlab release)")
    parser.add_argument("--on-tamper", choices=("flag", "zero", "refuse"), default="zero",
                        help="protected files changed: score the labs they affect 0 "
                             "(default), only flag them, or refuse to grade")
    parser.add_argument("--classroom", action="store_true",
                        help="also write the GitHub Classroom step result to $GITHUB_OUTPUT")
    parser.add_argument("--isolated", action="store_true",
                        help="run student code only in an unprivileged worker process (the "
                             "grading mode; default with --classroom and on Gradescope)")
    parser.add_argument("--speed", action="store_true",
                        help="also award the kernel stages' speed points (Labs 4-5), timed on "
                             "this GPU in a process that runs no student Python")
    parser.add_argument("--speed-only", action="store_true",
                        help="award only the speed points (no tests)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _manifest(args: argparse.Namespace) -> tuple[dict | None, list[str]]:
    """Returns (manifest or None, problems with the manifest itself)."""
    path = Path(args.manifest) if args.manifest else REPO_ROOT / MANIFEST_NAME
    try:
        manifest = load_manifest(path)
    except (ValueError, OSError) as exc:
        return None, [f"tampered: the release manifest is unreadable ({exc})"]
    if manifest is None:
        if args.manifest or args.manifest_digest:
            return None, [f"tampered: the release manifest {path.name} is missing"]
        return None, []
    if args.manifest_digest and digest(manifest) != args.manifest_digest:
        return manifest, [f"tampered: {path.name} was edited (digest {digest(manifest)}, "
                          f"expected {args.manifest_digest})"]
    return manifest, []


def _zero(records: list[TestResult], labs: list[str], files: list[str]) -> None:
    shown = ", ".join(files[:5]) + (" ..." if len(files) > 5 else "")
    for rec in records:
        if rec.lab in labs and rec.passed:
            rec.fail(f"scored 0: protected files changed ({shown})")


def _write_outputs(args, records, implementation, notes, labs, error=None, expected=None) -> dict:
    results = gradescope_results(records, implementation, notes,
                                 hidden_messages=getattr(args, "hidden_messages", False))
    if error:
        results["output"] += f"\n{error}"
        if expected and not records:  # nothing ran: the maximum still stands
            results["max_score"] = points_float(
                total_points(p for lab in labs for p in expected.get(lab, {}).values()))
    Path(args.results).write_text(json.dumps(results, indent=1))
    summary = markdown_summary(records, implementation, notes)
    Path(args.summary).write_text(summary)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as fh:
            fh.write(summary)
    if args.classroom:
        # The step's maximum comes from the manifest when there is one: a lab that could not
        # run still counts its full maximum (as 0 earned), never drops out of the total.
        max_score = None
        if expected:
            max_score = total_points(p for lab in labs for p in expected.get(lab, {}).values())
        write_step_output(classroom_result(records, max_score, error=error))
    return results


def _speed(labs: list[str], isolated: bool) -> tuple[list[TestResult], list[str], str | None]:
    """Speed records of ``labs`` (:mod:`reference.grader.speed`), notes, and the reason speed
    could not be graded (None when it was); prints the table."""
    from reference.grader.speed import format_speed_table, grade_speed, speed_records

    try:
        # NOTE: without isolation to be had, grade_speed raises IsolationError up front
        # (rather than every stage scoring 0).
        results = grade_speed(labs, isolated)
    except (RuntimeError, IsolationError) as exc:
        return [], [], f"speed not graded: {exc}"
    if results:
        print(format_speed_table(results), flush=True)
    notes = [] if isolated or not results else [
        "speed recorded without --isolated: the student's launcher ran as this user, where it "
        "could change what is timed; a preview, not a grade"]
    return speed_records(results), notes, None


def _grade_speed_only(args, impl: str, labs: list[str], notes: list[str], tamper: Tamper) -> int:
    print(f"pagedlab grade --speed-only: timing {_describe(impl)} ...", flush=True)
    records, more, error = _speed(labs, args.isolated or args.classroom)
    if tamper and args.on_tamper == "zero":
        _zero(records, tamper.labs_affected(labs), tamper.files())
    notes = [*notes, *more]
    for note in [*notes, *([error] if error else [])]:
        print(f"! {note}")
    results = _write_outputs(args, records, f"LAB_IMPL={impl}", notes, labs, error=error)
    print(f"\nspeed score {results['score']:g}/{results['max_score']:g} · wrote {args.results}")
    if error:
        return EXIT_CANNOT_GRADE
    return EXIT_UNTRUSTED if tamper else EXIT_OK


# --- which implementation is graded: said loudly, never guessed in the workbook repository ---

def _implementation_to_grade() -> str:
    """Returns the implementation to grade: ``LAB_IMPL``, or the starter in a student release.

    Returns:
        ``"starter"`` or ``"solution"``.

    Raises:
        LabImplError: ``LAB_IMPL`` is invalid, or unset in the workbook repository.
    """
    # NOTE: plain pytest defaults to the solutions where solutions/ exists (so the suite proves
    # them), but a grade of the solutions looks like full marks for the student: in the workbook
    # repository `grade` asks instead of guessing. A release has no solutions/: starter there.
    if not os.environ.get("LAB_IMPL", "").strip() and SOLUTIONS_DIR.is_dir():
        raise LabImplError(
            "this is the workbook repository (it has solutions/), so say what to grade: "
            "LAB_IMPL=starter pagedlab grade (your code in labs/) or "
            "LAB_IMPL=solution pagedlab grade (the reference solutions).")
    return impl_name()


def _emulate_kernel_labs_without_gpu(labs: list[str]) -> str | None:
    """Turns the emulated device on for a grade of kernel labs on a machine without a GPU.

    A lab with ``.cu`` files in ``labs/<lab>/`` is a kernel lab. ``PAGEDLAB_DEVICE`` set to
    anything (``emulate``, or e.g. ``gpu`` to keep the GPU-or-skip behaviour) is left alone.

    Args:
        labs: the lab folder names being graded.

    Returns:
        The one line announcing it (the test processes inherit ``PAGEDLAB_DEVICE=emulate``),
        or None when nothing changed.
    """
    from reference.gpu import gpu_skip_reason
    from reference.paths import LABS_DIR

    kernel_labs = [lab for lab in labs if any((LABS_DIR / lab).glob("*.cu"))]
    if not kernel_labs or os.environ.get("PAGEDLAB_DEVICE", "").strip():
        return None
    if gpu_skip_reason() is None:
        return None
    if _emulator_missing():
        return None  # no C++ compiler: the kernel tests skip with the GPU reason, as before
    os.environ["PAGEDLAB_DEVICE"] = "emulate"
    return (f"pagedlab grade: no usable GPU here, so the kernel tests of {', '.join(kernel_labs)} "
            f"run on the emulated device (PAGEDLAB_DEVICE=emulate; PAGEDLAB_DEVICE=gpu skips "
            f"them instead)")


def _emulator_missing() -> bool:
    """True when the emulated device cannot compile kernels here (no C++ compiler)."""
    import shutil

    from reference.emulate import CXX

    return shutil.which(CXX) is None


def _helper_uses(labs: list[str]) -> list[str]:
    """Notes for starters that import a shipped helper overlapping one of their TODOs."""
    from reference.grader.answers import helper_uses

    notes = []
    for lab in labs:
        path = LABS_DIR / lab / "starter.py"
        if path.is_file():
            notes += helper_uses(lab, path.read_text(errors="replace"))
    return notes


def _describe(impl: str) -> str:
    """Returns the header line naming the implementation graded, e.g. for the grade table."""
    where = ("your code: labs/*/starter.py and .cu files" if impl == "starter"
             else "the reference solutions in solutions/, not your code")
    source = "LAB_IMPL" if os.environ.get("LAB_IMPL", "").strip() else "the default in a release"
    return f"LAB_IMPL={impl} ({where}; set by {source})"


def main(args: argparse.Namespace, *, extra_notes: list[str] | tuple[str, ...] = (),
         extra_tamper: Tamper | None = None) -> int:
    """Grades; ``extra_notes``/``extra_tamper`` come from a caller that checked more (the
    Gradescope autograder checks the submission itself)."""
    try:
        impl = _implementation_to_grade()
    except LabImplError as exc:
        print(f"pagedlab: {exc}", file=sys.stderr)
        return EXIT_CANNOT_GRADE
    if args.classroom and not args.manifest_digest:
        # NOTE: without the pin, a student who edits a test and rewrites the manifest to
        # match is graded as untouched.
        print("pagedlab: --classroom needs --manifest-digest (the digest `pagedlab release` "
              "printed, pinned in the workflow)", file=sys.stderr)
        return EXIT_CANNOT_GRADE
    labs = resolve_labs(args.labs) if args.labs else lab_names()
    manifest, notes = _manifest(args)
    tamper = Tamper(edited=[MANIFEST_NAME]) if notes else Tamper()
    notes = [*extra_notes, *notes]
    if extra_tamper:
        tamper.edited += extra_tamper.edited
        tamper.deleted += extra_tamper.deleted
        tamper.added += extra_tamper.added
    expected = None
    if manifest is not None:
        found = verify_manifest(REPO_ROOT, manifest)
        tamper.edited += found.edited
        tamper.deleted += found.deleted
        tamper.added += found.added
        notes += found.notes()
        expected = manifest.get("tests") or None
        if not args.labs and expected:
            labs = sorted(set(labs) | set(expected))  # a deleted lab folder still counts
    if tamper and args.on_tamper == "refuse":
        for note in notes:
            print(f"pagedlab: {note}", file=sys.stderr)
        error = "grading refused: protected files changed (see above); restore them and re-run"
        print(f"pagedlab: {error}", file=sys.stderr)
        _write_outputs(args, [], f"LAB_IMPL={impl}", notes, labs, error=error,
                       expected=manifest and manifest.get("tests"))
        return EXIT_CANNOT_GRADE
    if impl == "starter":
        notes += _helper_uses(labs)
    if args.speed_only:
        return _grade_speed_only(args, impl, labs, notes, tamper)
    print(f"pagedlab grade: grading {_describe(impl)} ...", flush=True)
    test_timeout_s = args.timeout or None
    announce = _emulate_kernel_labs_without_gpu(labs)
    if announce:
        print(announce, flush=True)
        if test_timeout_s and args.timeout == DEFAULT_TEST_TIMEOUT_S:
            test_timeout_s *= EMULATED_TIMEOUT_FACTOR
    progress = None if args.quiet else Progress()
    try:
        run = run_lab_tests(labs, impl=impl, test_timeout_s=test_timeout_s,
                            include_hidden=not args.no_hidden, expected=expected,
                            progress=progress, isolated=args.isolated or args.classroom)
    except IsolationError as exc:
        error = f"cannot grade isolated: {exc}"
        print(f"pagedlab: {error}", file=sys.stderr)
        _write_outputs(args, [], f"LAB_IMPL={impl}", notes, labs, error=error, expected=expected)
        return EXIT_CANNOT_GRADE
    except GradingRunError as exc:
        print(f"pagedlab: grading failed: {exc}", file=sys.stderr)
        _write_outputs(args, [], f"LAB_IMPL={impl}", notes, labs, error=f"grading failed: {exc}",
                       expected=expected)
        return EXIT_CANNOT_GRADE
    records = run.records
    notes += run.problems + run.notes
    if args.speed:
        speed_records, speed_notes, speed_error = _speed(labs, args.isolated or args.classroom)
        records += speed_records
        notes += speed_notes + ([speed_error] if speed_error else [])
    if not run.problems and not tamper and not args.no_hidden:
        last_run.store(records, labs, impl)  # lets `pagedlab status` skip unchanged labs
    if tamper and args.on_tamper == "zero":
        _zero(records, tamper.labs_affected(labs), tamper.files())
    print()
    print(f"graded: {_describe(impl)}")
    print(format_table(summarize(records)))
    for line in hidden_summary(records):
        print(line)
    for note in notes:
        print(f"! {note}")
    for line in diagnosis_lines(records):
        print(line)
    left = todos(records)
    if left:
        print("\nStill to do (first failing TODOs):")
        for tag, text in left:
            print(f"  TODO({tag}) {text}")
    results = _write_outputs(args, records, run.implementation, notes, labs, expected=expected)
    print(f"\nscore {results['score']:g}/{results['max_score']:g} · wrote {args.results} and {args.summary}")
    if tamper or run.problems:
        return EXIT_UNTRUSTED
    if args.fail_under is not None and results["max_score"]:
        if 100 * results["score"] / results["max_score"] < args.fail_under:
            return EXIT_BELOW
    return EXIT_OK
