"""``pagedlab grade``: run the lab tests, print the grade table, write results.json and Markdown."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from reference.gradebook import format_table, gradescope_results, markdown_summary, summarize, todos
from reference.loader import LabImplError, impl_name
from reference.paths import lab_names
from reference.runner import GradingRunError, run_lab_tests


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("labs", nargs="*", help="lab folders or numbers (default: all), e.g. 1 lab02")
    parser.add_argument("--results", default="results.json", help="Gradescope results.json path")
    parser.add_argument("--summary", default="grade-summary.md", help="Markdown summary path")
    parser.add_argument("--fail-under", type=float, default=None,
                        help="exit 1 if the score (in %% of the maximum) is below this")


def resolve_labs(names: list[str]) -> list[str]:
    """Maps ``1``, ``lab01`` or ``lab01_block_manager`` to lab folder names."""
    known = lab_names()
    out = []
    for name in names:
        key = name if name.startswith("lab") else f"lab{int(name):02d}"
        match = [lab for lab in known if lab == key or lab.startswith(key + "_")]
        if len(match) != 1:
            raise SystemExit(f"pagedlab: no lab matches {name!r}; labs are: {', '.join(known)}")
        out.append(match[0])
    return out


def main(args: argparse.Namespace) -> int:
    try:
        impl = impl_name()
    except LabImplError as exc:
        print(f"pagedlab: {exc}", file=sys.stderr)
        return 2
    labs = resolve_labs(args.labs) if args.labs else None
    print(f"pagedlab grade: running the lab tests with LAB_IMPL={impl} ...", flush=True)
    try:
        run = run_lab_tests(labs, impl=impl)
    except GradingRunError as exc:
        print(f"pagedlab: grading failed: {exc}", file=sys.stderr)
        return 2
    records = run.records
    print()
    print(format_table(summarize(records)))
    left = todos(records)
    if left:
        print("\nStill to do (first failing TODOs):")
        for tag, text in left:
            print(f"  TODO({tag}) {text}")
    results = gradescope_results(records, run.implementation)
    Path(args.results).write_text(json.dumps(results, indent=1))
    summary = markdown_summary(records, run.implementation)
    Path(args.summary).write_text(summary)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as fh:
            fh.write(summary)
    print(f"\nscore {results['score']:g}/{results['max_score']:g} · wrote {args.results} and {args.summary}")
    if args.fail_under is not None and results["max_score"]:
        if 100 * results["score"] / results["max_score"] < args.fail_under:
            return 1
    return 0
