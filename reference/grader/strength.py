"""``pagedlab check``: proves the tests are strong.

(a) every lab test passes with the solutions (GPU tests may skip where there is no GPU);
(b) untouched starters score 0, each failure being the starter's ``NotImplementedError("TODO…")``;
(c) every mutant is caught by the tests it declares (``caught_by``), and each lab handout names
    each of its mutants and the test that catches it;
(d) the contract check (:mod:`reference.grader.contracts`): every ``match=`` word and every
    attribute a lab's tests or helpers read from the implementation is stated in its handout or
    starter docstrings. ``--contracts`` runs only this (cheap: no test runs).

``--signatures`` (instead of (a)-(d)) runs ALL of a lab's public tests against each mutant this
machine can run and stores the set of tests it fails in ``solutions/<lab>/mutants/signatures.json``
(:mod:`reference.grader.diagnosis`): what ``grade`` and ``status`` match a student's failures against.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import json

from reference.grader.contracts import check_lab_contract
from reference.context_lost import is_own_failure
from reference.grader.diagnosis import handout_section, signatures_path
from reference.gpu import emulation_requested, gpu_available
from reference.loader import MUTANT_DIR_ENV
from reference.grader.mutants import Mutant, MutantSpecError, build_mutant, load_mutants
from reference.paths import LABS_DIR, SOLUTIONS_DIR
from reference.grader.results import TestResult
from reference.grader.runner import GradingRunError, run_lab_tests

#: The skip reason of a test that proves something only a GPU has (reference.gpu.gpu_only).
GPU_ONLY_PREFIX = "GPU-only under emulation: "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("labs", nargs="*", help="lab folders or numbers (default: all)")
    parser.add_argument("--skip-solution", action="store_true", help="skip (a)")
    parser.add_argument("--skip-starter", action="store_true", help="skip (b)")
    parser.add_argument("--skip-mutants", action="store_true", help="skip (c)")
    parser.add_argument("--skip-contracts", action="store_true", help="skip (d)")
    parser.add_argument("--contracts", action="store_true", help="run only (d), the contract check")
    parser.add_argument("--signatures", action="store_true",
                        help="compute and store each mutant's failure signature (all its lab's tests)")
    parser.add_argument("--missing", action="store_true",
                        help="with --signatures: only mutants that have no stored signature yet "
                             "(resume a run cut short: each signature is stored as it comes)")
    parser.add_argument("-j", "--jobs", type=int, default=2,
                        help="mutants (and the labs of the solution and starter runs) checked "
                             "in parallel")
    parser.add_argument("--only", nargs="+", metavar="MUTANT", default=None,
                        help="with (c) or --signatures: only these mutants (names), e.g. those "
                             "a run cut short did not reach")
    parser.add_argument("--isolated", action="store_true",
                        help="run the implementations in the unprivileged worker, as grading does "
                             "(also with --signatures)")


def check_solution(labs: list[str] | None, isolated: bool = False, jobs: int = 1) -> list[str]:
    """(a) Returns problems: solution tests that did not pass (``jobs`` labs at once)."""
    run = run_lab_tests(labs, impl="solution", isolated=isolated, jobs=jobs)
    bad = [r for r in run.records if r.failed]
    skipped = [r for r in run.records if r.skipped]
    print(f"(a) solutions: {len(run.records) - len(bad) - len(skipped)} passed, "
          f"{len(bad)} failed, {len(skipped)} skipped")
    reasons = sorted({r.message for r in skipped})
    for reason in reasons[:5]:
        print(f"      skipped: {reason}")
    return [f"solution fails {r.nodeid}: {r.message}" for r in bad] + run.problems


def check_starter(labs: list[str] | None, isolated: bool = False, jobs: int = 1) -> list[str]:
    """(b) Returns problems: starter tests that passed or failed without a TODO (``jobs`` labs
    at once)."""
    run = run_lab_tests(labs, impl="starter", isolated=isolated, jobs=jobs)
    problems = []
    for r in run.records:
        if r.passed:
            problems.append(f"untouched starter passes {r.nodeid} (a test that cannot fail?)")
        elif r.failed and "TODO(lab" not in r.message + r.details:
            problems.append(f"starter fails {r.nodeid} without a TODO message: {r.message}")
    passed = sum(r.passed for r in run.records)
    skipped = sum(r.skipped for r in run.records)
    print(f"(b) starters: {passed} passed (must be 0), "
          f"{len(run.records) - passed - skipped} failed, {skipped} skipped")
    return problems + run.problems


def _catching_tests(mutant: Mutant) -> list[str]:
    """The tests that must catch a mutant here: ``caught_emulated_by`` under the emulated device
    when it has any (``caught_by`` there is GPU-only, e.g. racecheck), else ``caught_by``."""
    if emulation_requested() and not gpu_available() and mutant.caught_emulated_by:
        return mutant.caught_emulated_by
    return mutant.caught_by


def _check_one(mutant: Mutant, isolated: bool = False) -> tuple[Mutant, str | None]:
    """Returns (mutant, problem or None)."""
    tests = _catching_tests(mutant)
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        if isolated:
            os.chmod(tmp, 0o755)  # NOTE: the worker's user reads the mutant copy (no secret)
        try:
            folder = build_mutant(mutant, Path(tmp))
        except MutantSpecError as exc:
            return mutant, str(exc)
        try:
            # NOTE: one failing case per test is enough here (not for signatures, which list
            # every failing test): later cases of a test that already failed are skipped.
            run = run_lab_tests([mutant.lab], env={MUTANT_DIR_ENV: str(folder)},
                                only=tests, timeout_s=900, isolated=isolated,
                                extra_args=["--pagedlab-first-failure"])
        except GradingRunError as exc:
            return mutant, f"test run broke: {exc}"
    by_name: dict[str, list[TestResult]] = {}
    for r in run.records:
        by_name.setdefault(r.func_name, []).append(r)
    missing = [n for n in tests if n not in by_name]
    if missing:
        return mutant, f"caught_by names unknown tests: {missing}"
    escaped = []
    for name in tests:
        results = by_name[name]
        if all(r.skipped for r in results):
            if results[0].message.startswith(GPU_ONLY_PREFIX):
                return mutant, f"{GPU_ONLY_PREFIX}{name}"  # checked on a GPU, not here
            return mutant, f"{name} skipped: {results[0].message}"
        # Caught means a real assertion failed in the test body, not a broken import.
        if not any(r.outcome == "failed" and r.when == "call" for r in results):
            escaped.append(name)
    if escaped:
        return mutant, f"NOT caught by {escaped}"
    return mutant, None


def _expected_cost(mutant: Mutant) -> tuple[bool, int, str]:
    """Sort key, larger first: mutants whose tests run kernels, then by how many tests catch
    them, then by lab (Lab 5's kernels compile slowest)."""
    return (mutant.requires_gpu, len(_catching_tests(mutant)), mutant.lab)


def check_mutants(labs: list[str] | None, jobs: int, isolated: bool = False,
                  only: list[str] | None = None) -> list[str]:
    """(c) Returns problems: mutants that escaped, are stale, or are missing from handouts
    (``only``: just the mutants of these names)."""
    mutants = [m for lab in (labs or [None]) for m in load_mutants(lab)
               if only is None or m.name in only]
    if only is not None and len(mutants) != len(set(only)):
        missing = sorted(set(only) - {m.name for m in mutants})
        return [f"--only names no mutant of these labs: {missing}"]
    # Under PAGEDLAB_DEVICE=emulate the GPU mutants run on the emulated device too; those whose
    # tests are GPU-only there (a real race that only racecheck sees) stay for a GPU machine.
    have_gpu = gpu_available() or emulation_requested()
    on_real_gpu = gpu_available() and not emulation_requested()
    runnable = [m for m in mutants if (have_gpu or not m.requires_gpu)
                and not (on_real_gpu and m.gpu_escape)]
    waiting = [m for m in mutants if not (have_gpu or not m.requires_gpu)]
    problems = []
    for m in mutants:
        handout = (LABS_DIR / m.lab / "README.md")
        text = handout.read_text() if handout.exists() else ""
        for needle in [m.name, *m.caught_by]:
            if needle not in text:
                problems.append(f"handout {m.lab}/README.md does not mention `{needle}` "
                                f"(mutant {m.name})")
    print(f"(c) mutants: checking {len(runnable)} ({len(waiting)} need a GPU, not checked here)")
    for m in mutants:
        if on_real_gpu and m.gpu_escape:
            print(f"      {m.lab}/{m.name}: caught only emulated (on a GPU: {m.gpu_escape})")
    # NOTE: heaviest first, reported as each finishes. The GPU mutants compile their kernels
    # from scratch in each run (an isolated worker has a fresh HOME, so no CuPy cache): started
    # last, in order, they were the ones a time limit cut off, and printing in order hid which
    # of the rest had finished.
    runnable.sort(key=_expected_cost, reverse=True)
    t0 = time.monotonic()

    def timed(m: Mutant) -> tuple[Mutant, str | None, float]:
        start = time.monotonic()
        return (*_check_one(m, isolated), time.monotonic() - start)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(timed, m) for m in runnable]
        for future in as_completed(futures):
            mutant, problem, seconds = future.result()
            took = f" [{seconds:.0f} s, at {time.monotonic() - t0:.0f} s]"
            if problem is not None and problem.startswith(GPU_ONLY_PREFIX):
                race = "; only a real race shows it" if mutant.needs_real_race else ""
                print(f"      {mutant.lab}/{mutant.name}: needs a GPU ({problem[len(GPU_ONLY_PREFIX):]}"
                      f" is GPU-only under emulation{race})")
                continue
            status = "caught" if problem is None else f"PROBLEM: {problem}"
            print(f"      {mutant.lab}/{mutant.name}: {status}{took}", flush=True)
            if problem:
                problems.append(f"mutant {mutant.lab}/{mutant.name}: {problem}")
    for m in waiting:
        print(f"      {m.lab}/{m.name}: needs a GPU (not checked here)")
    return problems


def _signature(mutant: Mutant, isolated: bool = False) -> tuple[Mutant, list[str] | None, str | None]:
    """Returns (mutant, sorted names of the public tests it fails, problem or None).

    Failures caused by an earlier test's lost CUDA context (:mod:`reference.context_lost`: in
    one process, a faulting kernel fails every later test) are left out: they depend on the
    order the tests ran in, not on the mistake. Run isolated, there are none (the worker exits
    with its lost context) and every test shows what the mistake does to it.
    """
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        if isolated:
            os.chmod(tmp, 0o755)  # NOTE: the worker's user reads the mutant copy (no secret)
        try:
            folder = build_mutant(mutant, Path(tmp))
            run = run_lab_tests([mutant.lab], env={MUTANT_DIR_ENV: str(folder)},
                                include_hidden=False, timeout_s=1800, isolated=isolated)
        except (MutantSpecError, GradingRunError) as exc:
            return mutant, None, str(exc)
    failing = sorted({r.func_name for r in run.records if r.failed and is_own_failure(r.message)})
    # Only public tests ran: a caught_by test of the hidden set is checked by check (c) instead.
    ran = {r.func_name for r in run.records}
    escaped = [n for n in mutant.caught_by if n in ran and n not in failing]
    problem = f"passes its own caught_by tests {escaped}" if escaped else None
    return mutant, failing, problem


def compute_signatures(labs: list[str] | None, jobs: int, missing_only: bool = False,
                       only: list[str] | None = None, isolated: bool = False) -> list[str]:
    """Runs every runnable mutant against all its lab's public tests; writes signatures.json.

    Each lab's file is rewritten as every signature comes in, so a run cut short (a device time
    limit) keeps what it finished; ``missing_only`` then resumes with the rest. Entries of mutants
    this machine cannot run (GPU) are kept from the previous file; entries of mutants that no
    longer exist are dropped.

    Args:
        labs: lab folder names; None means every lab.
        jobs: mutants run at once.
        missing_only: only mutants without a stored signature.
        only: only these mutants (names); the others keep their stored signatures.
        isolated: run the mutant in the unprivileged worker, as grading does.

    Returns:
        Problems (a mutant that broke the run or passes the tests it claims to fail).
    """
    mutants = [m for lab in (labs or [None]) for m in load_mutants(lab)]
    have_gpu = gpu_available()
    # NOTE: a mutant no test can see on a real GPU (gpu_escape) would get an empty signature.
    runnable = [m for m in mutants if (have_gpu or not m.requires_gpu) and not m.gpu_escape]
    stored = {lab: _stored_signatures(lab) for lab in sorted({m.lab for m in mutants})}
    if missing_only:
        runnable = [m for m in runnable if m.name not in stored[m.lab]]
    if only:
        runnable = [m for m in runnable if m.name in set(only)]
    print(f"signatures: running all tests against {len(runnable)} mutants "
          f"({len(mutants) - len(runnable)} kept from the stored file)")
    problems = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for mutant, failing, problem in pool.map(lambda m: _signature(m, isolated), runnable):
            print(f"      {mutant.lab}/{mutant.name}: "
                  + (f"fails {len(failing)} tests" if failing is not None else "-")
                  + (f"  PROBLEM: {problem}" if problem else ""), flush=True)
            if problem:
                problems.append(f"mutant {mutant.lab}/{mutant.name}: {problem}")
            if failing is not None:
                stored[mutant.lab][mutant.name] = {"failing": failing}
                _write_signatures(mutant.lab, mutants, stored[mutant.lab])
    for lab in stored:
        n = _write_signatures(lab, mutants, stored[lab])
        print(f"      wrote {signatures_path(lab).relative_to(SOLUTIONS_DIR.parent)} ({n} mutants)")
    return problems


def _stored_signatures(lab: str) -> dict[str, dict]:
    path = signatures_path(lab)
    return json.loads(path.read_text()).get("mutants", {}) if path.is_file() else {}


def _write_signatures(lab: str, mutants: list[Mutant], found: dict[str, dict]) -> int:
    """Writes a lab's signatures.json from ``found`` (name -> entry with "failing"); returns the
    number of entries (current mutants only, their words and handout section refreshed)."""
    entries = {}
    for m in (m for m in mutants if m.lab == lab and m.name in found):
        entries[m.name] = {"mistake": m.mistake, "see": handout_section(lab, m.name),
                           "caught_by": m.caught_by, "failing": found[m.name]["failing"]}
    signatures_path(lab).write_text(json.dumps({"format": 1, "mutants": entries}, indent=1) + "\n")
    return len(entries)


def check_contracts(labs: list[str] | None) -> list[str]:
    """(d) Returns problems: test demands (match= words, attributes) no handout or docstring states."""
    from reference.paths import lab_names

    problems = []
    for lab in labs or lab_names():
        report = check_lab_contract(lab)
        found = report.problems()
        print(f"(d) contract {lab}: {report.num_patterns} match= patterns, "
              f"{report.num_attributes} attribute reads, {len(found)} unstated")
        problems += found
    return problems


def main(args: argparse.Namespace) -> int:
    from reference.paths import resolve_labs

    if not SOLUTIONS_DIR.is_dir():
        print("pagedlab check: needs solutions/ (not available in a student release)", file=sys.stderr)
        return 2
    labs = resolve_labs(args.labs) if args.labs else None
    problems: list[str] = []
    if args.signatures:
        problems = compute_signatures(labs, args.jobs, args.missing, args.only, args.isolated)
        for p in problems:
            print(f"  - {p}")
        return 1 if problems else 0
    if args.contracts:
        args.skip_solution = args.skip_starter = args.skip_mutants = True
    try:
        if not args.skip_contracts:
            problems += check_contracts(labs)
        if not args.skip_solution:
            problems += check_solution(labs, args.isolated, args.jobs)
        if not args.skip_starter:
            problems += check_starter(labs, args.isolated, args.jobs)
        if not args.skip_mutants:
            problems += check_mutants(labs, args.jobs, args.isolated, args.only)
    except GradingRunError as exc:
        problems.append(f"a test run broke: {exc}")
    if problems:
        print(f"\npagedlab check: {len(problems)} problem(s)")
        for p in problems:
            print(f"  - {p}")
        return 1
    if args.contracts:
        print("\npagedlab check: every contract the tests hold students to is stated")
        return 0
    print("\npagedlab check: the tests are strong (solutions pass, starters score 0, mutants caught)")
    return 0
