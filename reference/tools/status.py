"""``pagedlab status``: my labs × points, and the next thing to do.

Prints, per lab, tests passed, points and the first ``TODO`` a failing test reached, with the
file and line where that TODO sits and the hint command for it; then, where a lab's failures
clearly match a classic mistake (:mod:`reference.grader.diagnosis`), names it.

Fast: a lab whose files did not change since the last ``grade`` or ``status`` (same
``LAB_IMPL``) reuses those results (:mod:`reference.grader.last_run`); only changed labs run
(``--rerun`` runs them all). ``pagedlab status 3`` looks at Lab 3 only.
"""

from __future__ import annotations

import argparse
import sys

from reference.grader.gradebook import fmt_points, summarize, todos
from reference.tools.labinfo import lab_needs, todo_location
from reference.loader import LabImplError, impl_name
from reference.paths import lab_names
from reference.grader.progress import Progress
from reference.grader.runner import DEFAULT_TEST_TIMEOUT_S, GradingRunError, run_lab_tests
from reference.grader import last_run
from reference.grader.diagnosis import diagnosis_lines
from reference.tools.hint import load_hints


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("labs", nargs="*", help="lab folders or numbers (default: all)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--rerun", action="store_true",
                        help="run every lab's tests even where nothing changed since the last run")


def next_step(lab: str, records: list[dict]) -> str:
    """Returns what to do next in a lab: its first open TODO, a failing test, or 'done'."""
    open_todos = todos(records)
    if open_todos:
        tag, text = open_todos[0]
        where = todo_location(lab, tag)
        hint = f"  [pagedlab hint {tag}]" if tag in load_hints(lab) else ""
        return f"TODO({tag}) {text}" + (f"  ({where})" if where else "") + hint
    failing = [r for r in records if r.failed]
    if failing:
        first = failing[0]
        return f"fix {first.nodeid.split('::')[-1]}: {(first.message.splitlines() or [''])[0][:80]}"
    skipped = [r for r in records if r.skipped]
    if skipped:
        return f"done here; {len(skipped)} tests skipped ({skipped[0].message[:60]})"
    return "done ✓"


def main(args: argparse.Namespace) -> int:
    from reference.paths import resolve_labs

    try:
        impl = impl_name()
    except LabImplError as exc:
        print(f"pagedlab: {exc}", file=sys.stderr)
        return 2
    labs = resolve_labs(args.labs) if args.labs else lab_names()
    records, reused, to_run = [], [], []
    for lab in labs:
        stored = None if args.rerun else last_run.load(lab, impl)
        if stored is None:
            to_run.append(lab)
        else:
            records += stored
            reused.append(lab)
    problems: list[str] = []
    if to_run:
        try:
            run = run_lab_tests(to_run, impl=impl, test_timeout_s=DEFAULT_TEST_TIMEOUT_S,
                                progress=None if args.quiet else Progress())
        except GradingRunError as exc:
            print(f"pagedlab status: could not run the tests: {exc}", file=sys.stderr)
            return 2
        records += run.records
        problems = run.problems
        if not run.problems:
            last_run.store(run.records, to_run, impl)
    run_records = records
    rows = {row.lab: row for row in summarize(run_records)}
    print(f"implementation: LAB_IMPL={impl}")
    if reused:
        print(f"(unchanged since the last run, results reused: {', '.join(reused)}; --rerun to run them)")
    print()
    print(f"{'lab':<28} {'needs':<9} {'tests':>7} {'points':>9}  next")
    first_open = None
    for lab in labs:
        row = rows.get(lab)
        lab_records = [r for r in run_records if r.lab == lab]
        step = next_step(lab, lab_records)
        if row is None:
            print(f"{lab:<28} {lab_needs(lab):<9} {'-':>7} {'-':>9}  (no tests yet)")
            continue
        if first_open is None and not step.startswith("done"):
            first_open = (lab, step)
        points = f"{fmt_points(row.points)}/{fmt_points(row.max_points)}"
        print(f"{lab:<28} {lab_needs(lab):<9} {f'{row.passed}/{row.total}':>7} {points:>9}  {step}")
    total = sum(r.points for r in rows.values())
    maximum = sum(r.max_points for r in rows.values())
    print(f"\ntotal {fmt_points(total)}/{fmt_points(maximum)} points")
    if first_open:
        print(f"next: {first_open[0]}: {first_open[1]}")
    for line in diagnosis_lines(run_records):
        print(line)
    hinted = [lab for lab in labs if load_hints(lab)]
    if hinted:
        numbers = ", ".join(str(int(lab[3:5])) for lab in hinted)
        print(f"hints for every TODO of labs {numbers}: pagedlab hint <tag> --level 1|2|3")
    for problem in problems:
        print(f"! {problem}")
    return 0
