"""The ``pagedlab`` command line: status, doctor, grade, check, release and friends.

Subcommands are thin: each lives in its own module with ``add_arguments`` and ``main``.
Benchmarks are discovered from ``reference/tools/bench/<name>.py`` (each with ``main(argv)``), so a
lab adds a benchmark without touching this file.

Exit codes, for CI: 0 success; 1 the command ran and found a problem (a score below
``--fail-under``, a weak test, a release check that failed, a missing requirement); 2 it could
not do its job (bad arguments or ``LAB_IMPL``, nothing to grade); 3 (``grade`` only) graded,
but protected files changed or tests went missing, so the grade needs a look.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import os
import sys
from pathlib import Path

from reference.paths import UnknownLabError


# name -> (module, help)
COMMANDS = {
    "status": ("reference.tools.status", "my labs: points so far and the next TODO (honours LAB_IMPL)"),
    "hint": ("reference.tools.hint", "graded hints for a TODO: pagedlab hint lab3.2 --level 1|2|3"),
    "show": ("reference.tools.show", "draw your Lab 1 block manager / Lab 2 pool after each step of a scenario"),
    "doctor": ("reference.tools.doctor", "what this machine has (Python, torch, CuPy, GPU) and which labs run here"),
    "grade": ("reference.grader.grade", "run the lab tests and grade them (honours LAB_IMPL)"),
    "check": ("reference.grader.strength", "prove test strength: solutions pass, starters 0, mutants caught"),
    "mutate": ("reference.tools.mutate", "instructors: systematic mutation testing of a lab's solution (cosmic-ray)"),
    "compile": ("reference.tools.compile", "compile-check every .cu file for sm_80 and sm_90 (no GPU needed)"),
    "release": ("reference.grader.release", "instructors: write and verify the student repository"),
    "gradescope-bundle": ("reference.grader.gradescope", "instructors: build the Gradescope autograder zip"),
}


def _benchmarks() -> list[str]:
    bench_dir = Path(__file__).resolve().parent / "bench"
    return sorted(m.name for m in pkgutil.iter_modules([str(bench_dir)]) if not m.name.startswith("_"))


def _parser(command: str | None) -> argparse.ArgumentParser:
    """Builds the parser; only ``command``'s module is imported (to add its arguments).

    NOTE: subcommands are imported lazily, so ``pagedlab --help`` and ``pagedlab doctor`` work
    even where a heavy or version-specific dependency of another subcommand does not import.
    """
    parser = argparse.ArgumentParser(prog="pagedlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(cmd)
    bench = sub.add_parser("bench", help="run a benchmark: " + ", ".join(_benchmarks()))
    bench.add_argument("name", choices=_benchmarks())
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pagedlab``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = _parser(command).parse_args(argv)
    try:
        if args.command == "bench":
            return _bench(args.name, args.bench_args)
        return importlib.import_module(COMMANDS[args.command][0]).main(args) or 0
    except UnknownLabError as exc:
        print(f"pagedlab: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # NOTE: `pagedlab hint 1 | head` closes stdout early: not an error, and no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _bench(name: str, bench_args: list[str]) -> int:
    """Runs one benchmark; an unfinished lab stops it with one line naming the TODO it needs.

    Args:
        name: the benchmark, a module of ``reference/tools/bench/``.
        bench_args: its own command-line arguments.

    Returns:
        The benchmark's exit code; 1 when it reached a ``TODO`` of the implementation under test.
    """
    try:
        return importlib.import_module(f"reference.tools.bench.{name}").main(bench_args) or 0
    except NotImplementedError as exc:
        # NOTE: a benchmark runs the student's code (in a release, LAB_IMPL defaults to the
        # starter); a raw traceback would hide the one fact that matters: which task is missing.
        todo = str(exc).splitlines()[0] if str(exc).startswith("TODO(") else None
        if todo is None:
            raise
        from reference.loader import describe_impl

        print(f"pagedlab bench {name}: needs {todo} first (it runs {describe_impl()}); finish "
              "that task, then run it again.", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
