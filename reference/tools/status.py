"""``pagedlab status``: my labs × points, and the next thing to do.

Runs every lab's tests (honouring ``LAB_IMPL``; a student release defaults to ``starter``)
and prints, per lab, tests passed, points and the first ``TODO`` a failing test reached, with
the file and line where that TODO sits. Writes no files.
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("labs", nargs="*", help="lab folders or numbers (default: all)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def next_step(lab: str, records: list[dict]) -> str:
    """Returns what to do next in a lab: its first open TODO, a failing test, or 'done'."""
    open_todos = todos(records)
    if open_todos:
        tag, text = open_todos[0]
        where = todo_location(lab, tag)
        return f"TODO({tag}) {text}" + (f"  ({where})" if where else "")
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
    try:
        run = run_lab_tests(labs, impl=impl, test_timeout_s=DEFAULT_TEST_TIMEOUT_S,
                            progress=None if args.quiet else Progress())
    except GradingRunError as exc:
        print(f"pagedlab status: could not run the tests: {exc}", file=sys.stderr)
        return 2
    rows = {row.lab: row for row in summarize(run.records)}
    print(f"implementation: {run.implementation}\n")
    print(f"{'lab':<28} {'needs':<9} {'tests':>7} {'points':>9}  next")
    first_open = None
    for lab in labs:
        row = rows.get(lab)
        records = [r for r in run.records if r.lab == lab]
        step = next_step(lab, records)
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
    for problem in run.problems:
        print(f"! {problem}")
    return 0
